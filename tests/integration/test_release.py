"""`modelsec release` end to end on real weights: advertorch's PGD-trained MNIST LeNet5, real MNIST digits.

One release of the PGD-trained model (module scope) serves the tests that read what it wrote; the refused
releases run on their own. Inputs and gate: `_lenet_release.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelsec.errors import AttestationError
from tests.conftest import run_cli
from tests.integration._lenet_release import ENV, release_inputs, require_inputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]
require_inputs()

DIGITS = 40  # four per class
BAR = 0.85
# A GitHub-Actions-shaped environment: the release's provenance names this builder and workflow run.
GITHUB = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_REPOSITORY": "acme/lenet",
    "GITHUB_WORKFLOW_REF": "acme/lenet/.github/workflows/release.yml@refs/tags/v1",
    "GITHUB_SHA": "1" * 40,
    "GITHUB_REF": "refs/tags/v1",
    "RUNNER_ENVIRONMENT": "self-hosted",
    "GITHUB_RUN_ID": "9",
    "GITHUB_RUN_ATTEMPT": "1",
}


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> tuple[Path, dict[str, object]]:
    """(the release directory, the `--json` reply) of one successful release of the PGD-trained LeNet5."""
    work = release_inputs(
        tmp_path_factory, tmp_path_factory.mktemp("release"), digits=DIGITS, min_robust_accuracy=BAR
    )
    out = work / "released"
    r = run_cli(
        "release", work / "advtrained", "--out", out, "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--signing-key", key_dir / "sm2.key.pem", "--watermark-key", work / "wm.key", "-m", "release-1",
        "--gate-config", work / "gate.yaml", "--json", env={**ENV, **GITHUB},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def _policy(path: Path, model: Path, key_dir: Path) -> Path:
    """A deployment policy requiring both signatures, the gate result and the watermark."""
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n  - name: prod\n"
        f"    match: ['file://{model.resolve()}']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}', '{key_dir / 'sm2.pub.pem'}']\n"
        "    requireAlgorithms: [ecdsa-p256, sm2]\n"
        f"    attestations:\n      robustness: {{minEps: 0.3, minRobustAccuracy: {BAR}, maxAge: 1d}}\n"
        "      watermark: {required: true}\n"
    )
    return path


def test_release_writes_the_model_and_every_bundle(released: tuple[Path, dict[str, object]]) -> None:
    out, doc = released
    assert doc["robustAccuracy"] >= BAR  # type: ignore[operator]
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.attestations",
        "model.gate.sig",
        "model.safetensors",
        "model.sig",
        "model.sm2.sig",
        "model.watermark.sig",
    ]


def test_release_provenance_names_the_ci_builder_the_code_and_the_gate_dataset(
    released: tuple[Path, dict[str, object]], key_dir: Path
) -> None:
    from modelsec.attestations.predicates.gate import parse_gate_statement
    from modelsec.attestations.predicates.provenance import SLSA_PROVENANCE_V1, parse_provenance
    from modelsec.policy import Policy
    from modelsec.verifier.attestations import find_statement_files, verified_statements

    out, doc = released
    assert doc["provenanceAttestation"] == str(out / "model.attestations" / "slsa.dev-provenance-v1.sig")
    root = str(doc["rootDigest"]).removeprefix("sha256:")
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    (one,) = verified_statements(root, find_statement_files(out), policy, SLSA_PROVENANCE_V1).statements
    provenance = parse_provenance(one.statement, what="provenance")
    assert provenance.builder_id == "https://github.com/actions/runner/self-hosted"
    assert [s.commit for s in provenance.sources] == ["1" * 40]
    (gate,) = verified_statements(
        root, find_statement_files(out), policy, "https://modelsec.dev/robustness-gate/v1"
    ).statements
    dataset = parse_gate_statement(gate.statement, what="gate", limits=policy.limits).dataset_sha256
    assert [d.sha256 for d in provenance.datasets] == [dataset]


def test_policy_requiring_everything_loads_the_verified_tensors(
    released: tuple[Path, dict[str, object]], key_dir: Path, tmp_path: Path
) -> None:
    from modelsec.policy import PolicySet
    from modelsec.verifier import load_model

    out, _ = released
    policy = _policy(tmp_path / "policy.yaml", out, key_dir)
    tensors = load_model(out, PolicySet.from_file(policy))
    assert set(tensors) >= {"conv1.weight", "linear2.weight"}
    r = run_cli("verify", out, "--policy", policy)
    assert r.returncode == 0, r.stderr


def test_watermark_is_detected_with_the_owners_key(released: tuple[Path, dict[str, object]]) -> None:
    out, _ = released
    r = run_cli("watermark", "detect", out, "--watermark-key", out.parent / "wm.key")
    assert r.returncode == 0, r.stdout + r.stderr


def test_without_the_gate_result_the_policy_refuses(
    released: tuple[Path, dict[str, object]], key_dir: Path, tmp_path: Path
) -> None:
    from modelsec.policy import PolicySet
    from modelsec.verifier import load_model

    copy = tmp_path / "released"
    shutil.copytree(released[0], copy)
    (copy / "model.gate.sig").unlink()
    policy = _policy(tmp_path / "policy.yaml", copy, key_dir)
    r = run_cli("verify", copy, "--policy", policy)
    assert r.returncode == 1 and "no robustness-gate attestation" in r.stderr
    with pytest.raises(AttestationError):
        load_model(copy, PolicySet.from_file(policy))


def test_attest_list_names_every_predicate(released: tuple[Path, dict[str, object]], key_dir: Path) -> None:
    out, _ = released
    r = run_cli(
        "attest", "list", out, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key",
        key_dir / "sm2.pub.pem", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    types = sorted(b["predicateType"] for b in json.loads(r.stdout)["bundles"])
    assert types == ["https://model_signing/signature/v1.0"] * 2 + [
        "https://modelsec.dev/robustness-gate/v1",
        "https://modelsec.dev/watermark/v1",
    ]


def test_release_fails_fast_naming_the_stage(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, key_dir: Path
) -> None:
    # The normally trained LeNet5 fails the gate (its robust accuracy at eps 0.3 is about nil).
    work = release_inputs(tmp_path_factory, tmp_path, which="clntrained", min_robust_accuracy=BAR)
    r = run_cli(
        "release", work / "clntrained", "--out", work / "refused", "--signing-key",
        key_dir / "ecdsa-p256.key.pem", "--watermark-key", work / "wm.key", "-m", "release-1",
        "--gate-config", work / "gate.yaml", env=ENV,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.startswith("modelsec: error: release stage 'gate': PGD robustness gate FAILED")
    # All or nothing: no signed, watermarked model is left in --out, nor a staging directory beside it.
    assert not any(p.name == "refused" or ".refused." in p.name for p in work.iterdir())
    r = run_cli(
        "release", work / "clntrained", "--out", work / "nokey", "--signing-key",
        key_dir / "ecdsa-p256.key.pem", "--watermark-key", work / "missing.key", "-m", "x",
        "--gate-config", work / "gate.yaml", env=ENV,
    )  # fmt: skip
    assert r.returncode == 1 and "missing.key" in r.stderr and "Traceback" not in r.stderr
    assert not any(p.name == "nokey" or ".nokey." in p.name for p in work.iterdir())
