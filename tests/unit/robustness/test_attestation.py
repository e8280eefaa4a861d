"""The gate attestation: DSSE signature verifies, subject = model root digest, predicate fields complete."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from modelsec.attestations import parse_bundle, parse_statement  # noqa: E402
from modelsec.errors import MalformedArtifactError, SignatureError  # noqa: E402
from modelsec.policy import Policy  # noqa: E402
from modelsec.robustness import (  # noqa: E402
    PREDICATE_TYPE,
    GateConfig,
    SanityConfig,
    gate_statement,
    run_pgd_gate,
    sign_gate_result,
)
from modelsec.signer import load_private_key_file  # noqa: E402
from modelsec.verifier import verify_bundle_signature, verify_model  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402


def _data(tmp_path: Path) -> Path:
    import numpy as np

    _, _, x, y = h.digits()
    path = tmp_path / "digits.npz"
    np.savez(path, inputs=x[:60].numpy(), labels=y[:60].numpy())
    return path


def test_signed_gate_attestation_verifies_and_names_the_model(tmp_path: Path, key_dir: Path) -> None:
    model = h.signed_model_dir(
        tmp_path / "digits-cnn", h.trained_cnn().state_dict(), key_dir / "ecdsa-p256.key.pem"
    )
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    cfg = GateConfig(
        eps=0.03,
        step_size=0.01,
        steps=5,
        restarts=2,
        seed=9,
        min_robust_accuracy=0.5,
        min_samples=50,
        batch_size=32,
        sanity=SanityConfig(samples=40),
    )
    out = tmp_path / "gate.sig"
    outcome = run_pgd_gate(
        model,
        policy=policy,
        architecture="digits_models:digits_cnn",
        data=_data(tmp_path),
        config=cfg,
        signer=load_private_key_file(key_dir / "sm2.key.pem"),
        out=out,
    )
    assert outcome.out == out and out.read_bytes() == outcome.bundle

    bundle = parse_bundle(out.read_bytes(), source=str(out))
    gate_keys = Policy.from_key_files([key_dir / "sm2.pub.pem"]).keys
    key = verify_bundle_signature(bundle, gate_keys, role="gate")
    assert key.name == "sm2.pub.pem"
    with pytest.raises(SignatureError):
        verify_bundle_signature(bundle, policy.keys, role="gate")
    statement = parse_statement(bundle.envelope.payload, what=str(out), predicate_type=PREDICATE_TYPE)

    root = verify_model(model, policy).root_digest
    assert len(statement.subjects) == 1
    assert dict(statement.subjects[0].digest) == {"sha256": root} == {"sha256": outcome.root_digest}
    assert statement.subjects[0].name == "digits-cnn"

    p = statement.predicate
    assert p["attack"] == "pgd-linf"
    params = p["parameters"]
    assert (
        params["norm"],
        params["eps"],
        params["stepSize"],
        params["steps"],
        params["restarts"],
        params["seed"],
    ) == ("Linf", 0.03, 0.01, 5, 2, 9)
    import hashlib

    assert p["dataset"]["digest"] == {"sha256": hashlib.sha256(_data(tmp_path).read_bytes()).hexdigest()}
    assert p["dataset"]["samples"] == 60
    for name in ("clean", "robust"):
        r = p["results"][name]
        assert r["total"] == 60 and r["accuracy"] == r["correct"] / 60
        lo, hi = r["wilson95"]
        assert 0 <= lo <= r["accuracy"] <= hi <= 1
    gate = p["gate"]
    assert gate["rule"] == "point" and gate["threshold"] == 0.5 and gate["minSamples"] == 50
    assert gate["verdict"] == outcome.result.verdict
    env = p["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and "dtypes" in env
    assert p["model"] == {"architecture": "digits_models:digits_cnn", "weights": ["model.safetensors"]}
    assert p["elapsedSeconds"] > 0
    finished = datetime.fromisoformat(p["finishedAt"].replace("Z", "+00:00"))
    assert finished.tzinfo is not None
    assert {c["name"] for c in p["sanity"]["checks"]} >= {"eps_zero", "monotone", "large_eps", "fgsm_weaker"}


def test_failed_gates_are_attested_with_their_verdict(tmp_path: Path, key_dir: Path) -> None:
    model = h.signed_model_dir(tmp_path / "m", h.trained_mlp().state_dict(), key_dir / "ecdsa-p256.key.pem")
    cfg = GateConfig(
        eps=0.2,
        step_size=0.05,
        steps=5,
        min_robust_accuracy=0.99,
        min_samples=10,
        sanity=SanityConfig(enabled=False),
    )
    outcome = run_pgd_gate(
        model,
        policy=Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]),
        architecture="digits_models:digits_mlp",
        data=_data(tmp_path),
        config=cfg,
        signer=load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
    )
    assert outcome.out is None and outcome.bundle is not None
    bundle = parse_bundle(outcome.bundle, source="mem")
    statement = parse_statement(bundle.envelope.payload, what="mem")
    assert statement.predicate["gate"]["verdict"] == "FAILED"
    assert statement.predicate["sanity"]["enabled"] is False


def test_statement_rejects_a_malformed_root_digest(tmp_path: Path) -> None:
    from modelsec.robustness import Dataset, run_gate

    _, _, x, y = h.digits()
    result = run_gate(
        h.trained_mlp(),
        Dataset(x[:10], y[:10], "00" * 32, "d", "loader"),
        GateConfig(
            eps=0.0,
            step_size=0.1,
            steps=1,
            min_robust_accuracy=0.0,
            min_samples=1,
            sanity=SanityConfig(enabled=False),
        ),
    )
    with pytest.raises(MalformedArtifactError):
        gate_statement(result, root_digest="sha256:abc", model_name="m")
    statement = gate_statement(result, root_digest="ab" * 32, model_name="m")
    assert statement.predicate_type == PREDICATE_TYPE

    class _Signer:
        def public_key_pem(self) -> bytes:
            return b"pem"

        def sign(self, message: bytes) -> bytes:
            return b"sig"

    assert b"dsseEnvelope" in sign_gate_result(result, _Signer(), root_digest="ab" * 32, model_name="m")
