"""The strict safetensors header parser on files written by the real `safetensors` library.

Every valid file must parse and agree with `safetensors` itself (names, dtypes, shapes, the bytes each
offset pair selects); random mutations of a valid file must either parse consistently or raise
MalformedArtifactError, never another exception, and never be accepted where `safetensors` refuses.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as np_save
from safetensors.numpy import save_file as np_save_file

from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.safetensors_header import (
    DTYPE_BITS,
    SafetensorsHeader,
    TensorInfo,
    parse_header,
    parse_header_length,
    read_header,
)

LIMITS = Limits()


def parse_bytes(blob: bytes, path: str = "mem.safetensors") -> tuple[SafetensorsHeader, bytes]:
    return read_header(io.BytesIO(blob), len(blob), path=path, limits=LIMITS)


def assert_consistent(header: SafetensorsHeader, blob: bytes, raw: bytes) -> None:
    """Invariants of every accepted header."""
    assert header.file_size == len(blob)
    assert header.data_start == 8 + header.header_length
    assert header.data_size == len(blob) - header.data_start
    assert raw == blob[: header.data_start]
    cursor = 0
    for t in header.tensors:
        assert t.begin == cursor
        assert t.dtype in DTYPE_BITS
        numel = int(np.prod(t.shape, dtype=object)) if t.shape else 1
        assert numel * DTYPE_BITS[t.dtype] == 8 * t.nbytes
        assert header.tensor(t.name) is t
        cursor = t.end
    assert cursor == header.data_size
    assert len({t.name for t in header.tensors}) == len(header.tensors)


def reference_deserialize(blob: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The reference parser (safetensors' Rust core); raises `safetensors.SafetensorError`."""
    result: list[tuple[str, dict[str, Any]]] = safetensors.deserialize(blob)  # type: ignore[no-untyped-call]
    return result


def assert_agrees_with_reference(header: SafetensorsHeader, blob: bytes) -> None:
    """`safetensors.deserialize` accepts the same bytes and sees the same tensors and data."""
    reference = dict(reference_deserialize(blob))
    assert set(reference) == {t.name for t in header.tensors}
    for t in header.tensors:
        info = reference[t.name]
        assert info["dtype"] == t.dtype
        assert tuple(info["shape"]) == t.shape
        assert bytes(info["data"]) == blob[header.data_start + t.begin : header.data_start + t.end]


# --- files written by safetensors ---------------------------------------------------------------------------


def test_numpy_file_with_metadata(tmp_path: Path) -> None:
    tensors: dict[str, np.ndarray[Any, Any]] = {
        "b": np.arange(6, dtype=np.float16).reshape(2, 3),
        "a.weight": np.ones((3, 4), dtype=np.float32),
        "i64": np.array([1, -2, 3], dtype=np.int64),
        "flags": np.array([True, False]),
        "u8": np.frombuffer(b"\x00\xff\x10", dtype=np.uint8),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.array(7.5, dtype=np.float64),
        "empty": np.zeros((0, 5), dtype=np.int32),
    }
    path = tmp_path / "model.safetensors"
    np_save_file(tensors, str(path), metadata={"format": "np", "note": "{not json}"})
    blob = path.read_bytes()
    with path.open("rb") as f:
        header, raw = read_header(f, path.stat().st_size, path=path.name, limits=LIMITS)
        assert f.tell() == header.data_start
    assert_consistent(header, blob, raw)
    assert_agrees_with_reference(header, blob)
    assert header.path == "model.safetensors"
    assert header.metadata == {"format": "np", "note": "{not json}"}
    assert isinstance(header.metadata, MappingProxyType)
    assert header.tensor("scalar") == TensorInfo(
        "scalar", "F64", (), header.tensor("scalar").begin, header.tensor("scalar").begin + 8
    )
    assert header.tensor("empty").shape == (0, 5) and header.tensor("empty").nbytes == 0
    assert {t.dtype for t in header.tensors} == {"F16", "F32", "I64", "BOOL", "U8", "C64", "F64", "I32"}
    for name, array in tensors.items():
        t = header.tensor(name)
        assert t.shape == array.shape
        assert blob[header.data_start + t.begin : header.data_start + t.end] == array.tobytes()


