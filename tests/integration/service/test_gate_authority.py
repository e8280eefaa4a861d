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

from modelsec.attestations.statement import GATE_PREDICATE_TYPE  # noqa: E402
from modelsec.errors import PermissionDeniedError, VerificationError  # noqa: E402
from modelsec.service.client import ChannelOptions, ModelsecClient  # noqa: E402
from modelsec.v1 import robustness_pb2  # noqa: E402
from tests.service_support import ChildServer, TestCA, spawn_cli_server, write_policy, write_server_config  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402
from tests.unit.verifier.test_joint_verification import gate_predicate  # noqa: E402

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

ARCH = "digits_models:digits_mlp"
CI = "spiffe://example.org/ci/gate-runner"
MIN_STEPS = 5


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
        "datasetDigests": [hashlib.sha256(listed.read_bytes()).hexdigest()],
        "requireServerRun": True,
    }
    server_dir = root / "server"
    server_dir.mkdir()
    policy = write_policy(
        server_dir, key_dir, extra=f"    attestations:\n      robustness: {json.dumps(robustness)}\n"
    )
    key = str(key_dir / "ecdsa-p256.key.pem")
    config = write_server_config(
        server_dir,
        key_dir,
        policy=policy,
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
        access={"robustness": [CI], "putAttestation": [CI], "verifyModel": [CI]},
        readRoots=[str(root / "models")],
        architectures=[ARCH],
    )
    server = spawn_cli_server(config, env={"PYTHONPATH": str(h.EXAMPLES), "OMP_NUM_THREADS": "1"})
    try:
        with _client(server, pki) as c:
            digest = c.verify_model(str(model)).root_digest
        yield Setup(server, pki, model, listed, unlisted, digest)
    finally:
        server.terminate()


def _client(server: ChildServer, pki: dict[str, Path]) -> ModelsecClient:
    return ModelsecClient(
        server.target,
        ChannelOptions(ca=pki["ca"], cert=pki["ci"], key=pki["ci_key"], server_name="localhost", timeout=120),
    )


def _forged(root_digest: str, **extra: Any) -> bytes:
    """A made-up PASSED gate that meets the strict policy on paper: no PGD ever ran."""
    predicate = gate_predicate(**{"parameters.eps": 0.3, "parameters.steps": 1000, "parameters.restarts": 10})
    predicate.update(extra)
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
        for key in ("gate/1", "ci-p256/1"):  # keys that sign this server's own gate results
            with pytest.raises(PermissionDeniedError, match="SignStatement does not sign gate statements"):
                c.sign_statement(key, _forged(setup.root_digest))
        # A key configured for client-made gate statements cannot claim that the server ran one ...
        with pytest.raises(PermissionDeniedError, match="claiming a server run"):
            c.sign_statement("client-gates/1", _forged(setup.root_digest, **runby))
        # ... and what it signs without that claim is no server-run evidence.
        bundle = c.sign_statement("client-gates/1", _forged(setup.root_digest)).bundle
        verdict = c.verify_bundle(setup.root_digest, [bundle])
        assert not verdict.ok and "records no server run" in " ".join(verdict.reasons), verdict
        with pytest.raises(VerificationError, match="records no server run"):
            c.put_attestation(bundle)


def _run(c: ModelsecClient, setup: Setup, data: Path, steps: int) -> robustness_pb2.GateResult:
    request = robustness_pb2.RunGateRequest(
        model_path=str(setup.model),
        architecture=ARCH,
        data_path=str(data),
        eps=0.03,
        step_size=0.0075,
        steps=steps,
        seed=7,
        min_robust_accuracy=0.5,
        min_samples=50,
        batch_size=32,
        attestation_key_version="gate/1",
        store_attestation=True,
    )
    *_, last = c.run_gate(request)
    return last.result


def test_weak_or_unlisted_runs_are_denied_and_a_strong_run_counts(setup: Setup) -> None:
    with _client(setup.server, setup.pki) as c:
        weak = _run(c, setup, setup.listed, steps=1)
        unlisted = _run(c, setup, setup.unlisted, steps=MIN_STEPS)
        strong = _run(c, setup, setup.listed, steps=MIN_STEPS)
        for result, mentions in [
            (weak, f"ran 1 PGD steps, the policy needs at least {MIN_STEPS}"),
            (unlisted, "is not among the policy's datasetDigests"),
        ]:
            # An honest PASSED of a run the policy does not accept: not stored, and no evidence.
            assert result.verdict == "PASSED" and result.attestation, result
            assert not result.stored_attestation_id and mentions in result.not_stored_reason
            verdict = c.verify_bundle(setup.root_digest, [result.attestation])
            assert not verdict.ok and mentions in " ".join(verdict.reasons), verdict
        assert strong.verdict == "PASSED" and strong.stored_attestation_id, strong.not_stored_reason
        assert c.verify_bundle(setup.root_digest, [strong.attestation]).ok


def test_the_server_run_records_who_ran_it(setup: Setup) -> None:
    from modelsec.attestations.bundle import parse_bundle
    from modelsec.attestations.statement import parse_statement

    with _client(setup.server, setup.pki) as c:
        result = _run(c, setup, setup.listed, steps=MIN_STEPS)
    bundle = parse_bundle(result.attestation, source="RunGate")
    predicate = parse_statement(bundle.envelope.payload, what="RunGate").predicate
    assert predicate["runBy"] == {"server": "gate-server.test", "requester": CI}
    assert predicate["parameters"]["steps"] == MIN_STEPS
    assert predicate["dataset"]["digest"]["sha256"] == hashlib.sha256(setup.listed.read_bytes()).hexdigest()
