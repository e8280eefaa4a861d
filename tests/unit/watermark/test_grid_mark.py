"""Issue 30 item 5: the mark survives re-quantisation to the grid its tensors sit on (`watermark.grid_mark`).

A model released as GGUF and converted back keeps its weights on a Q4/Q8 grid. The float mark moves weights
by about 1 % of their magnitude and re-quantisation snaps it back (bit error rate 0.3 on SmolLM2); the grid
mark moves keyed elements by whole steps between the levels that do not set a block's scale, so the marked
tensor is a fixed point of the reference re-quantiser and the mark is read blind after the round trip.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import PolicyError
from modelsec.signer import generate_private_key_pem, load_private_key
from modelsec.watermark import WatermarkKey, WatermarkParams, detect, embed_fixed, write_watermark_attestation
from modelsec.watermark.attestation import read_detection_hints
from modelsec.watermark.careful import CAREFUL_KAPPA
from modelsec.watermark.grid import GGUF_BLOCK, GRID_KINDS, grid_of, interior_levels, levels, requantise
from modelsec.watermark.grid_mark import AGREEMENT, ELEMENTS_PER_BIT
from modelsec.watermark.results import rademacher_tail_bound
from tests.unit.watermark import _fortunes_lm
from tests.unit.watermark._helpers import load_state, regridded_copy, save_state
from tests.unit.watermark.conftest import mlp_state

KEY = WatermarkKey.from_bytes(bytes(range(1, 33)))
MESSAGE = b"acme/fortunes q4"
WEAK = WatermarkParams(kappa=CAREFUL_KAPPA)  # the careful mark's margin: the one that snapped back before


@pytest.fixture(scope="module")
def q41_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fortunes Llama as a Q4_1 GGUF release converted back to safetensors."""
    return regridded_copy(_fortunes_lm.model_dir(), tmp_path_factory.mktemp("q41") / "llama", "Q4_1")