def test_tensors_sorted_by_offset_and_lookup_misses_raise_keyerror() -> None:
    blob = np_save({"z": np.zeros(3, np.float32), "a": np.zeros(1, np.int8), "m": np.zeros(2, np.float64)})
    header, _ = parse_bytes(blob)
    begins = [t.begin for t in header.tensors]
    assert begins == sorted(begins)
    with pytest.raises(KeyError):
        header.tensor("missing")
    with pytest.raises(KeyError):
        header.tensor("__metadata__")
    assert header.metadata is None


def test_torch_file_with_many_dtypes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from safetensors.torch import save_file

    dtypes = {
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F64": torch.float64,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
        "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
        "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "U16": torch.uint16,
        "U32": torch.uint32,
        "U64": torch.uint64,
        "BOOL": torch.bool,
        "C64": torch.complex64,
    }
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, dtype in dtypes.items():
        values = torch.randn(3, 5, generator=generator) * 4
        tensors[f"layer.{name.lower()}"] = values.to(dtype)
    tensors["scalar.bf16"] = torch.tensor(1.5, dtype=torch.bfloat16)
    tensors["empty.f8"] = torch.empty(0, 7, dtype=torch.float8_e4m3fn)
    tensors["empty.f32"] = torch.empty(4, 0, 2)
    path = tmp_path / "model-00001-of-00001.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})

    blob = path.read_bytes()
    header, raw = parse_bytes(blob, path=path.name)
    assert_consistent(header, blob, raw)
    assert_agrees_with_reference(header, blob)
    assert header.metadata == {"format": "pt"}
    seen_dtypes = {t.dtype for t in header.tensors}
    assert seen_dtypes == set(dtypes)

    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == {t.name for t in header.tensors}
        assert f.metadata() == dict(header.metadata)
        for t in header.tensors:
            view = f.get_slice(t.name)
            assert view.get_dtype() == t.dtype
            assert tuple(view.get_shape()) == t.shape
            loaded = f.get_tensor(t.name)
            data = blob[header.data_start + t.begin : header.data_start + t.end]
            assert loaded.reshape(-1).view(torch.uint8).numpy().tobytes() == data
            assert tensors[t.name].reshape(-1).view(torch.uint8).numpy().tobytes() == data


def _raw_file(header: dict[str, object], data: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("F4", [4], 2), ("F4", [2, 3], 3), ("F6_E2M3", [4], 3), ("F6_E3M2", [8, 1], 6), ("F8_E8M0", [3], 3)],
)
def test_sub_byte_and_microscaling_dtypes(dtype: str, shape: list[int], nbytes: int) -> None:
    blob = _raw_file({"q": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}, b"\x5a" * nbytes)
    header, raw = parse_bytes(blob)
    assert_consistent(header, blob, raw)
    assert_agrees_with_reference(header, blob)


def test_empty_file_and_zero_size_tensors() -> None:
    header, _ = parse_bytes(_raw_file({}, b""))
    assert header.tensors == () and header.metadata is None and header.data_size == 0
    layout = {
        "e1": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
        "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
        "e2": {"dtype": "BF16", "shape": [3, 0], "data_offsets": [2, 2]},
        "e3": {"dtype": "I64", "shape": [0, 0], "data_offsets": [2, 2]},
        "b": {"dtype": "U8", "shape": [], "data_offsets": [2, 3]},
        "e4": {"dtype": "F4", "shape": [0], "data_offsets": [3, 3]},
    }
    blob = _raw_file({"__metadata__": {}, **layout}, b"xyz")
    header, raw = parse_bytes(blob)
    assert [t.name for t in header.tensors] == ["e1", "a", "e2", "e3", "b", "e4"]
    assert header.metadata == {}
    assert_consistent(header, blob, raw)
    assert_agrees_with_reference(header, blob)


