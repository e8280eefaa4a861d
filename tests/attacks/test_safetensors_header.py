"""Malformed safetensors headers: one test per kind, each asserting MalformedArtifactError and its message.

Two sources: the shared attack corpus (cases ST01-ST11, PKL03; each case's `expected.json` lists regexes
that must all match the error), and crafted inputs for every check of DESIGN.md decision 6.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from modelsec.errors import MalformedArtifactError, VerificationError
from modelsec.limits import Limits
from modelsec.modelformat.safetensors_header import (
    SafetensorsHeader,
    parse_header,
    parse_header_length,
    read_header,
)
from tests.conftest import CORPUS

LIMITS = Limits()
NAME = "model.safetensors"


# --- helpers ------------------------------------------------------------------------------------------------


def build(header: bytes | str | Mapping[str, object], data: bytes = b"", *, pad: bool = True) -> bytes:
    """A safetensors file from a header (dict -> compact JSON; str/bytes taken verbatim)."""
    if isinstance(header, Mapping):
        header = json.dumps(header, separators=(",", ":"))
    raw = header.encode() if isinstance(header, str) else header
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def entry(dtype: object, shape: Sequence[object], begin: object, end: object) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def parse(blob: bytes, *, limits: Limits = LIMITS, file_size: int | None = None) -> SafetensorsHeader:
    size = len(blob) if file_size is None else file_size
    header, _ = read_header(io.BytesIO(blob), size, path=NAME, limits=limits)
    return header


def refused(blob: bytes, *patterns: str, limits: Limits = LIMITS, file_size: int | None = None) -> str:
    """Assert `blob` is refused with a message naming the file and matching every regex; return it."""
    with pytest.raises(MalformedArtifactError) as info:
        parse(blob, limits=limits, file_size=file_size)
    message = str(info.value)
    assert message.startswith(f"{NAME}: "), message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return message


U8_4 = {"w": entry("U8", [4], 0, 4)}
DATA4 = b"abcd"


# --- the shared corpus --------------------------------------------------------------------------------------


CASES = ["ST01", "ST02", "ST03", "ST04", "ST06", "ST08", "ST09", "ST11", "PKL03"]


def _corpus_files() -> list[tuple[str, Path, list[str]]]:
    if not CORPUS.is_dir():
        return []
    found = []
    for prefix in CASES:
        for case in sorted(CORPUS.glob(f"{prefix}-*")):
            expected = json.loads((case / "expected.json").read_text())
            # PKL03 has no regexes: its README expects a header-length refusal.
            mentions = expected.get("error_mentions", ["header"])
            applies = expected.get("applies_to") or [p.name for p in case.glob("*.safetensors")]
            for item in applies:
                paths = sorted((case / item).glob("*.safetensors")) if item.endswith("/") else [case / item]
                found += [(f"{case.name}/{p.relative_to(case)}", p, mentions) for p in paths]
    return found


CORPUS_FILES = _corpus_files()
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"attack corpus not found at {CORPUS}")


@needs_corpus
def test_corpus_is_complete() -> None:
    cases = {label.split("/")[0][:5].rstrip("-") for label, _, _ in CORPUS_FILES}
    assert cases == set(CASES)
    assert len(CORPUS_FILES) >= 20


@needs_corpus
@pytest.mark.parametrize(
    ("path", "mentions"), [(p, m) for _, p, m in CORPUS_FILES], ids=[label for label, _, _ in CORPUS_FILES]
)
def test_corpus_file_is_refused(path: Path, mentions: list[str]) -> None:
    blob = path.read_bytes()
    with pytest.raises(MalformedArtifactError) as info:
        with path.open("rb") as f:
            read_header(f, os.fstat(f.fileno()).st_size, path=path.name, limits=LIMITS)
    message = str(info.value)
    assert isinstance(info.value, VerificationError)
    assert message.startswith(f"{path.name}: ")
    for pattern in mentions:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    # The verdict depends on the bytes only, not on how they are fed in.
    with pytest.raises(MalformedArtifactError, match=re.escape(message)):
        parse_header_length(blob[:8], len(blob), path=path.name, limits=LIMITS)
        parse_header(
            blob[8 : 8 + int.from_bytes(blob[:8], "little")], len(blob), path=path.name, limits=LIMITS
        )


@needs_corpus
def test_corpus_metadata_with_fake_trust_flags_parses_as_plain_data() -> None:
    path = CORPUS / "ST09-metadata-abuse" / "meta_fake_trust.safetensors"
    blob = path.read_bytes()
    header, raw = read_header(io.BytesIO(blob), len(blob), path=path.name, limits=LIMITS)
    assert [t.name for t in header.tensors] == ["w"]
    assert header.metadata is not None
    assert header.metadata["modelsec.verified"] == "true"
    assert header.metadata["trust_remote_code"] == "true"
    with pytest.raises(TypeError):
        header.metadata["modelsec.verified"] = "false"  # type: ignore[index]
    assert raw == blob[: header.data_start]


@needs_corpus
@pytest.mark.parametrize(
    ("case", "file", "pattern"),
    [
        ("ST01-header-len-huge", "header_len_2p63.safetensors", r"header length \d+ exceeds the limit"),
        ("ST01-header-len-huge", "header_len_u64max.safetensors", r"header length \d+ exceeds the limit"),
        ("ST02-header-len-past-eof", "header_len_4096_file_small.safetensors", r"header .*past the end"),
        ("ST02-header-len-past-eof", "header_len_zero.safetensors", r"header length 0 is too small"),
        ("ST02-header-len-past-eof", "truncated_prefix.safetensors", r"header too small"),
        ("ST03-offsets-out-of-bounds", "oob.safetensors", r"`w`.*out of bounds"),
        ("ST04-offsets-reversed-or-negative", "reversed.safetensors", r"`w`.*reversed"),
        ("ST04-offsets-reversed-or-negative", "negative.safetensors", r"`w`.*negative"),
        ("ST06-shape-dtype-size-mismatch", "mismatch.safetensors", r"`t`: shape \[1000, 1000\] of F32"),
        ("ST08-unindexed-bytes-polyglot", "gap.safetensors", r"bytes \[4, 8\).*before tensor `b`"),
        ("ST08-unindexed-bytes-polyglot", "trailer_zip_polyglot.safetensors", r"at the end of the data"),
        ("ST09-metadata-abuse", "meta_as_tensor.safetensors", r"`__metadata__`.*never a tensor"),
        ("ST09-metadata-abuse", "meta_nonstring.safetensors", r"`__metadata__` must map strings"),
        ("ST11-unknown-dtype", "unknown_dtype.safetensors", r"unknown dtype `Q4_EVIL`"),
        ("ST11-unknown-dtype", "lowercase_dtype.safetensors", r"unknown dtype `f32`"),
        ("PKL03-pickle-named-safetensors", "model.safetensors", r"header length \d+ exceeds the limit"),
        ("PKL03-pickle-named-safetensors", "raw_pickle.safetensors", r"header length \d+ exceeds the limit"),
    ],
)
def test_corpus_reason(case: str, file: str, pattern: str) -> None:
    blob = (CORPUS / case / file).read_bytes()
    refused(blob, pattern)


# --- header length (decided from the prefix and the file size alone) ---------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3, 7])
def test_file_shorter_than_prefix(size: int) -> None:
    refused(b"\x10" * size, r"header too small", rf"has {size} bytes")


@pytest.mark.parametrize("n", [2**64 - 1, 2**63, 100_000_001, 2**32, 16 * 2**20 + 1])
def test_header_length_over_limit(n: int) -> None:
    refused(struct.pack("<Q", n) + b"{}" + b" " * 6, rf"header length {n} exceeds the limit of {16 * 2**20}")


def test_header_length_over_custom_limit() -> None:
    blob = build(U8_4, DATA4)
    refused(
        blob,
        r"header length \d+ exceeds the limit of 16 bytes",
        limits=Limits(max_safetensors_header_bytes=16),
    )


@pytest.mark.parametrize("n", [0, 1])
def test_header_length_too_small(n: int) -> None:
    refused(struct.pack("<Q", n) + b"{}" + b" " * 14, rf"header length {n} is too small")


def test_header_length_past_eof() -> None:
    refused(struct.pack("<Q", 4096) + b"{}", r"header length 4096 runs past the end of the file \(10 bytes")


def test_header_length_exactly_to_eof_is_fine() -> None:
    blob = struct.pack("<Q", 2) + b"{}"
    assert parse(blob).tensors == ()


class SpyReader(io.BytesIO):
    """Records the size of every read, to prove no read is sized by an attacker-declared length."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.requests: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        self.requests.append(-1 if size is None else size)
        return super().read(size)


