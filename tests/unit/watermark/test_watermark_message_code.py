"""Error correction of the message (issue 30): wrong code bits are corrected, garbage is reported as not
decoded, and marks made without the code (before it existed) still read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelsec.watermark import WatermarkKey, WatermarkParams, detect, embed_model
from modelsec.watermark.attestation import detection_hints
from modelsec.watermark.message_code import (
    DEFAULT_MESSAGE_CODE,
    LEGACY_MESSAGE_CODE,
    coded_length,
    decode,
    encode,
)
from modelsec.watermark.spread_spectrum import DEFAULT_CODE_MARGIN, carrier_plan
from tests.unit.watermark._helpers import gaussian_noise

MSG = b"ACME-clf"
LEGACY = WatermarkParams(message_code=LEGACY_MESSAGE_CODE)


def _load(root: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(root / "model.safetensors"))


def _flip_code_bits(
    weights: dict[str, np.ndarray], key: WatermarkKey, bits: list[int], n_code: int, density_log2: int
) -> dict[str, np.ndarray]:
    """Negate every carrier of the given code bits: each such bit is then read with the wrong sign at the
    full margin, the worst a bit error can be (`c_b -> -c_b`, energies and tensor RMS unchanged)."""
    params = WatermarkParams()
    out = {name: w.copy() for name, w in weights.items()}
    for name, w in out.items():
        if w.ndim < 2 or w.size < params.min_tensor_elements:
            continue
        plan = carrier_plan(key, name, w.shape, density_log2, params)
        flat = w.reshape(-1, params.block_size)
        chosen = plan.blocks[np.isin(plan.slots % np.uint32(n_code), bits)]
        flat[chosen] *= -1
    return out


@pytest.fixture
def coded(toy_model: Path, tmp_path: Path, wm_key: WatermarkKey) -> Path:
    result = embed_model(toy_model, tmp_path / "coded", wm_key, MSG)
    assert result.params.message_code == DEFAULT_MESSAGE_CODE
    assert result.code_bits == 64 + coded_length(64, DEFAULT_MESSAGE_CODE) == 64 + 2 * (64 + 38)
    assert result.detection.message_matched and result.detection.message_decoded
    return tmp_path / "coded"


@pytest.fixture
def legacy(toy_model: Path, tmp_path: Path, wm_key: WatermarkKey) -> Path:
    result = embed_model(toy_model, tmp_path / "legacy", wm_key, MSG, params=LEGACY)
    assert result.code_bits == 64 + 64 and result.detection.message_matched
    return tmp_path / "legacy"


def test_wrong_code_bits_are_corrected_with_the_code_and_not_without(
    coded: Path, legacy: Path, wm_key: WatermarkKey
) -> None:
    k = detect(coded, wm_key).density_log2
    # Four message code bits read wrong, at full margin, in each mark.
    n_coded = 64 + coded_length(64, DEFAULT_MESSAGE_CODE)
    attacked = _flip_code_bits(_load(coded), wm_key, [70, 101, 150, 230], n_coded, k)
    r = detect(attacked, wm_key, message=MSG)
    assert r.detected and r.message_code == DEFAULT_MESSAGE_CODE
    assert r.code_bit_error_rate == pytest.approx(4 / (n_coded - 64))  # the channel: 4 wrong code bits
    assert r.message_decoded is True and r.message_matched is True
    assert (r.message_matches, r.message_bit_error_rate) == (64, 0.0)
    blind = detect(attacked, wm_key)
    assert blind.detected and blind.decoded_message == MSG and blind.message_decoded is True

    old = _flip_code_bits(_load(legacy), wm_key, [70, 101, 110, 120], 128, k)
    r_old = detect(old, wm_key, message=MSG)
    assert r_old.detected and r_old.message_code == LEGACY_MESSAGE_CODE
    assert r_old.message_matched is False and r_old.message_matches == 60
    assert detect(old, wm_key).decoded_message != MSG  # read wrong, and nothing can tell


def test_heavy_noise_reads_the_message_with_the_code(coded: Path, wm_key: WatermarkKey) -> None:
    """Additive noise of 1.5 x each tensor's RMS: several code bits wrong, the message still read."""
    rng = np.random.default_rng(7)
    noisy = {
        name: (w + rng.standard_normal(w.shape).astype(np.float32) * 1.5 * float(np.sqrt(np.mean(w * w))))
        for name, w in _load(coded).items()
    }
    r = detect(noisy, wm_key, message=MSG)
    assert r.detected and r.code_bit_error_rate is not None and r.code_bit_error_rate > 0
    assert r.message_decoded is True and r.message_matched is True