def test_safetensors_writer_bug_no_tensors_empty_metadata() -> None:
    # safetensors 0.8.0 serialises ({}, metadata={}) as `{},"__metadata__":{}}`; its own reader refuses it.
    blob = np_save({}, metadata={})
    with pytest.raises(safetensors.SafetensorError):
        reference_deserialize(blob)
    with pytest.raises(MalformedArtifactError, match="header"):
        parse_bytes(blob)


def test_streaming_api_matches_read_header() -> None:
    blob = np_save({"w": np.arange(10, dtype=np.int16)}, metadata={"k": "v"})
    n = parse_header_length(blob[:64], len(blob), path="p", limits=LIMITS)
    streamed = parse_header(blob[8 : 8 + n], len(blob), path="p", limits=LIMITS)
    whole, raw = read_header(io.BytesIO(blob), len(blob), path="p", limits=LIMITS)
    assert streamed == whole
    assert raw == blob[: 8 + n]


class TrickleReader(io.BytesIO):
    """Returns at most 3 bytes per read, like a pipe or a slow network file system."""

    def read(self, size: int | None = -1) -> bytes:
        return super().read(3 if size is None or size < 0 else min(size, 3))


def test_short_reads_are_retried() -> None:
    blob = np_save({"w": np.arange(10, dtype=np.int16)}, metadata={"k": "v" * 100})
    header, raw = read_header(TrickleReader(blob), len(blob), path="p", limits=LIMITS)
    assert raw == blob[: header.data_start]
    assert header.tensor("w").shape == (10,)


def test_header_at_the_limit_is_accepted() -> None:
    blob = np_save({"w": np.zeros(2, np.uint8)})
    n = int.from_bytes(blob[:8], "little")
    header, _ = read_header(
        io.BytesIO(blob), len(blob), path="p", limits=Limits(max_safetensors_header_bytes=n)
    )
    assert header.header_length == n
    with pytest.raises(MalformedArtifactError, match="exceeds the limit"):
        read_header(io.BytesIO(blob), len(blob), path="p", limits=Limits(max_safetensors_header_bytes=n - 1))


