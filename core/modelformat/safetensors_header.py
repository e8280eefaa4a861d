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
2. The header is valid UTF-8, starts with `{`, and its bracket nesting is at most 8 levels
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

from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import BinaryIO

from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat._header_json import (
    LongInteger,
    decode_header_json,
    is_unicode_text,
    json_type,
    show,
    show_int,
)

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
_MAX_RANK = 64
# torch and numpy index shapes with int64, so a larger dimension cannot describe a loadable tensor.
_MAX_DIM = 2**63 - 1
# The order of `SafetensorsHeader.tensors`: by offset, then end, then name.
_LAYOUT_ORDER = attrgetter("begin", "end", "name")


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
    # Built by the first `tensor()` call: a whole-shard load never looks a tensor up by name, and a load of
    # thousands of shards would otherwise keep two more objects per shard for the garbage collector to count.
    _by_name: dict[str, TensorInfo] | None = field(default=None, init=False, repr=False, compare=False)

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
        by_name = self._by_name
        if by_name is None:
            by_name = {t.name: t for t in self.tensors}
            object.__setattr__(self, "_by_name", by_name)  # idempotent: a racing thread builds the same
        return by_name[name]


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

    top = decode_header_json(header, path=path)
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
    tensors.sort(key=_LAYOUT_ORDER)
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


def _check_metadata(value: object, *, path: str) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise MalformedArtifactError(
            f"{path}: `{_METADATA_KEY}` must map strings to strings, got a JSON {json_type(value)}"
        )
    if _TENSOR_FIELDS <= value.keys():
        raise MalformedArtifactError(
            f"{path}: `{_METADATA_KEY}` must map strings to strings; it is reserved for annotations and is "
            "never a tensor, but holds a tensor entry"
        )
    for key, item in value.items():
        if not isinstance(item, str):
            raise MalformedArtifactError(
                f"{path}: `{_METADATA_KEY}` must map strings to strings; key {show(key)} has a JSON "
                f"{json_type(item)} value"
            )
        if not (is_unicode_text(key) and is_unicode_text(item)):
            raise MalformedArtifactError(
                f"{path}: `{_METADATA_KEY}` entry {show(key)} is not valid Unicode (lone surrogate escape)"
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
    return MalformedArtifactError(f"{path}: tensor {show(name)}: {problem}")


def _check_tensor(name: str, value: object, data_size: int, *, path: str) -> TensorInfo:
    """Validate one tensor entry against the schema and the data section size."""
    if not name:
        raise MalformedArtifactError(f"{path}: header declares a tensor with an empty name ``")
    if not is_unicode_text(name):
        raise _tensor_error(path, name, "name is not valid Unicode (lone surrogate escape)")
    if not isinstance(value, dict):
        raise _tensor_error(
            path,
            name,
            f"entry must be an object with dtype, shape and data_offsets, got a JSON {json_type(value)}",
        )
    if value.keys() != _TENSOR_FIELDS:
        unknown = sorted(k for k in value if k not in _TENSOR_FIELDS)
        if unknown:
            listed = ", ".join(show(k) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise _tensor_error(
                path, name, f"unknown field(s) {listed} (only dtype, shape and data_offsets are allowed)"
            )
        missing = ", ".join(f"`{k}`" for k in sorted(_TENSOR_FIELDS - value.keys()))
        raise _tensor_error(path, name, f"missing field(s) {missing}")

    dtype = value["dtype"]
    if not isinstance(dtype, str):
        raise _tensor_error(path, name, f"dtype must be a string, got a JSON {json_type(dtype)}")
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise _tensor_error(
            path,
            name,
            f"unknown dtype {show(dtype)} (names are case-sensitive; known: {', '.join(DTYPE_BITS)})",
        )

    shape = _check_shape(value["shape"], path=path, name=name)

    offsets = _int_pair(value["data_offsets"])
    if offsets is None:
        _refuse_long_integers(value["data_offsets"], "data_offsets", path=path, name=name)
        raise _tensor_error(path, name, "data_offsets must be an array of two integers [begin, end]")
    begin, end = offsets
    if begin < 0 or end < 0 or begin > end or end > data_size:
        shown = f"[{show_int(begin)}, {show_int(end)}]"
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
    return TensorInfo(name, dtype, shape, begin, end)


def _check_shape(value: object, *, path: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _tensor_error(path, name, f"shape must be an array of integers, got a JSON {json_type(value)}")
    if len(value) > _MAX_RANK:
        raise _tensor_error(path, name, f"shape has {len(value)} dimensions, more than {_MAX_RANK}")
    # Every dimension valid (the common case): nothing to name. Otherwise the checks below find the first
    # fault in their order.
    if all(type(dim) is int and 0 <= dim <= _MAX_DIM for dim in value):
        return tuple(value)
    _refuse_long_integers(value, "shape", path=path, name=name)
    for i, dim in enumerate(value):
        # `type(...) is int` refuses booleans, which `isinstance(..., int)` would accept.
        if type(dim) is not int:
            raise _tensor_error(
                path, name, f"shape[{i}] must be a non-negative integer, got a JSON {json_type(dim)}"
            )
        if not 0 <= dim <= _MAX_DIM:
            problem = "is negative" if dim < 0 else "exceeds 2**63 - 1"
            raise _tensor_error(path, name, f"shape[{i}] {problem} ({show_int(dim)})")
    return tuple(value)


def _refuse_long_integers(value: object, field: str, *, path: str, name: str) -> None:
    """Refuse a `LongInteger` in the array `value` (the tensor's `field`), naming the entry."""
    for i, item in enumerate(value if isinstance(value, list) else ()):
        if isinstance(item, LongInteger):
            raise _tensor_error(path, name, f"{field}[{i}] is {item.describe()}")


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
                f"{path}: tensors {show(previous.name)} [{previous.begin}, {previous.end}) and "
                f"{show(t.name)} [{t.begin}, {t.end}) overlap in the data section"
            )
        if t.begin > cursor:
            raise MalformedArtifactError(
                f"{path}: bytes [{cursor}, {t.begin}) of the data section, before tensor {show(t.name)}, "
                "are not covered by any tensor (unindexed bytes)"
            )
        cursor = t.end
        previous = t
    if cursor != data_size:
        raise MalformedArtifactError(
            f"{path}: bytes [{cursor}, {data_size}) at the end of the data section are not covered by any "
            "tensor (unindexed bytes)"
        )
