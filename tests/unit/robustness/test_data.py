"""Dataset loading: safetensors / npz / loader, digests, and one specific error per malformed input."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from modelsec.errors import MalformedArtifactError, PolicyError  # noqa: E402
from modelsec.robustness import load_dataset  # noqa: E402


def _xy(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 4, 4, generator=g), torch.arange(n, dtype=torch.int64) % 3


def test_safetensors_round_trip_and_digest(tmp_path: Path) -> None:
    x, y = _xy()
    path = tmp_path / "d.safetensors"
    save_file({"inputs": x, "labels": y}, str(path))
    data = load_dataset(path)
    assert torch.equal(data.inputs, x) and torch.equal(data.labels, y)
    assert data.size == 6 and data.format == "safetensors" and data.source == str(path)
    assert data.digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_npz_round_trip_converts_dtypes(tmp_path: Path) -> None:
    x, y = _xy()
    path = tmp_path / "d.npz"
    np.savez_compressed(path, inputs=x.numpy().astype(np.float64), labels=y.numpy().astype(np.int32))
    data = load_dataset(str(path))
    assert data.inputs.dtype == torch.float32 and data.labels.dtype == torch.int64
    assert torch.allclose(data.inputs, x) and torch.equal(data.labels, y)
    assert data.format == "npz" and data.digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_loader_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_loader_mod.py").write_text(
        "import torch\n"
        "def load():\n    return torch.zeros(4, 3), torch.tensor([0, 1, 2, 1])\n"
        "def as_map():\n    return {'inputs': torch.zeros(4, 3), 'labels': torch.tensor([0, 1, 2, 1])}\n"
        "def broken():\n    raise OSError('disk gone')\n"
        "def wrong():\n    return [1, 2, 3]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    a = load_dataset("my_loader_mod:load")
    b = load_dataset("my_loader_mod:as_map")
    assert a.format == "loader" and a.digest == b.digest and len(a.digest) == 64
    with pytest.raises(PolicyError, match="OSError: disk gone"):
        load_dataset("my_loader_mod:broken")
    with pytest.raises(MalformedArtifactError, match="must return"):
        load_dataset("my_loader_mod:wrong")
    with pytest.raises(PolicyError, match="cannot import"):
        load_dataset("no_such_module_xyz:load")
    with pytest.raises(PolicyError, match="no callable"):
        load_dataset("my_loader_mod:missing")
    sys.modules.pop("my_loader_mod", None)


def _write(tmp_path: Path, fmt: str, **tensors: object) -> Path:
    path = tmp_path / f"d.{fmt}"
    if fmt == "safetensors":
        save_file({k: v for k, v in tensors.items()}, str(path))  # type: ignore[misc]
    else:
        np.savez(path, **{k: v.numpy() for k, v in tensors.items()})  # type: ignore[attr-defined]
    return path


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize(
    "make,match",
    [
        (lambda x, y: {"inputs": x}, "lacks the tensor.*labels"),
        (lambda x, y: {"labels": y}, "lacks the tensor.*inputs"),
        (lambda x, y: {"inputs": x, "labels": y, "extra": y.clone()}, "unexpected tensor.*extra"),
        (lambda x, y: {"inputs": x, "labels": y[:-1].clone()}, "6 inputs but 5 labels"),
        (lambda x, y: {"inputs": x, "labels": y.reshape(3, 2)}, "must be 1-D"),
        (lambda x, y: {"inputs": x.reshape(-1), "labels": y}, "at least 2 dimensions"),
        (lambda x, y: {"inputs": x, "labels": y.float()}, "integer class indices"),
        (lambda x, y: {"inputs": (x * 255).to(torch.uint8), "labels": y}, "floating point"),
        (lambda x, y: {"inputs": x, "labels": y - 1}, "negative class"),
        (lambda x, y: {"inputs": x * 2, "labels": y}, "outside the valid range"),
        (lambda x, y: {"inputs": x.clone().fill_(float("nan")), "labels": y}, "NaN or infinite"),
        (lambda x, y: {"inputs": x[:0], "labels": y[:0]}, "empty"),
    ],
)
def test_malformed_datasets_are_refused(tmp_path: Path, fmt: str, make: object, match: str) -> None:
    x, y = _xy()
    path = _write(tmp_path, fmt, **make(x, y))  # type: ignore[operator]
    with pytest.raises(MalformedArtifactError, match=match):
        load_dataset(path)


def test_custom_range(tmp_path: Path) -> None:
    x, y = _xy()
    path = _write(tmp_path, "safetensors", inputs=x * 2 - 1, labels=y)
    with pytest.raises(MalformedArtifactError, match="outside the valid range"):
        load_dataset(path)
    assert load_dataset(path, clip=(-1.0, 1.0)).size == 6


def test_truncated_garbage_and_missing_files(tmp_path: Path) -> None:
    x, y = _xy()
    good = _write(tmp_path, "safetensors", inputs=x, labels=y)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-5])
    with pytest.raises(MalformedArtifactError):
        load_dataset(cut)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(MalformedArtifactError, match="not a readable npz"):
        load_dataset(junk)
    with pytest.raises(MalformedArtifactError, match="cannot open"):
        load_dataset(tmp_path / "absent.safetensors")
    with pytest.raises(MalformedArtifactError, match="larger than"):
        load_dataset(good, max_bytes=10)


def test_pickled_npz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.npz"
    np.savez(path, inputs=np.array([object()], dtype=object), labels=np.zeros(1, dtype=np.int64))
    with pytest.raises(MalformedArtifactError):
        load_dataset(path)


def test_symlinked_dataset_is_refused(tmp_path: Path) -> None:
    x, y = _xy()
    good = _write(tmp_path, "safetensors", inputs=x, labels=y)
    link = tmp_path / "link.safetensors"
    os.symlink(good, link)
    with pytest.raises(MalformedArtifactError, match="cannot open"):
        load_dataset(link)