@pytest.mark.parametrize("n", [2**64 - 1, 99_999_999, 4096])
def test_no_read_proportional_to_declared_length(n: int) -> None:
    blob = struct.pack("<Q", n) + b"{}" + b" " * 6
    spy = SpyReader(blob)
    with pytest.raises(MalformedArtifactError, match="header"):
        read_header(spy, len(blob), path=NAME, limits=LIMITS)
    assert spy.requests == [8]


def test_stream_shorter_than_stated_size() -> None:
    blob = build(U8_4, DATA4)
    # The caller believed the file was larger (it shrank between stat and read).
    spy = SpyReader(blob[:20])
    with pytest.raises(MalformedArtifactError, match=r"header truncated: read 12 of the \d+ declared header"):
        read_header(spy, len(blob), path=NAME, limits=LIMITS)


def test_parse_header_rechecks_the_length() -> None:
    with pytest.raises(MalformedArtifactError, match="header length 8 runs past the end"):
        parse_header(b"{}      ", 12, path=NAME, limits=LIMITS)
    with pytest.raises(MalformedArtifactError, match="header length 1 is too small"):
        parse_header(b"{", 100, path=NAME, limits=LIMITS)
    with pytest.raises(MalformedArtifactError, match="header length 8 exceeds the limit of 4"):
        parse_header(b"{}      ", 100, path=NAME, limits=Limits(max_safetensors_header_bytes=4))


