"""StreamHasher (bytes pushed as they arrive, e.g. a download) computes exactly what the engine computes."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import DigestMismatchError, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import FileIdentity, StreamHasher, check_identity, hash_files
from modelsec.modelformat.model_files import open_model_root

ALGORITHMS = [HashAlgorithm.SHA256, HashAlgorithm.SM3]


def _engine(root: Path, name: str):  # type: ignore[no-untyped-def]
    fd = open_model_root(root)
    try:
        return hash_files(fd, [name], algorithms=ALGORITHMS, tensor_hash=HashAlgorithm.BLAKE3)[name]
    finally:
        os.close(fd)


def _streamed(data: bytes, name: str, sizes: list[int], limits: Limits | None = None):  # type: ignore[no-untyped-def]
    hasher = StreamHasher(
        name,
        len(data),
        algorithms=ALGORITHMS,
        tensor_hash=HashAlgorithm.BLAKE3,
        limits=limits or Limits(),
        what=f"./{name}",  # as the engine names a file of model "."
    )
    pos, i = 0, 0
    while pos < len(data):
        step = sizes[i % len(sizes)]
        hasher.update(data[pos : pos + step])
        pos, i = pos + step, i + 1
    return hasher.finish()


# 1-byte pieces split the length prefix and the header; 4096 lands header and data in one piece.
@pytest.mark.parametrize("sizes", [[1], [3, 1000, 7], [4096], [2**20]])
def test_streamed_digests_equal_the_engine_in_any_pieces(tmp_path: Path, sizes: list[int]) -> None:
    rng = np.random.default_rng(5)
    tensors = {
        "a": rng.standard_normal((33, 7)).astype(np.float32),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "c": rng.integers(0, 255, size=(1000,), dtype=np.uint8),
    }
    save_file(tensors, str(tmp_path / "w.safetensors"))
    (tmp_path / "model.pkl.json").write_bytes(pickle.dumps({"x": 1}, protocol=4))
    for name in ("w.safetensors", "model.pkl.json"):
        data = (tmp_path / name).read_bytes()
        want, got = _engine(tmp_path, name), _streamed(data, name, sizes)
        assert got.digests == want.digests and got.size == want.size
        assert got.header == want.header and got.tensors == want.tensors and got.pickle == want.pickle
    assert got.pickle is not None  # the pickle verdict is made on the streamed bytes too


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"\x01\x00", "header"),  # shorter than the length prefix
        ((2**40).to_bytes(8, "little") + b"{}", "header"),  # a length past the limit
        ((2).to_bytes(8, "little") + b"[]", "header"),  # not a JSON object
    ],
)
def test_malformed_header_refused_as_the_engine_refuses(tmp_path: Path, data: bytes, detail: str) -> None:
    (tmp_path / "w.safetensors").write_bytes(data)
    with pytest.raises(MalformedArtifactError) as engine:
        _engine(tmp_path, "w.safetensors")
    with pytest.raises(MalformedArtifactError) as streamed:
        _streamed(data, "w.safetensors", [1])
    assert detail in str(streamed.value) and type(streamed.value) is type(engine.value)


def test_more_or_fewer_bytes_than_announced_refused(tmp_path: Path) -> None:
    hasher = StreamHasher("c.json", 4, algorithms=ALGORITHMS, tensor_hash=None, limits=Limits())
    hasher.update(b"{}")
    with pytest.raises(MalformedArtifactError, match="2 bytes, not the 4 announced"):
        hasher.finish()
    with pytest.raises(MalformedArtifactError, match="more than the 4 bytes"):
        hasher.update(b"{ } ")


def test_identity_check_refuses_a_rewritten_file_of_the_same_size(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * 64)
    before = path.stat()
    identity = FileIdentity.of(before)
    fd = open_model_root(tmp_path)
    try:
        check_identity(fd, "w.bin", identity, model=str(tmp_path))
        time.sleep(
            0.05
        )  # past the file system clock's tick (FileIdentity: a write in the same tick is not seen)
        path.write_bytes(b"b" * 64)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back; ctime cannot be
        with pytest.raises(DigestMismatchError) as refused:
            check_identity(fd, "w.bin", identity, model=str(tmp_path))
    finally:
        os.close(fd)
    assert refused.value.path == f"{tmp_path}/w.bin" and refused.value.expected == identity.describe()
    assert "file identity" in str(refused.value)
