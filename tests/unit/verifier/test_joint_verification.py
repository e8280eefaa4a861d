"""One policy over signatures, watermark and robustness attestations: each missing or failing piece is
refused with a message naming it; everything present is accepted (issue: joint verification)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.errors import AttestationError
from modelsec.policy import Policy, RobustnessRequirement, WatermarkRequirement
from modelsec.signer import load_private_key_file, load_trusted_key_file, sign_model
from modelsec.verifier import verify_attestations, verify_model
from modelsec.verifier.admission import admit
from modelsec.verifier.attestations import GATE_PREDICATE_TYPE, WATERMARK_PREDICATE_TYPE

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def gate_predicate(**changes: Any) -> dict[str, Any]:
    pred: dict[str, Any] = {
        "attack": "pgd-linf",
        "parameters": {"norm": "Linf", "eps": 0.3, "stepSize": 0.01, "steps": 40, "restarts": 1, "seed": 0},
        "dataset": {"digest": {"sha256": "ab" * 32}, "samples": 400},
        "results": {
            "clean": {"correct": 396, "total": 400, "accuracy": 0.99, "wilson95": [0.975, 0.996]},
            "robust": {"correct": 380, "total": 400, "accuracy": 0.95, "wilson95": [0.923, 0.967]},
        },
        "gate": {"metric": "robustAccuracy", "threshold": 0.85, "rule": "point", "verdict": "PASSED"},
        "sanity": {"enabled": True, "checks": [{"name": "eps_zero", "passed": True}]},
        "finishedAt": (NOW - timedelta(days=2)).isoformat().replace("+00:00", "Z"),
    }
    for path, value in changes.items():
        node = pred
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return pred


def watermark_predicate() -> dict[str, Any]:
    return {
        "scheme": {"name": "modelsec-ss-v1"},
        "parameters": {"kappa": 3.0},
        "keyCommitment": {"alg": "hmac-sha256", "value": "00" * 32},
        "messageCommitment": {"alg": "hmac-sha256", "value": "11" * 32},
        "carriers": {"tensors": 3},
        "detection": {"detected": True, "confidence": 1.0, "falsePositiveProbability": 1e-30},
    }


@pytest.fixture
def setup(tiny_model: Path, key_dir: Path) -> dict[str, Any]:
    """A model signed with ECDSA P-256 and SM2, keys with roles, and a policy requiring everything."""
    result = sign_model(
        tiny_model,
        [
            load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
            load_private_key_file(key_dir / "sm2.key.pem"),
        ],
    )
    keys = (
        load_trusted_key_file(
            key_dir / "ecdsa-p256.pub.pem", name="ci-weights", roles=frozenset({"weights"})
        ),
        load_trusted_key_file(key_dir / "sm2.pub.pem", name="ci-sm2", roles=frozenset({"weights"})),
        load_trusted_key_file(key_dir / "ecdsa-p384.pub.pem", name="gate-runner", roles=frozenset({"gate"})),
        load_trusted_key_file(key_dir / "other.pub.pem", name="wm-owner", roles=frozenset({"watermark"})),
    )
    policy = Policy(
        keys=keys,
        require_algorithms=frozenset({SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.SM2}),
        robustness=RobustnessRequirement(min_eps=0.03, min_robust_accuracy=0.85, max_age_seconds=30 * 86400),
        watermark=WatermarkRequirement(),
    )
    signer = {
        "gate": load_private_key_file(key_dir / "ecdsa-p384.key.pem"),
        "watermark": load_private_key_file(key_dir / "other.key.pem"),
    }

    def attest(
        kind: str,
        predicate: dict[str, Any],
        *,
        digest: str | None = None,
        by: str | None = None,
        ptype: str | None = None,
    ) -> bytes:
        statement = Statement(
            (Subject(tiny_model.name, {"sha256": digest or result.root_digest}),),
            ptype or (GATE_PREDICATE_TYPE if kind == "gate" else WATERMARK_PREDICATE_TYPE),
            predicate,
        )
        return sign_statement(statement, signer[by or kind])

    return {"model": tiny_model, "root": result.root_digest, "policy": policy, "attest": attest}


def _bundles(
    s: dict[str, Any],
    *,
    gate: bytes | None = None,
    wm: bytes | None = None,
    drop_sm2: bool = False,
    extra: list[bytes] = (),
) -> list[bytes]:  # type: ignore[assignment]
    model = s["model"]
    out = [(model / "model.sig").read_bytes()]
    if not drop_sm2:
        out.append((model / "model.sm2.sig").read_bytes())
    out.append(gate if gate is not None else s["attest"]("gate", gate_predicate()))
    out.append(wm if wm is not None else s["attest"]("watermark", watermark_predicate()))
    return out + list(extra)


def test_everything_present_is_accepted(setup: dict[str, Any]) -> None:
    verdict = verify_attestations(setup["root"], _bundles(setup), setup["policy"], now=NOW)
    assert verdict.ok, verdict.reasons()
    assert {e.kind for e in verdict.evidence} == {"signature", "robustness", "watermark"}
    # And through verify_model with the attestations at their reserved names next to the weights.
    model = setup["model"]
    (model / "model.gate.sig").write_bytes(
        setup["attest"](
            "gate", gate_predicate(finishedAt=datetime.now(UTC).isoformat().replace("+00:00", "Z"))
        )
    )
    (model / "model.watermark.sig").write_bytes(setup["attest"]("watermark", watermark_predicate()))
    assert verify_model(model, setup["policy"]).files == 6


CASES: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = [
    ("no SM2 signature when required", lambda s: {"drop_sm2": True}, r"missing signature: sm2"),
    (
        "gate FAILED",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(**{"gate.verdict": "FAILED"}))},
        r"verdict is 'FAILED'",
    ),
    (
        "gate below the policy's eps",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(**{"parameters.eps": 0.01}))},
        r"eps 0.01 is below the policy's minEps 0.03",
    ),
    (
        "robust accuracy below threshold",
        lambda s: {
            "gate": s["attest"](
                "gate",
                gate_predicate(**{"results.robust.accuracy": 0.6, "results.robust.wilson95": [0.5, 0.7]}),
            )
        },
        r"robust accuracy 0.6000 is below",
    ),
    (
        "gate sanity checks not a list",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(**{"sanity.checks": 5}))},
        r"sanity.checks must be a non-empty list of named checks",
    ),
    (
        "gate without any sanity check",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(**{"sanity.checks": []}))},
        r"sanity.checks must be a non-empty list",
    ),
    (
        "gate Wilson interval of booleans",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(**{"results.robust.wilson95": [True, True]}))},
        r"wilson95 must be \[lower, upper\]",
    ),
    (
        "gate Wilson interval that excludes the accuracy",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(**{"results.robust.wilson95": [0.99, 1.0]}))},
        r"0 <= lower <= accuracy <= upper <= 1",
    ),
    (
        "gate result for a different model digest",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(), digest="cd" * 32)},
        r"is about model cdcd",
    ),
    (
        "watermark signed by a key not allowed for that role",
        lambda s: {"wm": s["attest"]("watermark", watermark_predicate(), by="gate")},
        r"no trusted key allowed to sign 'watermark'",
    ),
    (
        "stale gate",
        lambda s: {"gate": s["attest"]("gate", gate_predicate(finishedAt="2026-01-01T00:00:00Z"))},
        r"stale",
    ),
    (
        "sanity check failed",
        lambda s: {
            "gate": s["attest"](
                "gate", gate_predicate(**{"sanity.checks": [{"name": "fgsm_not_stronger", "passed": False}]})
            )
        },
        r"fgsm_not_stronger",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "message"), CASES, ids=[c[0] for c in CASES])
def test_each_missing_or_failing_piece_is_refused(
    name: str,
    mutate,
    message: str,  # type: ignore[no-untyped-def]
    setup: dict[str, Any],
) -> None:
    verdict = verify_attestations(setup["root"], _bundles(setup, **mutate(setup)), setup["policy"], now=NOW)
    assert not verdict.ok
    with pytest.raises(AttestationError, match=message):
        verdict.raise_for_policy()


def test_missing_attestations_named(setup: dict[str, Any]) -> None:
    model = setup["model"]
    only_sigs = [(model / "model.sig").read_bytes(), (model / "model.sm2.sig").read_bytes()]
    verdict = verify_attestations(setup["root"], only_sigs, setup["policy"], now=NOW)
    assert verdict.missing == (
        "robustness: no robustness-gate attestation",
        "watermark: no watermark attestation",
    )
    with pytest.raises(AttestationError, match="no robustness-gate attestation"):
        verify_model(model, setup["policy"])


def test_strict_rule_uses_wilson_lower_bound(setup: dict[str, Any]) -> None:
    strict = dataclasses.replace(
        setup["policy"],
        robustness=RobustnessRequirement(min_eps=0.03, min_robust_accuracy=0.93, rule="strict"),
    )
    verdict = verify_attestations(setup["root"], _bundles(setup), strict, now=NOW)
    assert "Wilson 95% lower bound 0.9230 is below" in " ".join(verdict.refused)
    point = dataclasses.replace(
        strict, robustness=RobustnessRequirement(min_eps=0.03, min_robust_accuracy=0.93)
    )
    assert verify_attestations(setup["root"], _bundles(setup), point, now=NOW).ok


def test_foreign_bundles_are_ignored_not_a_veto(setup: dict[str, Any], key_dir: Path) -> None:
    """A shared store holds other teams' bundles: garbage, untrusted signers, other models never veto."""
    failed = gate_predicate(**{"gate.verdict": "FAILED"})
    stranger = sign_statement(  # SM2 key: trusted for weights only, not for gate results
        Statement((Subject("m", {"sha256": setup["root"]}),), GATE_PREDICATE_TYPE, failed),
        load_private_key_file(key_dir / "sm2.key.pem"),
    )
    other_model = setup["attest"]("gate", failed, digest="cd" * 32)
    extra = [b"{not json", stranger, other_model]
    verdict = verify_attestations(setup["root"], _bundles(setup, extra=extra), setup["policy"], now=NOW)
    assert verdict.ok, verdict.reasons()
    assert len(verdict.ignored) == 3 and "invalid JSON" in verdict.ignored[0]
    assert "no trusted key allowed to sign 'gate'" in verdict.ignored[1]


