"""Shared fixtures: tiny sharded models written with the real safetensors library, throwaway keys, markers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import SignatureAlgorithm
from modelsec.signer import generate_private_key_pem

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("MODELSEC_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus" / "cases"

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.support.fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_guard_left_installed() -> object:
    """A test that installs the runtime guard and fails before its own cleanup must not patch later tests."""
    yield
    hook = sys.modules.get("modelsec.verifier.hook")
    if hook is not None and getattr(hook, "_active", False):
        hook.uninstall()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch

        torch.set_num_threads(1)
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


def write_tiny_model(root: Path, *, shards: int = 2, seed: int = 0) -> Path:
    """A standard Hugging Face sharded layout: shards + index + config + tokenizer files."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {
            f"layers.{i}.weight": rng.standard_normal((8, 16)).astype(np.float32),
            f"layers.{i}.bias": rng.standard_normal((8,)).astype(np.float16),
            f"layers.{i}.ids": np.arange(5, dtype=np.int64),
        }
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.nbytes
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (root / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 16}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "WordLevel"}}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    return root


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-model")


@pytest.fixture(scope="session")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Throwaway key pairs: <alg>.key.pem / <alg>.pub.pem for every algorithm, plus an untrusted P-256."""
    d = tmp_path_factory.mktemp("keys")
    for alg in SignatureAlgorithm:
        private, public = generate_private_key_pem(alg)
        (d / f"{alg.value}.key.pem").write_bytes(private)
        (d / f"{alg.value}.pub.pem").write_bytes(public)
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (d / "other.key.pem").write_bytes(private)
    (d / "other.pub.pem").write_bytes(public)
    return d


def run_cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `modelsec` console script as a user would."""
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"
    return subprocess.run(
        [exe, *map(str, args)], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli
