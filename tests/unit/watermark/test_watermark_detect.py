"""Blind detection: modes, statistics, wrong keys, unmarked models, thresholds, scale and layout changes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from modelsec.errors import PolicyError
from modelsec.watermark import (
    ArraySource,
    DetectionThresholds,
    WatermarkKey,
    WatermarkParams,
    binomial_tail,
    detect,
    embed_model,
    rademacher_tail_bound,
)

from .conftest import mlp_state

MSG = b"ACME-clf"


@pytest.fixture
def marked(toy_model: Path, tmp_path: Path, wm_key: WatermarkKey) -> Path:
    result = embed_model(toy_model, tmp_path / "marked", wm_key, MSG)
    assert result.detection.detected and result.detection.bit_error_rate == 0
    return tmp_path / "marked"


def _load(root: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(root / "model.safetensors"))


def test_three_modes_agree_and_report_exact_statistics(marked: Path, wm_key: WatermarkKey) -> None:
    blind = detect(marked, wm_key)
    length = detect(marked, wm_key, message_length=64)
    full = detect(marked, wm_key, message=MSG)
    assert blind.mode == "blind" and length.mode == "length" and full.mode == "message"
    assert blind.detected and length.detected and full.detected
    assert blind.decoded_message == length.decoded_message == full.decoded_message == MSG
    # blind: 64 pilot bits, the message length searched over 64 candidates under each of the two message
    # codes (Bonferroni factor 128).
    assert (blind.bits, blind.bit_matches, blind.tests, blind.message_bits) == (64, 64, 128, 64)
    # The bound: 2 (two statistics) x 128 hypotheses x the smaller of the Stouffer bound and the binomial
    # tail.
    single = min(rademacher_tail_bound(blind.z_score)[1], binomial_tail(64, 64)[1])
    assert blind.log10_false_positive_probability == pytest.approx(math.log10(2 * 128) + single)
    assert blind.binomial_false_positive_probability == 128 * 2.0**-64
    # Stouffer's Z over 64 pilot bits is at least sqrt(64) times the smallest margin.
    assert blind.z_score >= 8 * blind.min_margin >= 8 * 2.9
    assert length.tests == 2  # the length given, the code not: both codes
    # With the message given, presence is the blind verdict itself (same bits, statistics and Bonferroni
    # factor); the message is a second verdict at its own length.
    presence = ("detected", "bits", "bit_matches", "tests", "false_positive_probability", "confidence")
    assert [getattr(full, f) for f in presence] == [getattr(blind, f) for f in presence]
    assert full.binomial_false_positive_probability == 128 * binomial_tail(64, 64)[0]
    assert (full.message_bits, full.message_matches, full.message_matched) == (64, 64, True)
    assert blind.message_matched is None and length.message_matched is None
    assert full.confidence == 1.0 and full.bit_error_rate == 0.0 and full.message_bit_error_rate == 0.0
    assert full.min_margin >= 2.9
    json_view = full.to_json()
    assert json_view["decodedMessageHex"] == MSG.hex() and json_view["bitMatches"] == 64
    assert json_view["messageMatched"] is True and blind.to_json()["messageMatched"] is None


def test_a_wrong_message_is_present_but_not_matched(marked: Path, wm_key: WatermarkKey) -> None:
    """User trial 2: a message two bits off, or all zeros, is neither 'detected' nor 'not detected'."""
    blind = detect(marked, wm_key)
    near = bytes([MSG[0] ^ 0b11]) + MSG[1:]  # two message bits differ
    for wrong, differ in ((near, 2), (bytes(len(MSG)), None)):
        r = detect(marked, wm_key, message=wrong)
        assert r.detected and r.false_positive_probability == blind.false_positive_probability
        assert r.message_matched is False and r.decoded_message == MSG
        assert r.message_bits == 64 and r.message_matches is not None
        if differ is not None:
            assert r.message_matches == 64 - differ and r.message_bit_error_rate == differ / 64
    # Another length: the mark is present, its message is not this one (whatever its bits).
    for other_length in (MSG[:4], MSG + b"!"):
        r = detect(marked, wm_key, message=other_length)
        assert r.detected and r.message_matched is False and r.decoded_message == MSG


def test_wrong_key_and_unmarked_model_are_not_detected(
    toy_model: Path, marked: Path, wm_key: WatermarkKey
) -> None:
    other = WatermarkKey.from_bytes(bytes(range(2, 34)))
    for model, key in ((marked, other), (toy_model, wm_key)):
        for kwargs in ({}, {"message": MSG}):
            result = detect(model, key, **kwargs)  # type: ignore[arg-type]
            assert not result.detected and not result.message_matched
            assert result.log10_false_positive_probability > -6
            assert result.confidence < 0.92
    blind = detect(toy_model, wm_key)
    assert blind.message_bits is None and blind.decoded_message is None
    assert blind.tests == 2 * 2 * 64  # densities k0 and k0 + 1, 64 message lengths under 2 codes each


def test_thresholds_are_configurable(marked: Path, wm_key: WatermarkKey) -> None:
    found = detect(marked, wm_key)
    # A bound below the one reached: not present, and then the message verdict is False too.
    strict = DetectionThresholds(max_false_positive=10 ** (found.log10_false_positive_probability - 1))
    too_strict = detect(marked, wm_key, message=MSG, thresholds=strict)
    assert not too_strict.detected and too_strict.message_matched is False
    loose = DetectionThresholds(min_confidence=0.5, max_false_positive=1e-3)
    assert detect(marked, wm_key, thresholds=loose).detected


def test_bad_message_arguments(marked: Path, wm_key: WatermarkKey) -> None:
    for kwargs in (
        {"message_length": 12},
        {"message_length": 0},
        {"message_length": 1024},
        {"message": b""},
        {"message": bytes(65)},
    ):
        with pytest.raises(PolicyError):
            detect(marked, wm_key, **kwargs)


def test_in_memory_arrays_give_the_same_result(marked: Path, wm_key: WatermarkKey) -> None:
    from_dir = detect(marked, wm_key, message=MSG)
    from_arrays = detect(_load(marked), wm_key, message=MSG)
    from_source = detect(ArraySource(_load(marked)), wm_key, message=MSG)
    assert (
        from_dir.min_margin == pytest.approx(from_arrays.min_margin) == pytest.approx(from_source.min_margin)
    )


def test_whole_tensor_rescaling_and_an_added_tensor_do_not_hide_the_mark(
    marked: Path, wm_key: WatermarkKey
) -> None:
    state = _load(marked)
    state["net.2.weight"] = state["net.2.weight"] * 37.0
    state["net.0.weight"] = state["net.0.weight"] * 0.01
    scaled = detect(state, wm_key, message=MSG)
    assert scaled.bit_error_rate == 0 and scaled.min_margin > 2.9
    # An added all-zero tensor doubles the eligible size: the header-derived density is off by one, and the
    # neighbouring density is found (its extra hypothesis counted in the Bonferroni factor).
    state = _load(marked)
    state["dummy.weight"] = np.zeros((1024, 4096), dtype=np.float32)
    padded = detect(state, wm_key)
    assert padded.detected and padded.density_log2 == 0 and padded.tests == 2 * 2 * 64


def test_restricting_to_the_attested_tensors_defeats_dilution(marked: Path, wm_key: WatermarkKey) -> None:
    # A large unmarked random tensor dilutes every bit's correlation (a documented blind-detection limit);
    # reading only the attested carrier tensors at the attested density removes it again.
    state = _load(marked)
    state["dummy.weight"] = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    assert not detect(state, wm_key, message=MSG).detected
    attested = ["net.0.weight", "net.2.weight", "net.4.weight"]
    found = detect(state, wm_key, message=MSG, tensors=attested, params=WatermarkParams(density_log2=0))
    assert found.detected and found.bit_error_rate == 0


def test_false_positive_probability_is_calibrated_on_unmarked_models(wm_key: WatermarkKey) -> None:
    # Under the null hypothesis the extracted bits are fair coins: over 40 unmarked random models the
    # pilot match counts have mean 32 and variance 16 (Binomial(64, 1/2)), and no FPP falls below 1e-6.
    matches = []
    for seed in range(40):
        state = mlp_state(seed=100 + seed, hidden=128)
        one = WatermarkParams(density_log2=0, message_code="crc32-conv7")  # one hypothesis: length, code
        result = detect(state, wm_key, message_length=64, params=one)
        matches.append(result.pilot_matches)
        assert result.log10_false_positive_probability > -6
    assert abs(np.mean(matches) - 32) < 2.5
    assert 6 < np.var(matches) < 30