# --- encoding, framing and strict JSON ----------------------------------------------------------------------


def test_header_not_utf8() -> None:
    refused(build(b'{"w\xff":{}}', DATA4), r"header is not valid UTF-8 \(at byte 3\)")


def test_overlong_utf8_refused() -> None:
    refused(build(b'{"\xc0\xafw":{}}'), r"header is not valid UTF-8")


def test_encoded_surrogate_refused() -> None:
    refused(build(b'{"\xed\xa0\x80":{}}'), r"header is not valid UTF-8")


@pytest.mark.parametrize("header", [b' {"w":1}', b"\xef\xbb\xbf{}", b"[]", b'"{}"', b"\n{}", b"  "])
def test_header_must_start_with_brace(header: bytes) -> None:
    refused(build(header), r"header does not start with `\{`")


@pytest.mark.parametrize("trailer", [b"\x00", b"\t", b"\n", b"x", b"   \x00", b" {}", b"\r\n"])
def test_padding_other_than_spaces(trailer: bytes) -> None:
    refused(build(json.dumps(U8_4).encode() + trailer, DATA4, pad=False), r"bytes other than spaces after")


def test_space_padding_and_inner_whitespace_accepted() -> None:
    text = '{ "w" :\n {"dtype": "U8",\t"shape": [4], "data_offsets": [0, 4]} }'
    header = parse(build(text + " " * 40, DATA4, pad=False))
    assert [t.name for t in header.tensors] == ["w"]