def test_unknown_predicate_type_is_ignored_not_a_veto(setup: dict[str, Any]) -> None:
    """Old code: a trusted key's statement of a predicate type modelsec does not know vetoed the model."""
    other = setup["attest"]("gate", {"x": 1}, ptype="https://slsa.dev/provenance/v1")
    verdict = verify_attestations(setup["root"], _bundles(setup, extra=[other]), setup["policy"], now=NOW)
    assert verdict.ok, verdict.reasons()
    assert "unknown predicateType 'https://slsa.dev/provenance/v1'" in verdict.ignored[0]


def test_a_failing_trusted_statement_vetoes_even_beside_a_passing_one(setup: dict[str, Any]) -> None:
    failed = setup["attest"]("gate", gate_predicate(**{"gate.verdict": "FAILED"}))
    verdict = verify_attestations(setup["root"], _bundles(setup, extra=[failed]), setup["policy"], now=NOW)
    assert not verdict.ok and "verdict is 'FAILED'" in verdict.refused[0]


def test_policy_file_attestations_section(tmp_path: Path, key_dir: Path) -> None:
    from modelsec.errors import PolicyError
    from modelsec.policy import PolicySet

    body = f"""
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: prod
    match: ["file:///models/**"]
    keys: [{{path: {key_dir}/ecdsa-p384.pub.pem, roles: [gate]}}]
    attestations:
      robustness: {{attack: pgd-linf, minEps: 0.03, minRobustAccuracy: 0.85, rule: strict,
                   minSamples: 500, maxAge: 30d}}
      watermark: {{required: true}}
"""
    p = tmp_path / "p.yaml"
    p.write_text(body)
    policy = admit(PolicySet.from_file(p), "file:///models/llm").policy
    assert policy.robustness == RobustnessRequirement("pgd-linf", 0.03, 0.85, "strict", 500, 30 * 86400.0)
    assert policy.watermark == WatermarkRequirement()
    p.write_text(body.replace("maxAge: 30d", "maxAge: soon"))
    with pytest.raises(PolicyError, match="maxAge"):
        PolicySet.from_file(p)
    p.write_text(body.replace("minEps: 0.03", "minEps: 0.03, surprise: 1"))
    with pytest.raises(PolicyError, match="unknown field"):
        PolicySet.from_file(p)