def test_a_garbage_message_is_reported_as_not_decoded(coded: Path, wm_key: WatermarkKey) -> None:
    k = detect(coded, wm_key).density_log2
    n_coded = 64 + coded_length(64, DEFAULT_MESSAGE_CODE)
    rng = np.random.default_rng(3)
    wrong = sorted(int(b) for b in rng.choice(np.arange(64, n_coded), 60, replace=False))
    attacked = _flip_code_bits(_load(coded), wm_key, wrong, n_coded, k)
    for r in (detect(attacked, wm_key), detect(attacked, wm_key, message_length=64)):
        assert r.detected and r.message_bits == 64  # present: the pilot is intact
        assert r.message_decoded is False and r.decoded_message is None  # and no message is made up
        assert r.to_json()["messageDecoded"] is False and r.to_json()["decodedMessageHex"] is None
    given = detect(attacked, wm_key, message=MSG)
    assert given.detected and given.message_decoded is False and given.message_matched is False


def test_cli_says_the_message_was_not_decoded(
    coded: Path, tmp_path: Path, wm_key: WatermarkKey, cli: Callable[..., Any]
) -> None:
    from safetensors.numpy import save_file

    k = detect(coded, wm_key).density_log2
    n_coded = 64 + coded_length(64, DEFAULT_MESSAGE_CODE)
    attacked = _flip_code_bits(_load(coded), wm_key, list(range(64, n_coded, 3)), n_coded, k)
    suspect = tmp_path / "suspect"
    suspect.mkdir()
    save_file(attacked, str(suspect / "model.safetensors"))
    key = tmp_path / "wm.key"
    key.write_text(bytes(range(1, 33)).hex())
    key.chmod(0o600)
    r = cli("watermark", "detect", suspect, "--watermark-key", key)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("DETECTED") and "message NOT DECODED" in r.stdout and "hex:" not in r.stdout
    r = cli("watermark", "detect", suspect, "--watermark-key", key, "--message", MSG.decode(), "--json")
    assert r.returncode == 1 and "could not be decoded" in r.stdout + r.stderr


def test_old_marks_still_read_blind_and_from_their_attestation(legacy: Path, wm_key: WatermarkKey) -> None:
    blind = detect(legacy, wm_key)
    assert blind.detected and blind.decoded_message == MSG
    assert blind.message_code == LEGACY_MESSAGE_CODE and blind.message_decoded is None
    assert blind.tests == 2 * 64  # 64 lengths under each code
    full = detect(legacy, wm_key, message=MSG)
    assert full.message_matched is True and full.message_code == LEGACY_MESSAGE_CODE

    # An attestation from before the code records no messageCode: its hints mean `none`.
    predicate = json.loads(
        json.dumps(
            {
                "scheme": {"name": "modelsec-ss-mult/v1"},
                "parameters": {
                    **{k: v for k, v in LEGACY.to_json().items() if k not in ("messageCode", "codeMargin")},
                    "densityLog2": blind.density_log2,
                    "codeBits": 128,
                    "messageBits": 64,
                },
                "keyCommitment": {"value": wm_key.commitment()},
                "carriers": {"tensors": [{"name": "net.2.weight"}]},
            }
        )
    )
    hints = detection_hints(predicate, what="old.sig")
    assert hints.params.message_code == LEGACY_MESSAGE_CODE
    assert hints.params.code_margin == 1.0  # every bit at kappa, as such marks were made
    hinted = detect(legacy, wm_key, params=hints.params, message_length=hints.message_bits)
    assert hinted.detected and hinted.tests == 1 and hinted.decoded_message == MSG


def test_unknown_recorded_code_is_refused(wm_key: WatermarkKey) -> None:
    from modelsec.errors import PolicyError

    with pytest.raises(PolicyError, match="message_code must be one of"):
        WatermarkParams(message_code="turbo")


def test_codec_corrects_soft_errors_and_flags_garbage() -> None:
    rng = np.random.default_rng(11)
    for length in (8, 64, 512):
        bits = [int(b) for b in rng.integers(0, 2, length)]
        word = np.asarray(encode(bits, DEFAULT_MESSAGE_CODE), dtype=np.float64) * 2 - 1
        assert word.size == coded_length(length, DEFAULT_MESSAGE_CODE)
        soft = 3.0 * word
        soft[[5, 40, 77]] *= -1  # three code bits wrong at full margin
        soft[[9, 60]] = 0.0  # two erased (no carriers)
        found = decode(soft, length, DEFAULT_MESSAGE_CODE)
        assert found.bits == bits and found.valid is True and found.code_bit_errors == 5
        garbage = [decode(rng.standard_normal(word.size), length, DEFAULT_MESSAGE_CODE) for _ in range(50)]
        assert not any(g.valid for g in garbage)