@pytest.mark.parametrize(
    "text",
    [
        '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},}',
        '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}',
        "{'w':1}",
        '{"w":{"dtype":"U8","shape":[04],"data_offsets":[0,4]}}',
        '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}}',
        '{"w"\x00:1}',
        '{"w\n":1}',
    ],
)
def test_invalid_json(text: str) -> None:
    refused(build(text, DATA4), r"header (is not valid JSON|has bytes other than spaces)")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            "w",
        ),
        ('{"w":{"dtype":"U8","dtype":"F32","shape":[4],"data_offsets":[0,4]}}', "dtype"),
        ('{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"data_offsets":[0,4]}}', "data_offsets"),
        ('{"__metadata__":{"a":"1","a":"2"},"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', "a"),
        (
            '{"__metadata__":{},"__metadata__":{},"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            "__metadata__",
        ),
    ],
    ids=["tensor", "dtype", "offsets", "metadata-key", "metadata"],
)
def test_duplicate_keys_at_every_level(text: str, key: str) -> None:
    # safetensors itself keeps the last duplicate tensor: two parsers would see different tensors.
    refused(build(text, DATA4), rf"duplicate key `{re.escape(key)}`")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity(constant: str) -> None:
    text = '{"w":{"dtype":"U8","shape":[SHAPE],"data_offsets":[0,4]}}'.replace("SHAPE", constant)
    refused(build(text, DATA4), rf"header JSON contains `{re.escape(constant)}`")


def test_huge_integer_literal() -> None:
    text = '{"w":{"dtype":"U8","shape":[SHAPE],"data_offsets":[0,4]}}'.replace("SHAPE", "9" * 5000)
    refused(build(text, DATA4), r"`w`: shape\[0\] is an integer of 5000 digits \(too long\)$")


@pytest.mark.parametrize("depth", [9, 100, 100_000])
def test_deep_nesting_refused_before_decoding(depth: int) -> None:
    text = '{"w":{"dtype":"U8","shape":' + "[" * depth + "]" * depth + ',"data_offsets":[0,4]}}'
    started = time.perf_counter()
    refused(build(text, DATA4), r"header JSON is nested more than 8 levels deep")
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize("opening", ["[" * 200_000, "{" * 200_000, '{"a":' * 100_000])
def test_unbalanced_deep_nesting(opening: str) -> None:
    refused(build("{" + opening, DATA4), r"header (is not valid JSON|JSON is nested)")


def test_nesting_within_the_bound_reaches_the_schema() -> None:
    text = '{"w":{"dtype":"U8","shape":[[[[[1]]]]],"data_offsets":[0,4]}}'
    refused(build(text, DATA4), r"`w`: shape\[0\] must be a non-negative integer, got a JSON array")


def test_brackets_and_escapes_inside_strings_do_not_count_as_nesting() -> None:
    names = ['[[[[[[[[[[{{{{{{{{{{"[[', "\\", '\\"[[[[[[[[[[', '\\\\"{{{{{{{{{{{{', '"]]]]]]]]]]]]]]]]]}}}}}']
    header = {n: entry("U8", [1], i, i + 1) for i, n in enumerate(names)}
    header["__metadata__"] = {"[[[[[[[[[[[[": "\\" * 9 + "]]]]]]]]]]]]]]]]]]"}
    parsed = parse(build(header, b"abcde"))
    assert sorted(t.name for t in parsed.tensors) == sorted(names)


# --- top level and __metadata__ -----------------------------------------------------------------------------


def test_too_many_tensors() -> None:
    header = {f"t{i}": entry("U8", [1], i, i + 1) for i in range(3)}
    refused(
        build(header, b"abc"),
        r"declares 3 tensors, more than the limit of 2",
        limits=Limits(max_tensors_per_file=2),
    )


def test_metadata_does_not_count_as_a_tensor() -> None:
    header = {"__metadata__": {"a": "b"}, **{f"t{i}": entry("U8", [1], i, i + 1) for i in range(2)}}
    assert len(parse(build(header, b"ab"), limits=Limits(max_tensors_per_file=2)).tensors) == 2


