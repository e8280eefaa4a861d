"""Issue 30 item 5: a carrier tensor on a quantisation grid (dequantised GGUF) is reported by `embed`.

A weak mark moves weights by about 1 % of their magnitude, mostly below one 4-bit step, so re-quantising the
marked model to its own grid (what re-releasing it as GGUF does) snaps it back. `embed` measures the round
trip on the written weights and says whether the mark survives it, naming the grid; the tests check the
statement against `detect` on the re-quantised model.
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


def _gridded(kind: str, tmp_path: Path) -> Path:
    state = {k: (requantise(v, kind) if v.ndim >= 2 else v) for k, v in mlp_state().items()}
    return save_state(state, tmp_path / f"model-{kind}")


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
    ("kind", "kappa", "survives"), [("Q4_1", 1.0, False), ("Q4_1", 3.0, True), ("Q8_0", 1.0, True)]
)
def test_embed_says_whether_the_mark_survives_requantisation(
    kind: str, kappa: float, survives: bool, tmp_path: Path
) -> None:
    src = _gridded(kind, tmp_path)
    # Uncoded (`none`): error correction reads the kappa-1 Q4_1 message back (test_cli_warns: kappa 0.5).
    params = WatermarkParams(kappa=kappa, message_code="none")
    result = embed_fixed(src, tmp_path / "marked", KEY, b"Q4", params=params)
    assert {g.name for g in result.gridded} == {t.name for t in result.tensors}
    assert {g.kind for g in result.gridded} == {kind} and result.gridded_carriers == result.carriers
    assert result.survives_requantisation is survives
    notice = result.requantisation_notice()
    assert notice is not None and kind in notice
    assert ("does NOT survive" in notice) is not survives
    assert detect(tmp_path / "marked", KEY, message=b"Q4").detected

    # The statement is what `detect` finds once the marked model is re-quantised to its grid.
    marked = load_state(tmp_path / "marked")
    save_state({k: (requantise(v, kind) if v.ndim >= 2 else v) for k, v in marked.items()}, tmp_path / "rq")
    after = detect(tmp_path / "rq", KEY, message=b"Q4")
    assert (after.detected and after.message_matched) is survives
    assert result.requantised is not None and after.bit_error_rate == result.requantised.bit_error_rate


def test_no_grid_no_notice(tmp_path: Path) -> None:
    plain = embed_fixed(save_state(mlp_state(), tmp_path / "plain"), tmp_path / "marked", KEY, b"Q4")
    assert plain.gridded == () and plain.requantised is None and plain.requantisation_notice() is None


def test_cli_warns(tmp_path: Path) -> None:
    src = _gridded("Q4_1", tmp_path)
    key = tmp_path / "wm.key"
    key.write_text(bytes(range(1, 33)).hex() + "\n")
    key.chmod(0o600)
    r = run_cli(
        "watermark", "embed", src, "--watermark-key", key, "-m", "Q4", "-o", tmp_path / "o", "--kappa", "0.5"
    )
    assert r.returncode == 0, r.stderr
    assert "WARNING:" in r.stdout and "Q4_1" in r.stdout and "does NOT survive re-quantisation" in r.stdout