def test_a_model_too_small_for_the_code_gets_the_message_uncoded_and_says_so(
    toy_model: Path, tmp_path: Path, wm_key: WatermarkKey
) -> None:
    from modelsec.errors import PolicyError

    long_message = b"ACME-clf-v2"  # 88 bits: 64 + 88 fit the toy model's code bits, 64 + 2 x 126 do not
    with pytest.raises(PolicyError, match=r"message too long for capacity: .*crc32-conv7"):
        embed_model(
            toy_model, tmp_path / "strict", wm_key, long_message,
            params=WatermarkParams(message_code=DEFAULT_MESSAGE_CODE),
        )  # fmt: skip
    assert not (tmp_path / "strict").exists()
    result = embed_model(toy_model, tmp_path / "auto", wm_key, long_message)
    assert result.params.message_code == LEGACY_MESSAGE_CODE and result.code_bits == 64 + 88
    assert result.params.to_json()["messageCode"] == LEGACY_MESSAGE_CODE  # what the attestation records
    found = detect(tmp_path / "auto", wm_key)
    assert found.decoded_message == long_message and found.message_code == LEGACY_MESSAGE_CODE


def test_the_coded_mark_costs_no_more_than_the_uncoded_one_and_still_reads_through_noise(
    toy_model: Path, tmp_path: Path, wm_key: WatermarkKey
) -> None:
    """The code bits sit at `code_margin * kappa` (the pilot at kappa): at kappa 3 the error-corrected mark
    changes the weights no more than the uncoded one, and after noise of 1.0 x RMS it still reads its
    message where the uncoded mark does."""
    coded = embed_model(toy_model, tmp_path / "coded", wm_key, MSG)
    uncoded = embed_model(toy_model, tmp_path / "uncoded", wm_key, MSG, params=LEGACY)
    assert coded.params.message_code == DEFAULT_MESSAGE_CODE
    assert coded.relative_l2_change <= uncoded.relative_l2_change
    assert coded.mean_relative_change <= uncoded.mean_relative_change
    assert coded.params.code_margin == DEFAULT_CODE_MARGIN
    # Presence keeps its margin: every pilot bit at kappa, with the same evidence as the uncoded mark.
    assert coded.detection.min_margin >= coded.params.kappa
    assert coded.detection.message_matched and coded.detection.message_decoded
    for seed in range(3):
        for root in (tmp_path / "coded", tmp_path / "uncoded"):
            r = detect(gaussian_noise(_load(root), 1.0, seed=seed), wm_key, message=MSG)
            assert r.detected and r.message_matched, (root.name, seed)


def test_the_code_margin_is_recorded_and_old_records_mean_full_margin(
    toy_model: Path, tmp_path: Path, wm_key: WatermarkKey
) -> None:
    from modelsec.attestations.predicates.watermark import parse_recorded_parameters
    from modelsec.errors import MalformedArtifactError, PolicyError

    result = embed_model(toy_model, tmp_path / "m", wm_key, MSG, params=WatermarkParams(code_margin=0.6))
    assert result.params.to_json()["codeMargin"] == 0.6
    predicate: dict[str, Any] = {
        "scheme": {"name": "modelsec-ss-mult/v1"},
        "parameters": {**result.params.to_json(), "densityLog2": result.density_log2, "messageBits": 64},
        "keyCommitment": {"value": wm_key.commitment()},
        "carriers": {"tensors": [{"name": t.name} for t in result.tensors]},
    }
    hints = detection_hints(predicate, what="m.sig")
    assert hints.params.code_margin == 0.6 and hints.params.message_code == DEFAULT_MESSAGE_CODE
    found = detect(tmp_path / "m", wm_key, params=hints.params, message_length=hints.message_bits)
    assert found.detected and found.decoded_message == MSG
    for bad in (1.5, -0.1, "half", True):
        predicate["parameters"]["codeMargin"] = bad
        with pytest.raises(MalformedArtifactError, match="codeMargin"):
            parse_recorded_parameters(predicate, what="m.sig")
    for bad_margin in (0.0, 1.01, float("nan")):
        with pytest.raises(PolicyError, match="code_margin must be in"):
            WatermarkParams(code_margin=bad_margin)