@pytest.mark.parametrize(
    ("metadata", "pattern"),
    [
        (None, r"got a JSON null"),
        ([], r"got a JSON array"),
        ("format=pt", r"got a JSON string"),
        (1, r"got a JSON integer"),
        ({"format": "pt", "n": {"nested": "x"}}, r"key `n` has a JSON object value"),
        ({"n": 1}, r"key `n` has a JSON integer value"),
        ({"n": True}, r"key `n` has a JSON boolean value"),
        ({"n": None}, r"key `n` has a JSON null value"),
        ({"n": ["a"]}, r"key `n` has a JSON array value"),
        ({"n": 1.5}, r"key `n` has a JSON number value"),
        (entry("U8", [4], 0, 4), r"never a tensor"),
    ],
)
def test_metadata_must_map_strings_to_strings(metadata: object, pattern: str) -> None:
    refused(
        build({"__metadata__": metadata, **U8_4}, DATA4),
        r"`__metadata__` must map strings to strings",
        pattern,
    )


def test_metadata_lone_surrogate() -> None:
    text = '{"__metadata__":{"k":"\\ud800"},"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    refused(build(text, DATA4), r"`__metadata__` entry `k` is not valid Unicode")


# --- tensor entries -----------------------------------------------------------------------------------------


def test_empty_tensor_name() -> None:
    refused(build({"": entry("U8", [4], 0, 4)}, DATA4), r"tensor with an empty name")


def test_tensor_name_lone_surrogate() -> None:
    text = '{"w\\udc00":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    refused(build(text, DATA4), r"name is not valid Unicode")


@pytest.mark.parametrize(("value", "kind"), [([], "array"), ("U8", "string"), (None, "null"), (4, "integer")])
def test_tensor_entry_not_an_object(value: object, kind: str) -> None:
    refused(build({"w": value}, DATA4), rf"tensor `w`: entry must be an object .* got a JSON {kind}")


def test_unknown_tensor_field() -> None:
    value = {**entry("U8", [4], 0, 4), "pickle": "cos\nsystem"}
    refused(build({"w": value}, DATA4), r"tensor `w`: unknown field\(s\) `pickle`")


def test_many_unknown_fields_are_listed_briefly() -> None:
    value = {**entry("U8", [4], 0, 4), **{f"x{i}": 1 for i in range(50)}}
    message = refused(build({"w": value}, DATA4), r"unknown field\(s\) `x0`, `x1`, .*, \.\.\.")
    assert "x49" not in message


@pytest.mark.parametrize("missing", ["dtype", "shape", "data_offsets"])
def test_missing_tensor_field(missing: str) -> None:
    value = entry("U8", [4], 0, 4)
    del value[missing]
    refused(build({"w": value}, DATA4), rf"tensor `w`: missing field\(s\) `{missing}`")


@pytest.mark.parametrize(
    "dtype", ["f32", "bf16", "Q4_EVIL", "F8_E4M3FN", "FP4", "", "U8 ", "PackedI4", "float32"]
)
def test_unknown_dtype(dtype: str) -> None:
    refused(build({"w": entry(dtype, [4], 0, 4)}, DATA4), r"tensor `w`: unknown dtype", r"case-sensitive")


@pytest.mark.parametrize(
    ("dtype", "kind"), [(8, "integer"), (None, "null"), (["U8"], "array"), ({}, "object")]
)
def test_dtype_not_a_string(dtype: object, kind: str) -> None:
    refused(
        build({"w": entry(dtype, [4], 0, 4)}, DATA4),
        rf"tensor `w`: dtype must be a string, got a JSON {kind}",
    )


@pytest.mark.parametrize(
    ("shape", "kind"), [(4, "integer"), ("4", "string"), (None, "null"), ({"0": 4}, "object")]
)
def test_shape_not_a_list(shape: object, kind: str) -> None:
    refused(
        build({"w": {"dtype": "U8", "shape": shape, "data_offsets": [0, 4]}}, DATA4),
        rf"`w`: shape must be an array of integers, got a JSON {kind}",
    )


