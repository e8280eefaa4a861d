"""`tensor_from` maps each tensor onto exactly its own verified bytes, for any layout the parser accepts.

The many-shards change (issue 32) builds tensors with `as_strided` from one typed view per dtype of the whole
storage shared by every shard carved from one arena mapping; these properties pin that a tensor still holds
the bytes of its own range in its own shard, whatever the dtype, header length (alignment), shard position
inside the storage, and order in which the shared views were made.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelsec.limits import Limits
from modelsec.modelformat.safetensors_header import DTYPE_BITS, parse_header
from modelsec.verifier import _shard_buffers

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

_LOADABLE = sorted(d for d in _shard_buffers.TORCH_DTYPES if _shard_buffers._torch_dtype(d) is not None)

_tensor = st.tuples(
    st.sampled_from(_LOADABLE),
    st.lists(st.integers(0, 3), max_size=3),  # shape: scalars and empty tensors included
)
_shard = st.tuples(
    st.lists(_tensor, min_size=1, max_size=5),
    st.integers(0, 9),  # extra header padding: data sections at every alignment
    st.integers(0, 9),  # gap before the shard inside the shared storage
)


def _shard_file(tensors: list[tuple[str, list[int]]], padding: int, fill: int) -> bytes:
    header: dict[str, object] = {}
    data = bytearray()
    for i, (dtype, shape) in enumerate(tensors):
        count = 1
        for dim in shape:
            count *= dim
        size = count * DTYPE_BITS[dtype] // 8
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += bytes((fill + i * 31 + k * 7) % 251 for k in range(size))  # distinct bytes per tensor
    raw = json.dumps(header).encode() + b" " * padding
    return struct.pack("<Q", len(raw)) + raw + bytes(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_shard, min_size=1, max_size=3))
def test_each_tensor_is_its_own_bytes_in_a_shared_storage(shards: list) -> None:
    files = [_shard_file(t, pad, 17 * n) for n, (t, pad, _) in enumerate(shards)]
    starts, total = [], 0
    for (_, _, gap), f in zip(shards, files, strict=True):
        starts.append(total + gap)
        total += gap + len(f)
    storage = torch.zeros(total + 7, dtype=torch.uint8)  # one storage under every shard, as the arena
    for start, f in zip(starts, files, strict=True):
        storage[start : start + len(f)] = torch.frombuffer(bytearray(f), dtype=torch.uint8)
    views: _shard_buffers.TypedViews = {}
    for n, (start, f) in enumerate(zip(starts, files, strict=True)):
        (length,) = struct.unpack("<Q", f[:8])
        header = parse_header(f[8 : 8 + length], len(f), path=f"s{n}", limits=Limits())
        buffer = storage[start : start + len(f)]
        for info in header.tensors:
            t = _shard_buffers.tensor_from(buffer, header.data_start, info, info.name, f"s{n}", views)
            assert t.dtype == _shard_buffers._torch_dtype(info.dtype)
            assert tuple(t.shape) == info.shape
            expected = f[header.data_start + info.begin : header.data_start + info.end]
            got = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            assert got == expected, (n, info)
            if t.numel() and t.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr():
                # A view (not a copy): it starts at its own first byte.
                assert t.data_ptr() == buffer.data_ptr() + header.data_start + info.begin