def test_directory_store_found_by_digest(setup: dict[str, Any], tmp_path: Path) -> None:
    from modelsec.verifier import find_attestation_bundles
    from modelsec.verifier.attestations import store_bundle

    store = tmp_path / "store"
    gate = setup["attest"](
        "gate", gate_predicate(finishedAt=datetime.now(UTC).isoformat().replace("+00:00", "Z"))
    )
    wm = setup["attest"]("watermark", watermark_predicate())
    paths = [store_bundle(store, gate), store_bundle(store, wm), store_bundle(store, gate)]  # idempotent
    assert paths[0] == paths[2] and paths[0].parent == store / "sha256" / setup["root"]
    policy = dataclasses.replace(setup["policy"], attestation_store=str(store))
    assert sorted(Path(b.source) for b in find_attestation_bundles(None, setup["root"], policy)) == sorted(
        paths[:2]
    )
    assert (
        verify_model(setup["model"], policy).files == 6
    )  # attestations from the store, weights from the dir
    other = dataclasses.replace(policy, attestation_store=str(tmp_path / "empty"))
    with pytest.raises(AttestationError, match="no robustness-gate attestation"):
        verify_model(setup["model"], other)


def test_submitted_bundles_must_all_count(setup: dict[str, Any]) -> None:
    """every_bundle_counts: a stranger's bundle, ignored when read from a store, vetoes when submitted."""
    good = _bundles(setup)
    foreign = setup["attest"]("gate", gate_predicate(), digest="cd" * 32)
    policy, root = setup["policy"], setup["root"]
    assert verify_attestations(root, [*good, foreign], policy, now=NOW).ok
    submitted = verify_attestations(root, [*good, foreign], policy, every_bundle_counts=True, now=NOW)
    assert not submitted.ok and any("is about model cdcd" in r for r in submitted.reasons())
    assert verify_attestations(root, good, policy, every_bundle_counts=True, now=NOW).ok
    nothing = verify_attestations(root, [foreign], policy, require_signatures=False, every_bundle_counts=True)
    assert not nothing.ok and "evidence: no bundle verified" in nothing.missing