@pytest.mark.parametrize(
    ("shape", "kind"),
    [
        ([True, 4], "boolean"),
        ([False], "boolean"),
        ([4.0], "number"),
        (["4"], "string"),
        ([None], "null"),
        ([[4]], "array"),
    ],
)
def test_shape_element_not_an_integer(shape: list[object], kind: str) -> None:
    refused(
        build({"w": entry("U8", shape, 0, 4)}, DATA4),
        rf"`w`: shape\[0\] must be a non-negative integer, got a JSON {kind}",
    )


def test_shape_negative_zero_is_not_an_integer() -> None:
    # serde_json (and so safetensors) reads `-0` as a float; accepting it would make us laxer than the loader.
    text = '{"w":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'
    refused(build(text), r"`w`: shape\[0\] must be a non-negative integer, got a JSON number")


def test_shape_negative_dimension() -> None:
    refused(build({"w": entry("U8", [-2, -2], 0, 4)}, DATA4), r"`w`: shape\[0\] is negative \(-2\)")


def test_shape_dimension_too_large() -> None:
    refused(build({"w": entry("U8", [0, 2**63], 0, 0)}), r"`w`: shape\[1\] exceeds 2\*\*63 - 1")
    refused(build({"w": entry("U8", [0, 10**200], 0, 0)}), r"shape\[1\] exceeds .*<an integer of \d+ bits>")


@pytest.mark.parametrize(("field", "digits"), [("data_offsets", 5000), ("shape", 641)])
def test_an_integer_too_long_for_python_is_named_not_python_advice(field: str, digits: int) -> None:
    """User trial finding 8 (bad/bigint): the message leaked `use sys.set_int_max_str_digits()`."""
    value = {"shape": b"[16]", "data_offsets": b"[0, 64]"}
    value[field] = b"[" + b"9" * digits + b"]" if field == "shape" else b"[0, " + b"9" * digits + b"]"
    header = b'{"a": {"dtype": "F32", "shape": ' + value["shape"] + b', "data_offsets": '
    message = refused(build(header + value["data_offsets"] + b"}}", bytes(64)))
    index = 0 if field == "shape" else 1
    assert message.endswith(f": tensor `a`: {field}[{index}] is an integer of {digits} digits (too long)")
    assert "set_int_max_str_digits" not in message


def test_shape_rank_bounded() -> None:
    refused(build({"w": entry("U8", [1] * 65, 0, 1)}, b"a"), r"`w`: shape has 65 dimensions, more than 64")


@pytest.mark.parametrize("offsets", [[0], [0, 4, 8], [], "0,4", None, {"begin": 0}])
def test_data_offsets_not_a_pair(offsets: object) -> None:
    value = {"dtype": "U8", "shape": [4], "data_offsets": offsets}
    refused(build({"w": value}, DATA4), r"`w`: data_offsets must be an array of two integers")


@pytest.mark.parametrize("offsets", [[False, 4], [0, True], [0.0, 4], [0, 4.0], ["0", 4]])
def test_data_offsets_not_integers(offsets: list[object]) -> None:
    value = {"dtype": "U8", "shape": [4], "data_offsets": offsets}
    refused(build({"w": value}, DATA4), r"`w`: data_offsets must be an array of two integers")


@pytest.mark.parametrize(("begin", "end"), [(-4, 0), (0, -4), (-(2**64), 4), (-1, -1)])
def test_data_offsets_negative(begin: int, end: int) -> None:
    refused(build({"w": entry("U8", [4], begin, end)}, DATA4), r"`w`: data_offsets \[.*\] are negative")


def test_data_offsets_reversed() -> None:
    refused(build({"w": entry("U8", [4], 8, 4)}, DATA4 * 2), r"`w`: data_offsets \[8, 4\] are reversed")


