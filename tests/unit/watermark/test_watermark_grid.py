"""Issue 30 item 5: a carrier tensor on a quantisation grid (dequantised GGUF) is reported by `embed`.

A float mark moves weights by about 1 % of their magnitude, mostly below one 4-bit step, so re-quantising the
marked model to its own grid (what re-releasing it as GGUF does) snaps it back. F32/F64 tensors on a grid
therefore carry the grid mark (`test_grid_mark.py`), which survives; F16/BF16 tensors on a grid (rare: a
dequantised value is seldom representable) still carry the float mark. `embed` measures the round trip on
the written weights and says whether the mark survives it, naming the grid; the tests check the statement
against `detect` on the re-quantised model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelsec.watermark import WatermarkKey, WatermarkParams, detect, embed_fixed
from modelsec.watermark.grid import GRID_KINDS, grid_of, requantise
from tests.conftest import run_cli
from tests.unit.watermark._helpers import load_state, save_state
from tests.unit.watermark.conftest import mlp_state

KEY = WatermarkKey.from_bytes(bytes(range(1, 33)))


def _gridded(kind: str, tmp_path: Path, dtype: str = "F32") -> Path:
    if dtype == "F32":
        state = {k: (requantise(v, kind) if v.ndim >= 2 else v) for k, v in mlp_state().items()}
    else:
        # Q4_0 with a power-of-two scale: every grid value is exact in float16.
        assert kind == "Q4_0" and dtype == "F16"
        rng = np.random.default_rng(0)
        state = {}
        for k, v in mlp_state().items():
            if v.ndim < 2:
                continue
            level = rng.integers(-7, 8, size=v.shape).reshape(-1, 32)
            level[:, 0] = -8
            state[k] = (level * 2.0**-5).astype(np.float16).reshape(v.shape)
    return save_state(state, tmp_path / f"model-{kind}-{dtype}")


@pytest.mark.parametrize("kind", GRID_KINDS)
def test_grid_found_and_requantisation_is_idempotent(kind: str) -> None:
    w = mlp_state()["net.2.weight"]
    assert grid_of(w) is None
    on = requantise(w, kind)
    assert grid_of(on) == kind
    assert np.array_equal(requantise(on, kind), on)
    # One weight moved by a tenth of a step leaves the grid.
    off = on.copy()
    off.flat[5] += np.float32(0.1) * float(np.abs(np.diff(np.unique(on.flat[:32]))).min())
    assert grid_of(off) is None


@pytest.mark.parametrize(
    ("kind", "dtype", "kappa", "survives"),
    [
        ("Q4_1", "F32", 1.0, True),
        ("Q4_1", "F32", 3.0, True),
        ("Q8_0", "F32", 1.0, True),
        # A float mark at a low margin on a 4-bit grid: error correction reads kappa 1 back, not 0.5.
        ("Q4_0", "F16", 0.5, False),
    ],
)
def test_embed_says_whether_the_mark_survives_requantisation(
    kind: str, dtype: str, kappa: float, survives: bool, tmp_path: Path
) -> None:
    src = _gridded(kind, tmp_path, dtype)
    result = embed_fixed(src, tmp_path / "marked", KEY, b"Q4", params=WatermarkParams(kappa=kappa))
    assert {g.name for g in result.gridded} == {t.name for t in result.tensors}
    assert {g.kind for g in result.gridded} == {kind} and result.gridded_carriers == result.carriers
    assert result.survives_requantisation is survives
    notice = result.requantisation_notice()
    assert notice is not None and kind in notice
    assert ("does NOT survive" in notice) is not survives
    assert (result.grid_mark is not None) is survives  # F32 tensors carry the grid mark, F16 ones cannot
    assert detect(tmp_path / "marked", KEY, message=b"Q4").detected

    # The statement is what `detect` finds once the marked model is re-quantised to its grid.
    marked = load_state(tmp_path / "marked")
    rq = {k: (requantise(v, kind).astype(v.dtype) if v.ndim >= 2 else v) for k, v in marked.items()}
    save_state(rq, tmp_path / "rq")
    after = detect(tmp_path / "rq", KEY, message=b"Q4")
    assert (after.detected and after.message_matched) is survives
    # The embed-time figures come from float32 grid values, detect's from the stored copy: verdicts agree.
    assert result.requantised is not None
    assert (result.requantised.detected, result.requantised.message_matched) == (
        after.detected,
        after.message_matched,
    )


def test_no_grid_no_notice(tmp_path: Path) -> None:
    plain = embed_fixed(save_state(mlp_state(), tmp_path / "plain"), tmp_path / "marked", KEY, b"Q4")
    assert plain.gridded == () and plain.requantised is None and plain.requantisation_notice() is None


@pytest.mark.parametrize(
    ("kind", "dtype", "kappa", "warns"), [("Q4_1", "F32", "1", False), ("Q4_0", "F16", "0.5", True)]
)
def test_cli_says_whether_the_mark_survives(
    kind: str, dtype: str, kappa: str, warns: bool, tmp_path: Path
) -> None:
    src = _gridded(kind, tmp_path, dtype)
    key = tmp_path / "wm.key"
    key.write_text(bytes(range(1, 33)).hex() + "\n")
    key.chmod(0o600)
    r = run_cli(
        "watermark", "embed", src, "--watermark-key", key, "-m", "Q4", "-o", tmp_path / "o", "--kappa", kappa
    )
    assert r.returncode == 0, r.stderr
    assert kind in r.stdout
    assert ("WARNING:" in r.stdout) is warns
    assert ("does NOT survive re-quantisation" in r.stdout) is warns
    assert ("the mark survives re-quantisation" in r.stdout) is not warns
