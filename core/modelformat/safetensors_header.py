"""Strict parser for the safetensors header, applied before any byte of a file is trusted.

Format (safetensors README, "Format"; huggingface/safetensors `safetensors/src/tensor.rs`): an 8-byte
little-endian u64 `N`, then `N` bytes of UTF-8 JSON (the header), then the data section. The header is a JSON
object mapping each tensor name to `{"dtype": str, "shape": [int, ...], "data_offsets": [begin, end]}`, where
the offsets are relative to the start of the data section (`8 + N`), plus an optional `"__metadata__"` object
of free-form string annotations.

This module implements DESIGN.md decision 6 ("strict parsing before trust"). The checks run in this order,
and each later step relies on the earlier ones (an invariant, not an implementation detail):

1. The file holds the 8-byte prefix; `2 <= N <= limits.max_safetensors_header_bytes` (default 16 MiB, at
   most safetensors' own MAX_HEADER_SIZE of 100,000,000 bytes; see `Limits`); `8 + N <= file_size`. All of
   this is decided from the prefix and the file size alone, *before* the header is read, so an
   attacker-declared length never drives an allocation.
2. The header is valid UTF-8, starts with `{`, and its bracket nesting is at most `_MAX_NESTING` levels
   (checked by a linear scan before decoding, so the JSON decoder never recurses deeply).
3. The header is strict JSON: no duplicate keys at any level, no `NaN`/`Infinity`, one top-level object,
   and nothing but spaces (0x20, the padding safetensors writes) after its closing brace.
4. At most `limits.max_tensors_per_file` tensors; `__metadata__`, if present, maps strings to strings and is
   never a tensor.
5. Each tensor entry has exactly the fields `dtype`, `shape` and `data_offsets`; the dtype is in the
   whitelist `DTYPE_BITS` (case-sensitive); the shape is a list of at most `_MAX_RANK` non-negative integers;
   the offsets are two integers with `0 <= begin <= end <= data section size`; and
   `(end - begin) * 8 == numel(shape) * bits(dtype)`, with sub-byte dtypes filling whole bytes. The element
   count is computed with an early exit, so a huge shape costs nothing.
6. The byte ranges, sorted by offset, do not overlap and cover the data section exactly: no gap and no
   trailing bytes (unindexed bytes would let one file be two formats at once, or smuggle a payload past
   per-tensor digests).

What this module does *not* do: it reads no tensor data (the hashing engine does, from the same stream),
interprets no `__metadata__` value (metadata never influences trust), and takes no policy decision. Every
refusal is a `MalformedArtifactError` whose message starts with the file's display name and names the
tensor or field at fault, in backquotes; attacker-chosen names are shown with control characters escaped
and long names truncated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import BinaryIO

from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits

__all__ = [
    "DTYPE_BITS",
    "SafetensorsHeader",
    "TensorInfo",
    "parse_header",
    "parse_header_length",
    "read_header",
]

#: Bits per element of every dtype safetensors defines, in the order of its `Dtype` enum (safetensors 0.8,
#: `safetensors/src/tensor.rs`, `Dtype::bitsize`; the FNUZ float8 variants are the ones the installed 0.8.0
#: release accepts). Sub-byte dtypes (F4, F6_*) are valid only when a tensor's total bit count is a
#: multiple of 8. Names are case-sensitive, as in safetensors: `f32` is not `F32`.
DTYPE_BITS: Mapping[str, int] = MappingProxyType(
    {
        "BOOL": 8,
        "F4": 4,
        "F6_E2M3": 6,
        "F6_E3M2": 6,
        "U8": 8,
        "I8": 8,
        "F8_E5M2": 8,
        "F8_E4M3": 8,
        "F8_E8M0": 8,
        "F8_E4M3FNUZ": 8,
        "F8_E5M2FNUZ": 8,
        "I16": 16,
        "U16": 16,
        "F16": 16,
        "BF16": 16,
        "I32": 32,
        "U32": 32,
        "F32": 32,
        "C64": 64,
        "F64": 64,
        "I64": 64,
        "U64": 64,
    }
)

_PREFIX_BYTES = 8  # The u64 little-endian header length.
_MIN_HEADER_BYTES = 2  # The smallest JSON object, `{}`.
_METADATA_KEY = "__metadata__"
_TENSOR_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
# A valid header nests three levels deep (object > tensor object > shape list). The pre-scan allows more,
# so that it only names nesting for clearly abusive input; the schema checks refuse the rest.
_MAX_NESTING = 8
_MAX_RANK = 64
# torch and numpy index shapes with int64, so a larger dimension cannot describe a loadable tensor.
_MAX_DIM = 2**63 - 1
_SHOW_CHARS = 80  # How much of an attacker-chosen string an error message repeats.

_ESCAPED_PAIR = re.compile(rb"\\.", re.DOTALL)
_SIMPLE_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor entry of a header that passed every check.

    Attributes:
        name: The tensor name (non-empty).
        dtype: A key of `DTYPE_BITS`.
        shape: Dimensions, each in [0, 2**63 - 1]; `()` for a scalar.
        begin: First byte of the tensor, relative to the start of the data section.
        end: One past its last byte; `end - begin` equals the shape's size in bytes.

    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor's byte range, `end - begin`."""
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A safetensors header that passed every check of decision 6 (see the module docstring).

    Guaranteed: the tensors' byte ranges tile `[data_start, file_size)` exactly, in the order of `tensors`.
    Not guaranteed: anything about the data bytes themselves (not read here) or about `metadata`, which is
    attacker-controlled free text and must never influence a trust decision.

    Attributes:
        path: Display name of the file, as used in error messages.
        header_length: `N`, the length of the JSON header in bytes (including its space padding).
        data_start: `8 + N`, the file offset of the data section.
        file_size: Size of the whole file in bytes.
        tensors: All tensors, sorted by `begin`, then `end`, then name.
        metadata: The `__metadata__` map (read-only), or None when the header has none.

    """

    path: str
    header_length: int
    data_start: int
    file_size: int
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, str] | None
    _by_name: Mapping[str, TensorInfo] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({t.name: t for t in self.tensors}))

    @property
    def data_size(self) -> int:
        """Size of the data section, `file_size - data_start`."""
        return self.file_size - self.data_start

    def tensor(self, name: str) -> TensorInfo:
        """Return the entry of the tensor called `name`.

        Args:
            name: A tensor name, exactly as in the header.

        Returns:
            Its `TensorInfo`.

        Raises:
            KeyError: The header declares no tensor of that name (a lookup miss, not a malformed file).

        """
        return self._by_name[name]


def parse_header_length(prefix: bytes, file_size: int, *, path: str, limits: Limits) -> int:
    """Decode and bound the 8-byte header length, before any header byte is read.

    Args:
        prefix: The first bytes of the file; only the first 8 are used (fewer when the file is shorter).
        file_size: Size of the whole file in bytes.
        path: Display name of the file for error messages.
        limits: `limits.max_safetensors_header_bytes` bounds the header (default 16 MiB; safetensors'
            MAX_HEADER_SIZE, 100,000,000, is the largest allowed override).

    Returns:
        `N`, the header length, with `2 <= N <= limit` and `8 + N <= file_size`; reading `N` more bytes is
        therefore safe.

    Raises:
        MalformedArtifactError: The file is shorter than 8 bytes ("header too small"), or `N` exceeds the
            limit, is below 2, or runs past the end of the file.

    """
    if len(prefix) < _PREFIX_BYTES or file_size < _PREFIX_BYTES:
        have = min(len(prefix), file_size)
        raise MalformedArtifactError(
            f"{path}: header too small: the file has {max(have, 0)} bytes, fewer than the 8-byte header "
            "length that starts every safetensors file"
        )
    n = int.from_bytes(prefix[:_PREFIX_BYTES], "little")
    _check_header_length(n, file_size, path=path, limits=limits)
    return n


def parse_header(header: bytes, file_size: int, *, path: str, limits: Limits) -> SafetensorsHeader:
    """Parse and validate a safetensors JSON header (all checks of DESIGN.md decision 6).

    Args:
        header: Exactly the `N` bytes that follow the 8-byte length prefix.
        file_size: Size of the whole file in bytes; the data section is `file_size - 8 - N` bytes.
        path: Display name of the file for error messages.
        limits: Bounds on the header size and the tensor count.

    Returns:
        The validated header. Its tensors cover the data section exactly; no data byte has been read.

    Raises:
        MalformedArtifactError: Any check fails: header size, UTF-8, JSON syntax or strictness (duplicate
            keys, `NaN`/`Infinity`, nesting, non-space padding), `__metadata__` type, tensor count, tensor
            fields, unknown dtype, shape, offsets, byte size, overlap, or bytes not covered by any tensor.
            The message names the file and the tensor or field at fault.

    """
    n = len(header)
    _check_header_length(n, file_size, path=path, limits=limits)
    data_start = _PREFIX_BYTES + n
    data_size = file_size - data_start

    top = _decode_json(header, path=path)
    tensor_count = len(top) - (_METADATA_KEY in top)
    if tensor_count > limits.max_tensors_per_file:
        raise MalformedArtifactError(
            f"{path}: header declares {tensor_count} tensors, more than the limit of "
            f"{limits.max_tensors_per_file}"
        )

    metadata = _check_metadata(top[_METADATA_KEY], path=path) if _METADATA_KEY in top else None
    tensors = [
        _check_tensor(name, value, data_size, path=path)
        for name, value in top.items()
        if name != _METADATA_KEY
    ]
    tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    _check_layout(tensors, data_size, path=path)
    return SafetensorsHeader(
        path=path,
        header_length=n,
        data_start=data_start,
        file_size=file_size,
        tensors=tuple(tensors),
        metadata=metadata,
    )


def read_header(
    fileobj: BinaryIO, file_size: int, *, path: str, limits: Limits
) -> tuple[SafetensorsHeader, bytes]:
    """Read and validate the prefix and header of a safetensors file.

    Reads from the current position of `fileobj`, which must be the start of the file, and leaves it at the
    start of the data section. The header length is checked against `file_size` and `limits` before the
    header is read, so at most `8 + min(N, file_size, limit)` bytes are ever allocated.

    Args:
        fileobj: A binary stream positioned at offset 0 (short reads are retried until EOF).
        file_size: Size of the whole file in bytes (e.g. from `os.fstat` on the same descriptor).
        path: Display name of the file for error messages.
        limits: Bounds on the header size and the tensor count.

    Returns:
        The validated header, and the raw `8 + N` bytes read (prefix then header), for the caller to feed to
        its hashers.

    Raises:
        MalformedArtifactError: As `parse_header_length` and `parse_header`, or the stream ends before the
            declared header does (the file is shorter than `file_size`).

    Example:
        >>> import os
        >>> with open("model.safetensors", "rb") as f:  # doctest: +SKIP
        ...     header, raw = read_header(f, os.fstat(f.fileno()).st_size, path="model.safetensors",
        ...                               limits=Limits())

    """
    prefix = _read_up_to(fileobj, _PREFIX_BYTES)
    n = parse_header_length(prefix, file_size, path=path, limits=limits)
    header = _read_up_to(fileobj, n)
    if len(header) != n:
        raise MalformedArtifactError(
            f"{path}: header truncated: read {len(header)} of the {n} declared header bytes "
            f"(the file is shorter than its stated size of {file_size} bytes)"
        )
    return parse_header(header, file_size, path=path, limits=limits), prefix + header


# --- helpers ------------------------------------------------------------------------------------------------


def _read_up_to(fileobj: BinaryIO, size: int) -> bytes:
    """Read `size` bytes, retrying short reads; fewer only at EOF."""
    first = fileobj.read(size)
    if len(first) == size or not first:
        return first
    chunks = [first]
    remaining = size - len(first)
    while remaining:
        chunk = fileobj.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _check_header_length(n: int, file_size: int, *, path: str, limits: Limits) -> None:
    limit = limits.max_safetensors_header_bytes
    if n > limit:
        raise MalformedArtifactError(
            f"{path}: header length {n} exceeds the limit of {limit} bytes (and the file has {file_size}); "
            "a policy may raise limits.maxSafetensorsHeaderBytes up to 100,000,000"
        )
    if n < _MIN_HEADER_BYTES:
        raise MalformedArtifactError(
            f"{path}: header length {n} is too small to hold a JSON header (at least 2 bytes, `{{}}`)"
        )
    if _PREFIX_BYTES + n > file_size:
        raise MalformedArtifactError(
            f"{path}: header length {n} runs past the end of the file ({file_size} bytes, so at most "
            f"{max(file_size - _PREFIX_BYTES, 0)} header bytes)"
        )


def _show(text: str) -> str:
    """Quote an attacker-chosen string for an error message: backquoted, escaped, truncated."""
    if len(text) <= _SHOW_CHARS and text.isprintable():
        return f"`{text}`"
    cut = len(text) > _SHOW_CHARS
    shown = "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text[:_SHOW_CHARS]
    )
    return f"`{shown}...`" if cut else f"`{shown}`"


def _show_int(value: int) -> str:
    """Render an attacker-chosen integer, abbreviating absurdly long ones (JSON allows 4300 digits)."""
    if abs(value) < 10**40:
        return str(value)
    return f"{'-' if value < 0 else ''}<an integer of {value.bit_length()} bits>"


def _json_type(value: object) -> str:
    """Name the JSON type of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _is_unicode_text(text: str) -> bool:
    """Whether `text` encodes to UTF-8 (JSON can escape lone surrogates, which do not encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_nesting(header: bytes, *, path: str) -> None:
    """Bound the bracket nesting of `header` before the recursive JSON decoder sees it.

    The scan is linear and exact for valid JSON: escaped pairs are dropped first (so every remaining quote
    delimits a string), strings next, then everything but brackets; innermost `[]`/`{}` pairs are then removed
    round by round. Each round removes at least one level, so `_MAX_NESTING` rounds accept every valid JSON
    text of that depth and nothing deeper than twice it.
    """
    brackets = _SIMPLE_STRING.sub(b"", _ESCAPED_PAIR.sub(b"", header)).translate(None, _NOT_BRACKETS)
    for _ in range(_MAX_NESTING):
        if not brackets:
            return
        reduced = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if reduced == brackets:
            raise MalformedArtifactError(f"{path}: header is not valid JSON (unbalanced brackets)")
        brackets = reduced
    if brackets:
        raise MalformedArtifactError(f"{path}: header JSON is nested more than {_MAX_NESTING} levels deep")


def _decode_json(header: bytes, *, path: str) -> dict[str, object]:
    """Decode the header as strict JSON with only trailing spaces after it; return the top-level object."""
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedArtifactError(f"{path}: header is not valid UTF-8 (at byte {e.start})") from e
    if not text.startswith("{"):
        raise MalformedArtifactError(f"{path}: header does not start with `{{` (not a JSON object)")
    _check_nesting(header, path=path)

    def reject_constant(name: str) -> object:
        raise MalformedArtifactError(f"{path}: header JSON contains `{name}`, which strict JSON forbids")

    decoder = json.JSONDecoder(
        object_pairs_hook=_unique_keys_hook(path),
        parse_constant=reject_constant,
        parse_int=_parse_int,
        strict=True,
    )
    try:
        top, end = decoder.raw_decode(text)
    except ValueError as e:
        # JSONDecodeError, and the integer-digits limit of int(); neither message repeats input text.
        raise MalformedArtifactError(f"{path}: header is not valid JSON: {e}") from e
    if text[end:].strip(" "):
        raise MalformedArtifactError(
            f"{path}: header has bytes other than spaces after its closing `}}` (at character {end}); "
            "only space (0x20) padding is allowed"
        )
    if not isinstance(top, dict):  # Unreachable after the `{` check; kept for the type checker.
        raise MalformedArtifactError(f"{path}: header is not a JSON object")
    return top


def _parse_int(literal: str) -> int | float:
    """Decode a JSON integer, keeping `-0` a float as serde_json (and so safetensors) does.

    `-0` is then refused by the integer checks like any other non-integer, with the tensor named, so that
    this parser never accepts a header that safetensors itself refuses.
    """
    return -0.0 if literal == "-0" else int(literal)


def _unique_keys_hook(path: str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result = dict(pairs)
        if len(result) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise MalformedArtifactError(f"{path}: header JSON has a duplicate key {_show(key)}")
                seen.add(key)
        return result

    return hook


def _check_metadata(value: object, *, path: str) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise MalformedArtifactError(
            f"{path}: `{_METADATA_KEY}` must map strings to strings, got a JSON {_json_type(value)}"
        )
    if _TENSOR_FIELDS <= value.keys():
        raise MalformedArtifactError(
            f"{path}: `{_METADATA_KEY}` must map strings to strings; it is reserved for annotations and is "
            "never a tensor, but holds a tensor entry"
        )
    for key, item in value.items():
        if not isinstance(item, str):
            raise MalformedArtifactError(
                f"{path}: `{_METADATA_KEY}` must map strings to strings; key {_show(key)} has a JSON "
                f"{_json_type(item)} value"
            )
        if not (_is_unicode_text(key) and _is_unicode_text(item)):
            raise MalformedArtifactError(
                f"{path}: `{_METADATA_KEY}` entry {_show(key)} is not valid Unicode (lone surrogate escape)"
            )
    # `value` is the decoder's fresh dict, referenced nowhere else: a read-only view of it, not a copy (a
    # header of tiny entries would otherwise pay for its largest object twice).
    return MappingProxyType(value)


def _int_pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, list) and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        return value[0], value[1]
    return None


def _tensor_error(path: str, name: str, problem: str) -> MalformedArtifactError:
    """Build the error for one tensor (only on failure: quoting names is not free)."""
    return MalformedArtifactError(f"{path}: tensor {_show(name)}: {problem}")


def _check_tensor(name: str, value: object, data_size: int, *, path: str) -> TensorInfo:
    """Validate one tensor entry against the schema and the data section size."""
    if not name:
        raise MalformedArtifactError(f"{path}: header declares a tensor with an empty name ``")
    if not _is_unicode_text(name):
        raise _tensor_error(path, name, "name is not valid Unicode (lone surrogate escape)")
    if not isinstance(value, dict):
        raise _tensor_error(
            path,
            name,
            f"entry must be an object with dtype, shape and data_offsets, got a JSON {_json_type(value)}",
        )
    if value.keys() != _TENSOR_FIELDS:
        unknown = sorted(k for k in value if k not in _TENSOR_FIELDS)
        if unknown:
            listed = ", ".join(_show(k) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise _tensor_error(
                path, name, f"unknown field(s) {listed} (only dtype, shape and data_offsets are allowed)"
            )
        missing = ", ".join(f"`{k}`" for k in sorted(_TENSOR_FIELDS - value.keys()))
        raise _tensor_error(path, name, f"missing field(s) {missing}")

    dtype = value["dtype"]
    if not isinstance(dtype, str):
        raise _tensor_error(path, name, f"dtype must be a string, got a JSON {_json_type(dtype)}")
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise _tensor_error(
            path,
            name,
            f"unknown dtype {_show(dtype)} (names are case-sensitive; known: {', '.join(DTYPE_BITS)})",
        )

    shape = _check_shape(value["shape"], path=path, name=name)

    offsets = _int_pair(value["data_offsets"])
    if offsets is None:
        raise _tensor_error(path, name, "data_offsets must be an array of two integers [begin, end]")
    begin, end = offsets
    if begin < 0 or end < 0 or begin > end or end > data_size:
        shown = f"[{_show_int(begin)}, {_show_int(end)}]"
        if begin < 0 or end < 0:
            raise _tensor_error(path, name, f"data_offsets {shown} are negative")
        if begin > end:
            raise _tensor_error(path, name, f"data_offsets {shown} are reversed (begin > end)")
        raise _tensor_error(
            path,
            name,
            f"data_offsets {shown} end past the data section, which holds {data_size} bytes (out of bounds)",
        )

    span_bits = (end - begin) * 8
    total_bits = _bits_up_to(shape, bits, span_bits)
    if total_bits != span_bits:
        described = f"shape {list(shape)} of {dtype}"
        if total_bits is None:
            raise _tensor_error(
                path,
                name,
                f"{described} needs more than the {end - begin} bytes of data_offsets [{begin}, {end}]",
            )
        if total_bits % 8:
            raise _tensor_error(path, name, f"{described} is {total_bits} bits, not a whole number of bytes")
        raise _tensor_error(
            path,
            name,
            f"{described} needs {total_bits // 8} bytes, "
            f"but data_offsets [{begin}, {end}] span {end - begin}",
        )
    return TensorInfo(name=name, dtype=dtype, shape=shape, begin=begin, end=end)


def _check_shape(value: object, *, path: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _tensor_error(path, name, f"shape must be an array of integers, got a JSON {_json_type(value)}")
    if len(value) > _MAX_RANK:
        raise _tensor_error(path, name, f"shape has {len(value)} dimensions, more than {_MAX_RANK}")
    for i, dim in enumerate(value):
        # `type(...) is int` refuses booleans, which `isinstance(..., int)` would accept.
        if type(dim) is not int:
            raise _tensor_error(
                path, name, f"shape[{i}] must be a non-negative integer, got a JSON {_json_type(dim)}"
            )
        if not 0 <= dim <= _MAX_DIM:
            problem = "is negative" if dim < 0 else "exceeds 2**63 - 1"
            raise _tensor_error(path, name, f"shape[{i}] {problem} ({_show_int(dim)})")
    return tuple(value)


def _bits_up_to(shape: tuple[int, ...], bits: int, cap: int) -> int | None:
    """Return `numel(shape) * bits`, or None as soon as the running product exceeds `cap`."""
    if 0 in shape:
        return 0
    total = bits
    for dim in shape:
        total *= dim
        # Every dimension is >= 1 here, so the product only grows: stopping early is exact.
        if total > cap:
            return None
    return total if total <= cap else None


def _check_layout(tensors: list[TensorInfo], data_size: int, *, path: str) -> None:
    """Check that the sorted byte ranges neither overlap nor leave a byte of the data section unindexed."""
    cursor = 0
    previous: TensorInfo | None = None
    for t in tensors:
        if previous is not None and t.begin < cursor:
            raise MalformedArtifactError(
                f"{path}: tensors {_show(previous.name)} [{previous.begin}, {previous.end}) and "
                f"{_show(t.name)} [{t.begin}, {t.end}) overlap in the data section"
            )
        if t.begin > cursor:
            raise MalformedArtifactError(
                f"{path}: bytes [{cursor}, {t.begin}) of the data section, before tensor {_show(t.name)}, "
                "are not covered by any tensor (unindexed bytes)"
            )
        cursor = t.end
        previous = t
    if cursor != data_size:
        raise MalformedArtifactError(
            f"{path}: bytes [{cursor}, {data_size}) at the end of the data section are not covered by any "
            "tensor (unindexed bytes)"
        )