@pytest.mark.parametrize(("begin", "end"), [(0, 5), (4, 8), (2**64 - 4, 2**64), (0, 10**60)])
def test_data_offsets_out_of_bounds(begin: int, end: int) -> None:
    refused(
        build({"w": entry("U8", [4], begin, end)}, DATA4),
        r"`w`: data_offsets .* end past the data section, which holds 4 bytes",
    )


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes", "pattern"),
    [
        ("F32", [2], 4, r"`w`: shape \[2\] of F32 needs more than the 4 bytes"),
        ("F32", [1], 8, r"`w`: shape \[1\] of F32 needs 4 bytes, but data_offsets \[0, 8\] span 8"),
        ("BF16", [], 4, r"`w`: shape \[\] of BF16 needs 2 bytes"),
        ("U8", [0], 4, r"`w`: shape \[0\] of U8 needs 0 bytes"),
        ("C64", [1], 4, r"`w`: shape \[1\] of C64 needs more than the 4 bytes"),
    ],
)
def test_shape_and_dtype_disagree_with_byte_range(
    dtype: str, shape: list[int], nbytes: int, pattern: str
) -> None:
    refused(build({"w": entry(dtype, shape, 0, nbytes)}, b"\0" * nbytes), pattern)


def test_huge_shape_refused_without_allocating() -> None:
    # 2**62 * 2**62 * ... elements: the running product is capped at the 4-byte range, so this is instant.
    started = time.perf_counter()
    refused(
        build({"w": entry("F64", [2**62] * 64, 0, 4)}, DATA4),
        r"`w`: shape .* of F64 needs more than the 4 bytes",
    )
    assert time.perf_counter() - started < 1


def test_zero_dimension_cancels_huge_ones() -> None:
    header = parse(build({"w": entry("F32", [2**63 - 1, 0, 2**63 - 1], 0, 0)}))
    assert header.tensors[0].shape == (2**63 - 1, 0, 2**63 - 1)


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("F4", [3], 2), ("F4", [1], 1), ("F6_E2M3", [3], 3), ("F6_E3M2", [2, 1], 2)],
)
def test_sub_byte_dtype_must_fill_whole_bytes(dtype: str, shape: list[int], nbytes: int) -> None:
    refused(
        build({"w": entry(dtype, shape, 0, nbytes)}, b"\0" * nbytes),
        rf"`w`: shape .* of {dtype} is \d+ bits, not a whole number of bytes",
    )


# --- layout: overlap, gaps, trailers ------------------------------------------------------------------------


def test_overlapping_ranges() -> None:
    header = {"a": entry("U8", [8], 0, 8), "b": entry("U8", [8], 4, 12)}
    refused(build(header, b"\0" * 12), r"tensors `a` \[0, 8\) and `b` \[4, 12\) overlap")


def test_aliased_tensors_share_one_range() -> None:
    header = {"a": entry("U8", [4], 0, 4), "b": entry("F32", [1], 0, 4)}
    refused(build(header, DATA4), r"tensors `a` \[0, 4\) and `b` \[0, 4\) overlap")


def test_empty_tensor_inside_another_range() -> None:
    header = {"a": entry("U8", [8], 0, 8), "e": entry("U8", [0], 4, 4)}
    refused(build(header, b"\0" * 8), r"tensors `a` \[0, 8\) and `e` \[4, 4\) overlap")