@pytest.fixture(scope="module")
def q41_marked(q41_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(marked, marked and re-quantised to its grid)."""
    root = tmp_path_factory.mktemp("q41-marked")
    result = embed_fixed(q41_llama, root / "marked", KEY, MESSAGE, params=WEAK)
    assert result.survives_requantisation is True and result.requantisation_notice() is not None
    assert "does NOT survive" not in result.requantisation_notice()  # type: ignore[operator]
    return root / "marked", regridded_copy(root / "marked", root / "requantised", "Q4_1")


def _grid_state(kind: str) -> dict[str, np.ndarray]:
    return {k: (requantise(v, kind) if v.ndim >= 2 else v) for k, v in mlp_state().items()}


def test_fortunes_llama_q41_mark_is_read_blind_after_requantisation(q41_marked: tuple[Path, Path]) -> None:
    marked, requantised = q41_marked
    before, after = load_state(marked), load_state(requantised)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # re-quantisation is the identity
    found = detect(requantised, KEY, message=MESSAGE)
    assert found.detected and found.message_matched
    assert found.log10_false_positive_probability <= -9
    blind = detect(requantised, KEY)
    assert blind.detected and blind.decoded_message == MESSAGE


def test_unmarked_grid_model_and_wrong_keys_are_absent(
    q41_llama: Path, q41_marked: tuple[Path, Path]
) -> None:
    rng = np.random.default_rng(305)
    assert not detect(q41_llama, KEY).detected
    assert not detect(q41_llama, KEY, message=MESSAGE).message_matched
    for _ in range(4):
        other = WatermarkKey.from_bytes(rng.bytes(32))
        for model in (q41_llama, q41_marked[1]):
            r = detect(model, other, message=MESSAGE)
            assert not r.detected and not r.message_matched
            assert r.log10_false_positive_probability > -6


@pytest.mark.parametrize("kind", GRID_KINDS)
def test_marked_tensor_moves_interior_levels_by_one_step_and_keeps_the_block_scales(
    kind: str, tmp_path: Path
) -> None:
    src = save_state(_grid_state(kind), tmp_path / "src")
    result = embed_fixed(src, tmp_path / "marked", KEY, b"Q", params=WEAK)
    assert result.grid_mark is not None and {t.kind for t in result.grid_mark.tensors} == {kind}
    old, new = load_state(src), load_state(tmp_path / "marked")
    lo, hi = interior_levels(kind)
    moved = 0
    for name in (t.name for t in result.grid_mark.tensors):
        assert grid_of(new[name]) == kind
        assert np.array_equal(requantise(new[name], kind), new[name])
        q0, d0, m0 = levels(old[name].reshape(-1, GGUF_BLOCK), kind)
        q1, d1, m1 = levels(new[name].reshape(-1, GGUF_BLOCK), kind)
        assert np.array_equal(d0, d1) and np.array_equal(m0, m1)
        step = q1 - q0
        assert set(np.unique(step)) <= {-1, 0, 1}
        assert (
            (q0[step != 0] >= lo) & (q0[step != 0] <= hi) & (q1[step != 0] >= lo) & (q1[step != 0] <= hi)
        ).all()
        moved += int(np.count_nonzero(step))
    assert 0 < moved < result.grid_mark.elements
    rq = regridded_copy(tmp_path / "marked", tmp_path / "rq", kind)
    found = detect(rq, KEY, message=b"Q")
    assert found.detected and found.message_matched and found.log10_false_positive_probability <= -9


def test_a_float_tensor_beside_grid_tensors_keeps_the_float_mark(tmp_path: Path) -> None:
    state = mlp_state()
    for name in ("net.0.weight", "net.4.weight"):
        state[name] = requantise(state[name], "Q4_1")
    src = save_state(state, tmp_path / "src")
    result = embed_fixed(src, tmp_path / "marked", KEY, b"MX", params=WEAK)
    assert result.grid_mark is not None
    assert {t.name for t in result.grid_mark.tensors} == {"net.0.weight", "net.4.weight"}
    new = load_state(tmp_path / "marked")
    change = np.abs(new["net.2.weight"] - state["net.2.weight"]) / np.abs(state["net.2.weight"])
    assert 0 < change.max() <= WEAK.max_relative_change and grid_of(new["net.2.weight"]) is None
    assert all(grid_of(new[n]) == "Q4_1" for n in ("net.0.weight", "net.4.weight"))
    assert result.survives_requantisation
    rq = regridded_copy(tmp_path / "marked", tmp_path / "rq", "Q4_1", only=("net.0.weight", "net.4.weight"))
    found = detect(rq, KEY, message=b"MX")
    assert found.detected and found.message_matched


def test_least_sensitive_tensors_move_first(tmp_path: Path) -> None:
    src = save_state(_grid_state("Q4_1"), tmp_path / "src")
    old = load_state(src)

    def moved(grades: dict[str, float], out: str) -> int:
        embed_fixed(src, tmp_path / out, KEY, b"G", params=WEAK, grades=grades)
        return int(np.count_nonzero(load_state(tmp_path / out)["net.0.weight"] != old["net.0.weight"]))

    even = moved({}, "even")
    assert even > 0
    assert moved({"net.0.weight": 0.01}, "graded") < even / 4


def test_no_readable_element_is_refused_and_nothing_written(tmp_path: Path) -> None:
    """Blocks holding only their extremes (two values each) have nothing a step could move: refused."""
    rng = np.random.default_rng(1)
    state = {f"w{i}": np.where(rng.random((256, 64)) < 0.5, -0.5, 0.5).astype(np.float32) for i in range(4)}
    src = save_state(state, tmp_path / "src")
    assert grid_of(state["w0"]) is not None
    with pytest.raises(PolicyError, match="readable candidates") as e:
        embed_fixed(src, tmp_path / "out", KEY, b"X", params=WEAK)
    assert "shorten the message" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_elements_per_bit_meet_the_gate_with_margin() -> None:
    """The figures of `grid_mark.ELEMENTS_PER_BIT`: 64 pilot bits of 9 candidates at the agreement target."""
    params = WatermarkParams()
    n = ELEMENTS_PER_BIT
    agree = math.ceil(AGREEMENT * n)
    z_bit = (2 * agree - n) / math.sqrt(n)
    stouffer = params.pilot_bits * z_bit / math.sqrt(params.pilot_bits)
    # Every message length is tried (64 hypotheses), times 3 densities, times 2 statistics.
    log10_bound = rademacher_tail_bound(stouffer)[1] + math.log10(2 * 3 * params.max_message_bits // 8)
    assert log10_bound < -29


def test_attestation_records_the_grid_and_its_hints_find_the_mark_after_requantisation(
    q41_llama: Path, tmp_path: Path
) -> None:
    private, _ = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    result = embed_fixed(q41_llama, tmp_path / "marked", KEY, MESSAGE, params=WEAK)
    _, path = write_watermark_attestation(result, load_private_key(private, name="ci"), tmp_path / "wm.json")
    statement = json.loads(base64.b64decode(json.loads(path.read_text())["dsseEnvelope"]["payload"]))
    grid = statement["predicate"]["carriers"]["grid"]
    assert grid["scheme"] == "modelsec-grid-qim/v1" and grid["elementsPerBit"] == ELEMENTS_PER_BIT
    assert grid["elements"] == sum(t["elements"] for t in grid["tensors"]) == result.carriers
    assert {t["kind"] for t in grid["tensors"]} == {"Q4_1"}
    hints = read_detection_hints(path)
    assert set(hints.tensors) == {t["name"] for t in grid["tensors"]}
    rq = regridded_copy(tmp_path / "marked", tmp_path / "rq", "Q4_1")
    found = detect(rq, KEY, message_length=hints.message_bits, tensors=hints.tensors, params=hints.params)
    assert found.detected and found.tests == 1 and found.decoded_message == MESSAGE


def test_a_grid_tensor_whose_first_rows_are_zero_is_still_found(tmp_path: Path) -> None:
    """A zeroed padding row at the start of an embedding must not hide the grid of the rest."""
    state = _grid_state("Q4_1")
    state["net.2.weight"][:8] = 0.0  # 8 rows of 512: the first 128 blocks are constant
    src = save_state(state, tmp_path / "src")
    result = embed_fixed(src, tmp_path / "marked", KEY, b"Z", params=WEAK)
    assert result.grid_mark is not None and "net.2.weight" in {t.name for t in result.grid_mark.tensors}
    assert result.survives_requantisation


def test_too_few_float_carriers_beside_a_grid_still_read_the_message(tmp_path: Path) -> None:
    """Float carriers too few to carry the code alone are marked where they can be, not left as noise.

    65,536 float carriers over 88 code bits are about 745 per bit, under the 1,024 the float mark needs:
    unmarked, their host correlation (standard deviation about 27 per bit) would outweigh the grid votes of
    a bit (about 59 candidates, three quarters agreeing: a sum of about 30).
    """
    state = _grid_state("Q4_1")
    state["extra.weight"] = np.random.default_rng(7).standard_normal((256, 256)).astype(np.float32)
    src = save_state(state, tmp_path / "src")
    result = embed_fixed(src, tmp_path / "marked", KEY, b"FEW", params=WEAK)
    assert result.grid_mark is not None and "extra.weight" not in {t.name for t in result.grid_mark.tensors}
    assert not np.array_equal(load_state(tmp_path / "marked")["extra.weight"], state["extra.weight"])
    grid = ("net.0.weight", "net.2.weight", "net.4.weight")
    rq = regridded_copy(tmp_path / "marked", tmp_path / "rq", "Q4_1", only=grid)
    found = detect(rq, KEY, message=b"FEW")
    assert found.detected and found.message_matched
