"""Fixtures of the watermark unit tests: a random MLP-shaped model (no training) and a fixed key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelsec.watermark import WatermarkKey


def mlp_state(seed: int = 0, hidden: int = 512) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "net.0.weight": (rng.standard_normal((hidden, 64)) * 0.12).astype(np.float32),
        "net.0.bias": (rng.standard_normal(hidden) * 0.01).astype(np.float32),
        "net.2.weight": (rng.standard_normal((hidden, hidden)) * 0.04).astype(np.float32),
        "net.2.bias": (rng.standard_normal(hidden) * 0.01).astype(np.float32),
        "net.4.weight": (rng.standard_normal((10, hidden)) * 0.04).astype(np.float32),
        "net.4.bias": np.zeros(10, dtype=np.float32),
    }


@pytest.fixture
def wm_key() -> WatermarkKey:
    return WatermarkKey.from_bytes(bytes(range(1, 33)))


@pytest.fixture
def toy_model(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    root = tmp_path / "toy"
    root.mkdir()
    save_file(mlp_state(), str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text("{}")
    return root