def test_dtype_whitelist_matches_installed_safetensors() -> None:
    # safetensors names every dtype it knows when it refuses one; the whitelist must be exactly that list.
    blob = _raw_file({"w": {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    with pytest.raises(Exception, match="unknown variant") as info:
        reference_deserialize(blob)
    known = set(str(info.value).split("expected one of ", 1)[1].replace("`", "").split(" at ")[0].split(", "))
    assert known == set(DTYPE_BITS)


def test_values_are_frozen() -> None:
    header, _ = parse_bytes(np_save({"w": np.zeros(1, np.uint8)}))
    with pytest.raises(AttributeError):
        header.tensors[0].name = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        header.file_size = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        DTYPE_BITS["Q4"] = 4  # type: ignore[index]


# --- properties ---------------------------------------------------------------------------------------------

NUMPY_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.float16,
    np.int32,
    np.uint32,
    np.float32,
    np.int64,
    np.uint64,
    np.float64,
    np.complex64,
]

tensor_dicts = st.dictionaries(
    keys=st.text(min_size=1, max_size=12).filter(lambda s: s != "__metadata__"),
    values=st.tuples(st.sampled_from(NUMPY_DTYPES), st.lists(st.integers(0, 4), max_size=3)),
    max_size=6,
)
metadata_maps = st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_dicts, metadata_maps)
def test_any_file_written_by_safetensors_parses_and_agrees(
    spec: dict[str, tuple[type, list[int]]], metadata: dict[str, str] | None
) -> None:
    arrays: dict[str, np.ndarray[Any, Any]] = {
        name: np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
        for name, (dtype, shape) in spec.items()
    }
    blob = np_save(arrays, metadata=metadata)
    try:
        reference_deserialize(blob)
    except safetensors.SafetensorError:
        # safetensors 0.8.0 writes an invalid header for no tensors + empty metadata (see below): both refuse.
        with pytest.raises(MalformedArtifactError, match="header"):
            parse_bytes(blob)
        return
    header, raw = parse_bytes(blob)
    assert_consistent(header, blob, raw)
    assert_agrees_with_reference(header, blob)
    written = json.loads(raw[8:]).get("__metadata__")
    assert (None if header.metadata is None else dict(header.metadata)) == written


BASE = np_save(
    {
        "model.embed": np.arange(12, dtype=np.float32).reshape(3, 4),
        "model.bias": np.array([1, 2], dtype=np.int16),
        "flag": np.array(True),
        "empty": np.zeros((0, 2), dtype=np.uint8),
    },
    metadata={"format": "np"},
)
BASE_N = int.from_bytes(BASE[:8], "little")
INTERESTING = b'{}[]",: -0123456789eE.\\u\x00\x7f\xff\xc3FUIBtnaN'


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    blob = bytearray(BASE)
    for _ in range(draw(st.integers(1, 4))):
        # Mostly hit the prefix and the header, where the parser works; sometimes the data section.
        pos = draw(st.integers(0, 8 + BASE_N - 1) | st.integers(0, len(blob) - 1))
        blob[pos] = draw(st.sampled_from(INTERESTING) | st.integers(0, 255))
    cut = draw(st.sampled_from(["none", "none", "truncate", "extend"]))
    if cut == "truncate":
        del blob[draw(st.integers(0, len(blob) - 1)) :]
    elif cut == "extend":
        blob += draw(st.binary(min_size=1, max_size=8))
    return bytes(blob)


@pytest.mark.slow
@settings(max_examples=400, deadline=500)
@given(mutated())
def test_mutations_parse_consistently_or_raise_malformed(blob: bytes) -> None:
    try:
        header, raw = parse_bytes(blob)
    except MalformedArtifactError as e:
        assert str(e).startswith("mem.safetensors: ")
        return
    assert_consistent(header, blob, raw)
    # Anything this parser accepts, safetensors itself loads identically.
    assert_agrees_with_reference(header, blob)


@settings(max_examples=200, deadline=500)
@given(st.binary(max_size=64), st.integers(0, 2**64 - 1))
def test_arbitrary_bytes_never_raise_anything_else(tail: bytes, declared: int) -> None:
    blob = struct.pack("<Q", declared) + tail
    try:
        header, raw = parse_bytes(blob)
    except MalformedArtifactError:
        return
    assert_consistent(header, blob, raw)


def _blob(header_text: str, data: bytes) -> bytes:
    raw = header_text.encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize(
    "name",
    [
        "w",  # no `-0` and no long digit run: integers take the decoder's C path
        "layer-0.w",  # a `-0` inside a string: the hooked path, same result
        "w" + "7" * 641,  # an over-long digit run inside a string: the hooked path, same result
    ],
)
def test_integers_decode_the_same_on_either_path(name: str) -> None:
    text = f'{{"{name}":{{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]}}}}'
    header, _ = parse_bytes(_blob(text, bytes(4)))
    (info,) = header.tensors
    assert (info.name, info.shape, info.begin, info.end) == (name, (2, 2), 0, 4)
    assert all(type(v) is int for v in (*info.shape, info.begin, info.end))


@pytest.mark.parametrize("offsets", ["[-0,4]", "[ -0 , 4 ]"])
def test_negative_zero_offset_is_refused_whatever_else_the_header_holds(offsets: str) -> None:
    # serde_json reads `-0` as a float, so safetensors refuses it; as the integer 0 it would select [0, 4).
    text = f'{{"w":{{"dtype":"U8","shape":[4],"data_offsets":{offsets}}}}}'
    with pytest.raises(MalformedArtifactError, match=r"`w`: data_offsets must be an array of two integers"):
        parse_bytes(_blob(text, bytes(4)))