def test_gap_between_tensors() -> None:
    header = {"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 8, 12)}
    refused(
        build(header, b"aaaaEVILbbbb"),
        r"bytes \[4, 8\) of the data section, before tensor `b`",
        r"cover",
        r"unindexed",
    )


def test_gap_before_first_tensor() -> None:
    refused(
        build({"w": entry("U8", [4], 4, 8)}, DATA4 * 2),
        r"bytes \[0, 4\).*before tensor `w`",
        r"cover",
        r"unindexed",
    )


def test_trailing_bytes_after_last_tensor() -> None:
    refused(
        build(U8_4, DATA4 + b"PK\x05\x06" + b"\0" * 18),
        r"bytes \[4, 26\) at the end of the data section",
        r"cover",
        r"unindexed",
    )


def test_data_without_any_tensor() -> None:
    refused(build({}, b"payload"), r"bytes \[0, 7\) at the end", r"unindexed")
    refused(build({"__metadata__": {"a": "b"}}, b"payload"), r"unindexed")


# --- messages are safe to print -----------------------------------------------------------------------------


def test_control_characters_in_names_are_escaped() -> None:
    name = "w\x1b[2J\nFAKE: verified OK\r"
    message = refused(build({name: entry("f32", [4], 0, 4)}, DATA4), r"unknown dtype")
    assert "\x1b" not in message and "\n" not in message and "\r" not in message
    assert r"`w\x1b[2J\nFAKE: verified OK\r`" in message


def test_long_names_are_truncated() -> None:
    name = "w" * 100_000
    message = refused(build({name: entry("f32", [4], 0, 4)}, DATA4), r"unknown dtype")
    assert len(message) < 1000
    assert "w" * 80 + "...`" in message


@pytest.mark.parametrize(
    "decoy",
    ["-0", "a-0b", "9" * 641, "-" + "1" * 700],
)
def test_integer_lookalikes_inside_strings_change_nothing(decoy: str) -> None:
    """The pre-check that routes a header to the integer hook (`-0`, a run of more than 640 digits) also
    matches inside strings; such a header still parses exactly as it would without the hook."""
    plain = parse(build({"w": entry("U8", [2, 2], 0, 4), "__metadata__": {"k": "v"}}, DATA4))
    decoyed = parse(build({decoy: entry("U8", [2, 2], 0, 4), "__metadata__": {"k": decoy}}, DATA4))
    assert [(t.dtype, t.shape, t.begin, t.end) for t in decoyed.tensors] == [
        (t.dtype, t.shape, t.begin, t.end) for t in plain.tensors
    ]
    assert [t.name for t in decoyed.tensors] == [decoy]
    assert decoyed.metadata == {"k": decoy}


@pytest.mark.parametrize(
    ("digits", "pattern"),
    [
        (640, r"data_offsets \[0, <an integer of \d+ bits>\] end past the data section"),
        (641, r"data_offsets\[1\] is an integer of 641 digits \(too long\)$"),
    ],
)
def test_the_long_integer_boundary_is_exact(digits: int, pattern: str) -> None:
    """640 digits is still an integer (too large for the data section); 641 is the first too long."""
    text = '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,' + "9" * digits + "]}}"
    refused(build(text, DATA4), r"tensor `w`: " + pattern)


def test_threads_sharing_the_decoder_each_get_their_own_verdict_naming_their_file() -> None:
    """One decoder per integer mode is shared by every thread; its hooks signal refusals without a file name,
    which the caller adds: a refusal must name the file of the thread that parsed it, never another's."""
    import sys
    import threading

    texts = {
        "good": build(U8_4, DATA4),
        "dup": build('{"w":' + json.dumps(entry("U8", [4], 0, 4)) + ',"w":{}}', DATA4),
        "negzero": build('{"w":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'),
        "nan": build('{"w":{"dtype":"U8","shape":[NaN],"data_offsets":[0,4]}}', DATA4),
        "long": build('{"w":{"dtype":"U8","shape":[' + "7" * 700 + '],"data_offsets":[0,4]}}', DATA4),
    }

    def verdict(name: str) -> str:
        blob = texts[name]
        try:
            read_header(io.BytesIO(blob), len(blob), path=f"{name}.safetensors", limits=LIMITS)
        except MalformedArtifactError as e:
            return str(e)
        return "accepted"

    expected = {name: verdict(name) for name in texts}
    assert expected["good"] == "accepted"
    assert all(expected[n].startswith(f"{n}.safetensors: ") for n in texts if n != "good")
    wrong: list[tuple[str, str]] = []

    def work(k: int) -> None:
        names = list(texts)
        for i in range(400):
            name = names[(i + k) % len(names)]
            if (got := verdict(name)) != expected[name]:
                wrong.append((name, got))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads inside the decoder's Python hooks
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
