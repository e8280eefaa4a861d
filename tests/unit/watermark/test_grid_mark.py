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
from modelsec.watermark.grid_mark import AGREEMENT, ELEMENTS_PER_BIT, GridPlan, find_grids, grid_plans
from modelsec.watermark.io import DirectorySource
from modelsec.watermark.results import rademacher_tail_bound
from modelsec.watermark.spread_spectrum import is_eligible
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


def _plans(model: Path) -> list[GridPlan]:
    """The grid mark's candidate plans of an unmarked grid model under `KEY` and `WEAK`."""
    with DirectorySource(model) as source:
        refs = [r for r in source.tensors() if is_eligible(r.dtype, r.shape, WEAK, r.name)]
        return grid_plans(KEY, refs, find_grids(source, refs), WEAK)


def _grid_state(kind: str) -> dict[str, np.ndarray]:
    return {k: (requantise(v, kind) if v.ndim >= 2 else v) for k, v in mlp_state().items()}


def test_fortunes_llama_q41_mark_is_read_blind_after_requantisation(q41_marked: tuple[Path, Path]) -> None:
    marked, requantised = q41_marked
    before, after = load_state(marked), load_state(requantised)
    # Re-quantisation snaps the float mark back (the grid mark's blocks are checked below).
    assert not all(np.array_equal(before[k], after[k]) for k in before)
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
    for plan in _plans(src):
        name = plan.ref.name
        assert grid_of(new[name]) is None  # the float mark takes the released tensor off its grid
        held = new[name].reshape(-1, GGUF_BLOCK)[plan.blocks]  # the grid mark's blocks stay on it
        assert np.array_equal(requantise(held, kind), held)
        q0, d0, m0 = levels(old[name].reshape(-1, GGUF_BLOCK)[plan.blocks], kind)
        q1, d1, m1 = levels(held, kind)
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
    assert {t.name for t in result.gridded} == {"net.0.weight", "net.4.weight"}
    assert result.survives_requantisation
    rq = regridded_copy(tmp_path / "marked", tmp_path / "rq", "Q4_1", only=("net.0.weight", "net.4.weight"))
    found = detect(rq, KEY, message=b"MX")
    assert found.detected and found.message_matched


def test_least_sensitive_tensors_move_first(tmp_path: Path) -> None:
    src = save_state(_grid_state("Q4_1"), tmp_path / "src")
    old = load_state(src)

    (plan,) = [p for p in _plans(src) if p.ref.name == "net.0.weight"]

    def moved(grades: dict[str, float], out: str) -> int:
        embed_fixed(src, tmp_path / out, KEY, b"G", params=WEAK, grades=grades)
        new = load_state(tmp_path / out)["net.0.weight"].reshape(-1, GGUF_BLOCK)[plan.blocks]
        return int(np.count_nonzero(new != old["net.0.weight"].reshape(-1, GGUF_BLOCK)[plan.blocks]))

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
    # The float carriers of the same tensors come on top of the grid candidates.
    assert grid["elements"] == sum(t["elements"] for t in grid["tensors"]) < result.carriers
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


# --- both marks on a grid tensor (issue 30: the float mark AND the grid mark) -------------------------------


