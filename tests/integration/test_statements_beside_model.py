"""Statements in `model.attestations/` (provenance, `attest sign`) count where a policy asks for them.

`attest provenance`, `attest sign` and `release` write there, and a policy's `conditions` judge such
statements; `verify --policy` (through the model folder's descriptor), `verify_model` (by path), `push` (the
referrers it attaches) and `pull` (the staged model verified under the policy) must all read them. Found by
running examples/README.md: a released model failed its own example policy. Real registry (`registry`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.errors import AttestationError
from modelsec.policy import PolicySet
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model
from tests.support.oci import Registry
from tests.support.policies import write_policy_file

pytestmark = pytest.mark.integration

PROVENANCE = "https://slsa.dev/provenance/v1"


def _condition(name: str, expression: str) -> dict[str, object]:
    return {"name": name, "predicateType": PROVENANCE, "signers": ["ci"], "condition": expression}


def _policy(path: Path, key_dir: Path, match: str, *conditions: dict[str, object]) -> Path:
    key = {"name": "ci", "path": str(key_dir / "ecdsa-p256.pub.pem")}
    return write_policy_file(path, match=match, keys=[key], attestations={"conditions": list(conditions)})


def _attested_model(cli, root: Path, key_dir: Path) -> Path:  # type: ignore[no-untyped-def]
    model = write_tiny_model(root / "model", seed=3131)
    assert cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    made = cli(
        "attest", "provenance", model, "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--dataset", f"digits=sha256:{'ab' * 32}",
        env={"GITHUB_ACTIONS": None, "GITLAB_CI": None, "MODELSEC_BUILDER_ID": None},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (model / "model.attestations" / "slsa.dev-provenance-v1.sig").is_file()
    return model


NAMES_DATASET = _condition(
    "dataset",
    "predicate.buildDefinition.resolvedDependencies.exists(d, has(d.annotations) && "
    "d.annotations['modelsec.dev/role'] == 'dataset')",
)
NEVER = _condition("never", "predicate.runDetails.builder.id == 'https://builder.invalid/'")


def test_verify_reads_the_provenance_beside_the_model(cli, tmp_path: Path, key_dir: Path) -> None:  # type: ignore[no-untyped-def]
    model = _attested_model(cli, tmp_path, key_dir)
    policy = _policy(tmp_path / "policy.yaml", key_dir, "file:///**", NAMES_DATASET)
    result = cli("verify", model, "--policy", policy)
    assert result.returncode == 0, result.stderr
    verified = verify_model(model, PolicySet.from_file(policy))  # by path, not through a descriptor
    assert verified.root_digest
    # A condition the statement does not meet still refuses: the statement is judged, not waved through.
    strict = _policy(tmp_path / "strict.yaml", key_dir, "file:///**", NEVER)
    refused = cli("verify", model, "--policy", strict, "--json")
    assert refused.returncode == 1
    assert "condition never" in refused.stdout and "is false" in refused.stdout
    with pytest.raises(AttestationError, match="condition never"):
        verify_model(model, PolicySet.from_file(strict))


def test_push_and_pull_carry_the_provenance(cli, tmp_path: Path, key_dir: Path, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    model = _attested_model(cli, tmp_path, key_dir)
    reference = f"oci://{registry.address}/statements-beside/model:v1"
    pushed = cli(
        "push", model, reference, "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json", env=registry.env(),
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    match = f"oci://{registry.address}/statements-beside/**"
    policy = _policy(tmp_path / "policy.yaml", key_dir, match, NAMES_DATASET)
    pulled = cli("pull", reference, tmp_path / "pulled", "--policy", policy, env=registry.env())
    assert pulled.returncode == 0, pulled.stderr
    assert [p.name for p in (tmp_path / "pulled" / "model.attestations").iterdir()] != []
    assert cli("verify", tmp_path / "pulled", "--policy", _policy(
        tmp_path / "local.yaml", key_dir, "file:///**", NAMES_DATASET)).returncode == 0  # fmt: skip
    strict = _policy(tmp_path / "strict.yaml", key_dir, match, NEVER)
    refused = cli("pull", reference, tmp_path / "refused", "--policy", strict, env=registry.env())
    assert refused.returncode == 1 and "condition never" in refused.stderr
    assert not (tmp_path / "refused").exists()
