"""Authority by operation (issue 14, item 1), through a real `modelsec serve` with mutual TLS.

Reproduced on old code: RunGate and SignStatement checked the same `keys[].allow` list, so a client allowed to
run gates had the server sign a made-up PASSED gate with the gate key (VerifyBundle returned ok under a
strict policy and PutAttestation stored it). And RunGate's caller chose dataset, steps and restarts while no
policy could pin them, so a weak run produced an honest PASSED that every policy accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402

from modelsec.attestations.bundle import parse_bundle  # noqa: E402
from modelsec.attestations.predicates.gate import GATE_PREDICATE_TYPE  # noqa: E402
from modelsec.attestations.statement import parse_statement  # noqa: E402
from modelsec.errors import PermissionDeniedError, VerificationError  # noqa: E402
from modelsec.policy import Policy  # noqa: E402
from modelsec.service.client import ChannelOptions, ModelsecClient  # noqa: E402
from modelsec.v1 import robustness_pb2  # noqa: E402
from modelsec.verifier import verify_model  # noqa: E402
from tests.support.pki import TestCA  # noqa: E402
from tests.support.service import ChildServer, spawn_cli_server, write_server_config  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402
from tests.unit.verifier.test_joint_verification import gate_predicate  # noqa: E402

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

ARCH = "digits_models:digits_mlp"
CI = "spiffe://example.org/ci/gate-runner"
MIN_STEPS, MIN_RESTARTS = 10, 2


@dataclasses.dataclass
class Setup:
    server: ChildServer
    pki: dict[str, Path]
    model: Path
    listed: Path
    unlisted: Path
    root_digest: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("gate-authority")
    ca = TestCA.create(root / "pki")
    pki = {"ca": ca.path}
    pki["server"], pki["server_key"] = ca.issue_server(root / "pki")
    pki["ci"], pki["ci_key"] = ca.issue(root / "pki", "ci", cn="ci", uris=(CI,))
    model = h.signed_model_dir(
        root / "models" / "digits-mlp", h.trained_mlp().state_dict(), key_dir / "ecdsa-p256.key.pem"
    )
    _, _, x, y = h.digits()
    listed, unlisted = root / "models" / "digits-64.npz", root / "models" / "digits-other.npz"
    np.savez(listed, inputs=x[:64].numpy(), labels=y[:64].numpy())
    np.savez(unlisted, inputs=x[64:128].numpy(), labels=y[64:128].numpy())
    # The default policy (VerifyBundle, PutAttestation) requires a strong, server-run gate on the listed set.
    robustness = {
        "minEps": 0.03,
        "minRobustAccuracy": 0.5,
        "minSamples": 50,
        "minSteps": MIN_STEPS,
        "minRestarts": MIN_RESTARTS,
        "datasetDigests": [hashlib.sha256(listed.read_bytes()).hexdigest()],
        "requireServerRun": True,
    }
    server_dir = root / "server"
    server_dir.mkdir()
    # RunGate verifies the model under the policy matching its path (`gating`, no gate required yet);
    # VerifyBundle and PutAttestation judge gates under the default policy (`release`).
    trusted = json.dumps([str(key_dir / "ecdsa-p256.pub.pem")])
    policy = server_dir / "policy.yaml"
    policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: release\n    match: ['oci://registry.test/**']\n    keys: {trusted}\n"
        f"    attestations:\n      robustness: {json.dumps(robustness)}\n"
        f"  - name: gating\n    match: ['file:///**']\n    keys: {trusted}\n"
    )
    key = str(key_dir / "ecdsa-p256.key.pem")
    config = write_server_config(
        server_dir,
        key_dir,
        policy=policy,
        defaultPolicy="release",
        serverIdentity="gate-server.test",
        tls={"cert": str(pki["server"]), "key": str(pki["server_key"]), "clientCA": str(pki["ca"])},
        keys=[
            {"name": "gate", "path": key, "roles": ["gate"], "allow": [CI]},  # default: gateResult only
            {"name": "ci-p256", "path": key, "allow": [CI]},  # every role, default operations
            # Explicitly configured to sign client-made gate statements (which then say no server ran them).
            {
                "name": "client-gates",
                "path": key,
                "roles": ["gate"],
                "operations": ["signStatement"],
                "allow": [CI],
            },
        ],
        access={"robustness": [CI], "putAttestation": [CI]},
        readRoots=[str(root / "models")],
        architectures=[ARCH],
    )
    digest = verify_model(model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])).root_digest
    server = spawn_cli_server(config, env={"PYTHONPATH": str(h.EXAMPLES), "OMP_NUM_THREADS": "1"})
    try:
        yield Setup(server, pki, model, listed, unlisted, digest)
    finally:
        server.terminate()


def _client(server: ChildServer, pki: dict[str, Path]) -> ModelsecClient:
    return ModelsecClient(
        server.target,
        ChannelOptions(ca=pki["ca"], cert=pki["ci"], key=pki["ci_key"], server_name="localhost", timeout=120),
    )


def _forged(setup: Setup, **extra: Any) -> bytes:
    """A made-up PASSED gate that meets the strict policy on paper: no PGD ever ran."""
    predicate = gate_predicate(
        **{
            "parameters.eps": 0.3,
            "parameters.steps": 1000,
            "parameters.restarts": 10,
            "dataset.digest.sha256": hashlib.sha256(setup.listed.read_bytes()).hexdigest(),
        }
    )
    predicate.update(extra)
    root_digest = setup.root_digest
    return json.dumps(
        {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "digits-mlp", "digest": {"sha256": root_digest}}],
            "predicateType": GATE_PREDICATE_TYPE,
            "predicate": predicate,
        }
    ).encode()


def test_sign_statement_refuses_a_made_up_gate(setup: Setup) -> None:
    runby = {"runBy": {"server": "gate-server.test", "requester": CI}}
    with _client(setup.server, setup.pki) as c:
        # Keys that sign this server's own gate results: a gate key, and one holding every role.
        with pytest.raises(PermissionDeniedError, match="'gate/1' may not be used for signStatement"):
            c.sign_statement("gate/1", _forged(setup))
        with pytest.raises(PermissionDeniedError, match="SignStatement does not sign gate statements"):
            c.sign_statement("ci-p256/1", _forged(setup))
        # A key configured for client-made gate statements cannot claim that the server ran one ...
        with pytest.raises(PermissionDeniedError, match="claiming a server run"):
            c.sign_statement("client-gates/1", _forged(setup, **runby))
        # ... and what it signs without that claim is no server-run evidence.
        bundle = c.sign_statement("client-gates/1", _forged(setup)).bundle
        assert _denied(c.verify_bundle(setup.root_digest, [bundle]).verdict, "records no server run")
        with pytest.raises(VerificationError, match="records no server run"):
            c.put_attestation(bundle)


def _denied(verdict: Any, mentions: str) -> bool:
    reasons = " ".join([*verdict.missing, *verdict.refused, *verdict.ignored])
    assert not verdict.ok and mentions in reasons, verdict
    return True


def _run(c: ModelsecClient, setup: Setup, data: Path, steps: int, restarts: int) -> robustness_pb2.GateResult:
    request = robustness_pb2.RunGateRequest(
        model_path=str(setup.model),
        architecture=ARCH,
        data_path=str(data),
        eps=0.03,
        steps=steps,  # step size: the default for eps and steps (Madry et al. 2018)
        restarts=restarts,
        seed=7,
        min_robust_accuracy=0.5,
        min_samples=50,
        batch_size=32,
        attestation_key_version="gate/1",
        store_attestation=True,
    )
    *_, last = c.run_gate(request)
    return last.result


@pytest.mark.slow
def test_weak_or_unlisted_runs_are_denied_and_a_strong_run_counts(setup: Setup) -> None:
    with _client(setup.server, setup.pki) as c:
        few_steps = _run(c, setup, setup.listed, steps=3, restarts=MIN_RESTARTS)
        one_start = _run(c, setup, setup.listed, steps=MIN_STEPS, restarts=1)
        unlisted = _run(c, setup, setup.unlisted, steps=MIN_STEPS, restarts=MIN_RESTARTS)
        strong = _run(c, setup, setup.listed, steps=MIN_STEPS, restarts=MIN_RESTARTS)
        for result, mentions in [
            (few_steps, f"ran 3 PGD steps, the policy needs at least {MIN_STEPS}"),
            (one_start, f"ran 1 PGD restarts, the policy needs at least {MIN_RESTARTS}"),
            (unlisted, "is not among the policy's datasetDigests"),
        ]:
            # An honest PASSED of a run the policy does not accept: not stored, and no evidence.
            assert result.verdict == "PASSED" and result.attestation, (result.reasons, result.robust_accuracy)
            assert not result.stored_attestation_id and mentions in result.not_stored_reason
            assert _denied(c.verify_bundle(setup.root_digest, [result.attestation]).verdict, mentions)
        assert strong.verdict == "PASSED" and strong.stored_attestation_id, strong.not_stored_reason
        assert c.verify_bundle(setup.root_digest, [strong.attestation]).verdict.ok
    # The server built the predicate from its own run, and says who ran it for whom.
    bundle = parse_bundle(strong.attestation, source="RunGate")
    predicate = parse_statement(bundle.envelope.payload, what="RunGate").predicate
    assert predicate["runBy"] == {"server": "gate-server.test", "requester": CI}
    assert (predicate["parameters"]["steps"], predicate["parameters"]["restarts"]) == (
        MIN_STEPS,
        MIN_RESTARTS,
    )
    assert predicate["dataset"]["digest"]["sha256"] == hashlib.sha256(setup.listed.read_bytes()).hexdigest()