def _attacked_copy(src: Path, dst: Path, attack: str) -> Path:
    """A copy of `src` with every matrix attacked: `noise` (0.05 x RMS), `int8` (per-channel round trip) or
    `bf16` (stored as BF16, as a cast release would be)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from tests.unit.watermark._helpers import gaussian_noise, quant_int8

    torch.set_num_threads(1)
    state = load_state(src)
    if attack == "noise":
        state = gaussian_noise(state, 0.05)
    elif attack == "int8":
        state = quant_int8(state)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    if attack == "bf16":
        tensors = {k: (t.to(torch.bfloat16) if t.is_floating_point() else t) for k, t in tensors.items()}
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("attack", ["released", "requantised", "noise", "int8", "bf16"])
def test_grid_model_mark_survives_requantisation_and_the_float_attacks(
    attack: str, q41_llama: Path, q41_marked: tuple[Path, Path], tmp_path: Path
) -> None:
    """A grid model carries both marks: re-quantised it is read through the grid votes, otherwise (noise,
    int8, a bf16 release) through the float carriers, which the grid mark alone did not survive."""
    marked, requantised = q41_marked
    suspect = {"released": marked, "requantised": requantised}.get(attack) or _attacked_copy(
        marked, tmp_path / attack, attack
    )
    found = detect(suspect, KEY)
    assert found.detected and found.decoded_message == MESSAGE
    assert found.log10_false_positive_probability <= -9
    assert detect(suspect, KEY, message=MESSAGE).message_matched
    rng = np.random.default_rng(30)
    for _ in range(2):
        other = detect(suspect, WatermarkKey.from_bytes(rng.bytes(32)), message=MESSAGE)
        assert not other.detected and not other.message_matched
    if attack not in ("released", "requantised"):
        unmarked = _attacked_copy(q41_llama, tmp_path / f"{attack}-unmarked", attack)
        assert not detect(unmarked, KEY).detected


def test_grid_blocks_of_a_marked_tensor_requantise_to_themselves(
    q41_llama: Path, q41_marked: tuple[Path, Path]
) -> None:
    """Every 32-element block holding a grid candidate is back on the grid (original values plus the grid
    moves), so re-quantising it is the identity; the float mark moved other blocks of the same tensors."""
    marked, requantised = q41_marked
    old, new, rq = load_state(q41_llama), load_state(marked), load_state(requantised)
    assert all(grid_of(v) is None for v in new.values() if v.ndim >= 2)  # the release is off its grid
    plans = _plans(q41_llama)
    assert plans
    float_moved = 0
    for plan in plans:
        name = plan.ref.name
        blocks_new = new[name].reshape(-1, GGUF_BLOCK)
        held = blocks_new[plan.blocks]
        assert np.array_equal(requantise(held, plan.kind), held)
        assert np.array_equal(rq[name].reshape(-1, GGUF_BLOCK)[plan.blocks], held)
        other = np.setdiff1d(np.arange(blocks_new.shape[0]), plan.blocks)
        float_moved += int((blocks_new[other] != old[name].reshape(-1, GGUF_BLOCK)[other]).any(axis=1).sum())
    assert float_moved > 0


def test_float_mark_on_a_grid_model_reaches_its_margin_without_the_grid_blocks(
    q41_marked: tuple[Path, Path],
) -> None:
    """About a third of the fortunes Llama's float carriers lie in grid-mark blocks, which keep their grid
    values: pass 1 solves the strengths without them (else some bits end below zero), and `detect` on the
    release reads every bit at the margin."""
    marked, _ = q41_marked
    found = detect(marked, KEY, message=MESSAGE)
    assert found.detected and found.message_matched
    assert found.min_margin >= WEAK.kappa


def test_a_grid_tensor_graded_zero_stays_on_its_grid_and_embed_reports_what_detect_reads(
    tmp_path: Path,
) -> None:
    """A tensor graded 0 takes no float move and stays on its grid: it is still read through
    its grid votes, the others through their float carriers, and the embed-time result says so."""
    src = save_state(_grid_state("Q4_1"), tmp_path / "src")
    result = embed_fixed(src, tmp_path / "marked", KEY, b"GD", params=WEAK, grades={"net.0.weight": 0.0})
    new = load_state(tmp_path / "marked")
    assert grid_of(new["net.0.weight"]) == "Q4_1" and grid_of(new["net.2.weight"]) is None
    found = detect(tmp_path / "marked", KEY, message=b"GD")
    assert found.detected and found.message_matched
    assert result.detection.min_margin == pytest.approx(found.min_margin)
    assert result.detection.confidence == pytest.approx(found.confidence)
