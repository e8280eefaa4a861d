"""The verified loader's private buffers: mapped slice by slice while read, refused when they cannot be."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.errors import BackendUnavailableError
from modelsec.limits import Limits
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import _shard_buffers, load_model

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def _signed_model(root: Path, key_dir: Path, *, chunk: int) -> tuple[Path, Policy]:
    """Two shards of ~60 KB whose sizes are not page multiples, read in `chunk`-byte steps."""
    root.mkdir()
    rng = np.random.default_rng(7)
    for i in range(2):
        tensors = {f"w{i}": rng.standard_normal((3001 + i,)).astype(np.float32), f"b{i}": np.arange(13 + i)}
        save_file(tensors, str(root / f"model-{i + 1:05d}-of-00002.safetensors"))
    sign_model(root, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"], limits=Limits(hash_chunk_bytes=chunk))
    return root, policy


@pytest.mark.parametrize("chunk", [5000, 4096, 1 << 20])
def test_a_load_in_slices_of_any_size_equals_plain_safetensors(
    tmp_path: Path, key_dir: Path, chunk: int
) -> None:
    from safetensors.torch import load_file

    model, policy = _signed_model(tmp_path / "m", key_dir, chunk=chunk)
    loaded = load_model(model, policy)
    expected = {k: v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_memory_the_kernel_cannot_map_is_refused_naming_the_shard(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _shard_buffers._can_populate_slices():
        pytest.skip("this kernel maps the whole buffer up front (no MADV_POPULATE_WRITE)")
    model, policy = _signed_model(tmp_path / "m", key_dir, chunk=4096)
    real = _shard_buffers._populate_slice
    calls = []

    # Every private CPU buffer (a shard's own mapping or a slice of the small-shard arena) is mapped
    # through this one function.
    def populate_then_fail(mapping: Any, base: int, start: int, length: int) -> None:
        calls.append(start)
        if len(calls) > 1:  # as MADV_POPULATE_WRITE reports a memory cgroup at its limit
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        real(mapping, base, start, length)

    monkeypatch.setattr(_shard_buffers, "_populate_slice", populate_then_fail)
    with pytest.raises(
        BackendUnavailableError, match=r"model-0000[12]-of-00002\.safetensors: cannot allocate"
    ):
        load_model(model, policy)


def test_a_load_keeps_one_python_tensor_per_tensor(tmp_path: Path, key_dir: Path) -> None:
    """Tensors are views of the verified buffers that leave no intermediate Python tensor alive: a model of
    thousands of tensors would otherwise keep twice as many objects for the garbage collector to count (a
    full collection fired inside a 1,000-shard load)."""
    import gc

    model = tmp_path / "m"
    model.mkdir()
    rng = np.random.default_rng(3)
    for i in range(2):
        tensors = {f"w{i}.{j}": rng.standard_normal((7, 3)).astype(np.float32) for j in range(12)}
        tensors.update({f"ids{i}.{j}": np.arange(j + 1) for j in range(12)})
        save_file(tensors, str(model / f"model-{i + 1:05d}-of-00002.safetensors"))
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])

    def live_tensors() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is torch.Tensor)

    before = live_tensors()
    loaded = load_model(model, policy)
    assert len(loaded) == 48
    # The tensors returned, plus one private buffer per shard and one typed view per dtype of each buffer's
    # storage (at most 2 shards x 2 dtypes).
    assert live_tensors() - before <= len(loaded) + 2 + 4


def test_a_range_outside_the_buffer_is_refused_not_read() -> None:
    """`tensor_from` bounds the range itself: the typed view it slices spans the whole storage, which
    `as_strided` alone would let a view reach beyond this buffer into (another shard's bytes)."""
    from modelsec.errors import MalformedArtifactError
    from modelsec.modelformat.safetensors_header import TensorInfo

    storage = torch.zeros(64, dtype=torch.uint8)
    buffer = storage[8:40]  # 32 bytes inside a larger storage, as a shard carved from the arena
    info = TensorInfo(name="w", dtype="F32", shape=(4,), begin=24, end=40)
    refusal = r"x\.safetensors: tensor `w` bytes \[24, 40\) lie outside the 32 bytes read"
    with pytest.raises(MalformedArtifactError, match=refusal):
        _shard_buffers.tensor_from(buffer, 0, info, "w", "x.safetensors")
    inside = TensorInfo(name="w", dtype="F32", shape=(4,), begin=16, end=32)
    assert _shard_buffers.tensor_from(buffer, 0, inside, "w", "x.safetensors").shape == (4,)
