"""The hashing engine: one pass, exact digests, per-tensor digests at any chunk size, refusals."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import hash_files, new_hasher
from modelsec.modelformat.model_files import open_model_root


def _hash(root: Path, names: list[str], **kw):  # type: ignore[no-untyped-def]
    fd = open_model_root(root)
    try:
        return hash_files(fd, names, **kw)
    finally:
        os.close(fd)


def test_sm3_known_answer() -> None:
    # GB/T 32905-2016 Appendix A.1: SM3("abc")
    h = new_hasher(HashAlgorithm.SM3)
    h.update(b"abc")
    assert h.digest().hex() == "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0"


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096, 8 * 2**20])
def test_file_and_tensor_digests_match_independent_hashing(tmp_path: Path, chunk: int) -> None:
    rng = np.random.default_rng(1)
    tensors = {
        "a": rng.standard_normal((33, 7)).astype(np.float32),
        "b": np.zeros((0, 4), dtype=np.float16),
        "c": rng.integers(0, 255, size=(1000,), dtype=np.uint8),
        "d": np.array(3.5, dtype=np.float64),
    }
    save_file(tensors, str(tmp_path / "w.safetensors"))
    (tmp_path / "other.txt").write_bytes(b"hello" * 1000)
    out = _hash(
        tmp_path,
        ["w.safetensors", "other.txt"],
        algorithms=[HashAlgorithm.SHA256, HashAlgorithm.SM3],
        tensor_hash=HashAlgorithm.BLAKE3,
        limits=Limits(hash_chunk_bytes=chunk),
    )
    raw = (tmp_path / "w.safetensors").read_bytes()
    got = out["w.safetensors"]
    assert got.digests[HashAlgorithm.SHA256] == hashlib.sha256(raw).digest()
    assert got.digests[HashAlgorithm.SM3] == hashlib.new("sm3", raw).digest()
    n = int.from_bytes(raw[:8], "little")
    data = raw[8 + n :]
    assert got.tensors is not None and set(got.tensors) == set(tensors)
    for name, t in got.tensors.items():
        assert t.digest == blake3.blake3(data[t.begin : t.end]).digest(), name
        assert t.end - t.begin == tensors[name].nbytes
    assert out["other.txt"].tensors is None
    assert out["other.txt"].digests[HashAlgorithm.SHA256] == hashlib.sha256(b"hello" * 1000).digest()


def test_malformed_safetensors_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes((2**63).to_bytes(8, "little") + b"{}")
    with pytest.raises(MalformedArtifactError, match=r"bad\.safetensors.*header|header.*bad\.safetensors"):
        _hash(tmp_path, ["bad.safetensors"], algorithms=[HashAlgorithm.SHA256])


def test_symlink_swapped_in_after_walk_refused(tmp_path: Path) -> None:
    (tmp_path / "real.bin").write_bytes(b"x")
    (tmp_path / "f.txt").symlink_to(tmp_path / "real.bin")
    with pytest.raises(PolicyViolationError, match="symlink"):
        _hash(tmp_path, ["f.txt"], algorithms=[HashAlgorithm.SHA256])
    (tmp_path / "d").symlink_to(tmp_path)
    with pytest.raises(PolicyViolationError, match="symlink"):
        _hash(tmp_path, ["d/real.bin"], algorithms=[HashAlgorithm.SHA256])


def test_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(MalformedArtifactError, match="not a regular file"):
        _hash(tmp_path, ["pipe"], algorithms=[HashAlgorithm.SHA256])


def test_progress_counts_every_byte(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_bytes(os.urandom(10_000 * (i + 1)))
    seen: list[int] = []
    _hash(
        tmp_path,
        [f"f{i}" for i in range(5)],
        algorithms=[HashAlgorithm.SHA256],
        limits=Limits(hash_chunk_bytes=4096),
        progress=seen.append,
    )
    assert sum(seen) == sum(10_000 * (i + 1) for i in range(5))


def _split_hash(path: Path, size: int, chunk: int, **kw):  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    from modelsec.modelformat.hashing import _PIPELINE_SLOTS, _Reader, hash_source

    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(1) as helper:
            reader = _Reader(fd, size, chunk, what=str(path), buffers=_PIPELINE_SLOTS)
            return hash_source(reader, path.name, size, limits=Limits(), helper=helper, **kw)
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 100, 4096, 2**20])
def test_work_split_over_two_threads_gives_the_same_digests(tmp_path: Path, chunk: int) -> None:
    """A single large file hashed by two threads (helper reads + per-tensor, own thread file digest)."""
    rng = np.random.default_rng(2)
    tensors = {f"t{i}": rng.standard_normal((i * 97 + 1,)).astype(np.float32) for i in range(40)}
    tensors["empty"] = np.zeros((0,), dtype=np.float32)
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    raw = path.read_bytes()
    algorithms = [HashAlgorithm.SHA256, HashAlgorithm.SM3]
    got = _split_hash(path, len(raw), chunk, algorithms=algorithms, tensor_hash=HashAlgorithm.BLAKE3)
    one = _hash(tmp_path, ["w.safetensors"], algorithms=algorithms, max_workers=1)["w.safetensors"]
    assert got.digests[HashAlgorithm.SHA256] == hashlib.sha256(raw).digest()
    assert got.digests[HashAlgorithm.SM3] == hashlib.new("sm3", raw).digest()
    data = raw[8 + int.from_bytes(raw[:8], "little") :]
    assert got.tensors is not None and set(got.tensors) == set(tensors)
    for name, t in got.tensors.items():
        assert t.digest == blake3.blake3(data[t.begin : t.end]).digest(), name
        assert one.tensors is not None and one.tensors[name] == t


def test_work_split_refuses_a_file_that_grew(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(50_000))
    with pytest.raises(MalformedArtifactError, match="grew"):
        _split_hash(
            path, 40_000, 1000, algorithms=[HashAlgorithm.SHA256, HashAlgorithm.BLAKE3], tensor_hash=None
        )
    with pytest.raises(MalformedArtifactError, match="shrank"):
        _split_hash(
            path, 60_000, 1000, algorithms=[HashAlgorithm.SHA256, HashAlgorithm.BLAKE3], tensor_hash=None
        )
