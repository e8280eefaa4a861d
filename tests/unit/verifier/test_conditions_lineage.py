"""Conditions in CEL and base-model lineage at the one evaluation every front door uses (issue 29, items 3-4):
slsa-verifier-style checks (builder, source repository, dataset digest) as CEL conditions, and lineage three
generations deep with a missing link, a cycle and a link signed by an untrusted key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_attestations
from modelsec.verifier.attestations import store_bundle
from tests.support.policies import first_policy, policy_doc, policy_entry, write_policy_doc
from tests.support.provenance import GITHUB_BUILDER, SLSA_PROVENANCE_V1, signed_provenance

ROOT = "0" * 63 + "1"  # the approved base model
GEN2, GEN1 = "2" * 64, "3" * 64  # grandparent and parent of the model
DATASET = "d" * 64

SLSA_CHECKS = {
    "builder": f"predicate.runDetails.builder.id == '{GITHUB_BUILDER}'",
    "source": "predicate.buildDefinition.externalParameters.workflow.repository == 'https://github.com/acme/models'",
    "dataset": f"predicate.buildDefinition.resolvedDependencies.exists(d, d.name == 'dataset' && "
    f"d.digest.sha256 == '{DATASET}')",
}


def _policy_doc(
    key_dir: Path, store: Path, *, conditions: dict[str, str], lineage: dict[str, Any] | None
) -> Any:
    items: list[dict[str, Any]] = [
        {"name": name, "predicateType": SLSA_PROVENANCE_V1, "signers": ["ci"], "condition": source}
        for name, source in conditions.items()
    ]
    if lineage is not None:
        items.append(
            {"name": "lineage", "predicateType": SLSA_PROVENANCE_V1, "signers": ["ci"], "lineage": lineage}
        )
    return policy_doc(
        policy_entry(
            keys=[
                {"path": str(key_dir / "ecdsa-p256.pub.pem"), "name": "ci"},
                {"path": str(key_dir / "other.pub.pem"), "name": "elsewhere"},
            ],
            attestationStore=str(store),
            attestations={"conditions": items},
        )
    )


@pytest.fixture
def signed(tiny_model: Path, key_dir: Path, tmp_path: Path) -> dict[str, Any]:
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    root = sign_model(tiny_model, [key]).root_digest
    store = tmp_path / "store"
    return {
        "root": root,
        "key": key,
        "other": load_private_key_file(key_dir / "other.key.pem"),
        "store": store,
        "model": tiny_model,
    }


def _policy(key_dir: Path, s: dict[str, Any], **kw: Any) -> Policy:
    kw.setdefault("conditions", SLSA_CHECKS)
    kw.setdefault("lineage", None)
    return first_policy(_policy_doc(key_dir, s["store"], **kw), key_dir)


def _verdict(s: dict[str, Any], policy: Policy, *bundles: bytes) -> Any:
    return verify_attestations(s["root"], [(s["model"] / "model.sig").read_bytes(), *bundles], policy)


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("builder", {"builder": "https://evil.example/runner"}),
        ("source", {"repository": "https://github.com/mallory/models"}),
        ("dataset", {"datasets": ("e" * 64,)}),
    ],
)
def test_slsa_checks_as_cel_conditions(
    key_dir: Path, signed: dict[str, Any], field: str, change: Any
) -> None:
    policy = _policy(key_dir, signed)
    good = signed_provenance(signed["root"], signed["key"], datasets=(DATASET,))
    verdict = _verdict(signed, policy, good)
    assert verdict.ok, verdict.reasons()
    assert {f"condition {n}" for n in SLSA_CHECKS} <= {s.split(" (")[0] for s in verdict.satisfied}
    bad = signed_provenance(signed["root"], signed["key"], **{"datasets": (DATASET,), **change})
    verdict = _verdict(signed, policy, bad)
    assert not verdict.ok
    line = next(m for m in verdict.missing if m.startswith(f"condition {field}:"))
    assert line.startswith(f"condition {field}: no signed {SLSA_PROVENANCE_V1} statement satisfies it")
    assert f"condition {field}: is false ({SLSA_CHECKS[field]!r})" in line
    # The right statement signed by a key the requirement does not name is no evidence either.
    verdict = _verdict(
        signed, policy, signed_provenance(signed["root"], signed["other"], datasets=(DATASET,))
    )
    assert not verdict.ok and len([m for m in verdict.missing if m.startswith("condition ")]) == 3


def _chain(
    s: dict[str, Any], *, gen1_by: str = "key", gen2_base: str = ROOT, skip_gen1: bool = False
) -> bytes:
    """Model <- GEN1 <- GEN2 <- ROOT: the model's provenance is returned, its ancestors' go to the store."""
    if not skip_gen1:
        store_bundle(s["store"], signed_provenance(GEN1, s[gen1_by], base=GEN2))
    store_bundle(s["store"], signed_provenance(GEN2, s["key"], base=gen2_base))
    return signed_provenance(s["root"], s["key"], base=GEN1, datasets=(DATASET,))


def test_lineage_three_generations(key_dir: Path, signed: dict[str, Any]) -> None:
    lineage = {"from": [f"sha256:{ROOT}"], "maxDepth": 3}
    policy = _policy(key_dir, signed, lineage=lineage)
    verdict = _verdict(signed, policy, _chain(signed))
    assert verdict.ok, verdict.reasons()
    assert any(
        f"lineage sha256:{signed['root']} <- sha256:{GEN1} <- sha256:{GEN2} <- sha256:{ROOT}" in s
        for s in verdict.satisfied
    )
    # One generation fewer allowed: the chain is too long.
    short = _policy(key_dir, signed, lineage={**lineage, "maxDepth": 2})
    verdict = _verdict(signed, short, _chain(signed))
    assert not verdict.ok
    assert any(
        f"link 2 (sha256:{GEN1}): base model sha256:{GEN2} is not an approved root and maxDepth 2" in m
        for m in verdict.missing
    )


def test_lineage_refuses_a_missing_link(key_dir: Path, signed: dict[str, Any]) -> None:
    policy = _policy(key_dir, signed, lineage={"from": [f"sha256:{ROOT}"]})
    verdict = _verdict(signed, policy, _chain(signed, skip_gen1=True))
    assert not verdict.ok
    assert any(
        f"link 2 (sha256:{GEN1}): no provenance signed by a trusted signer" in m for m in verdict.missing
    )


def test_lineage_refuses_a_link_signed_by_an_untrusted_key(key_dir: Path, signed: dict[str, Any]) -> None:
    """`other` is a key of the policy, but not one of the requirement's signers."""
    policy = _policy(key_dir, signed, lineage={"from": [f"sha256:{ROOT}"]})
    verdict = _verdict(signed, policy, _chain(signed, gen1_by="other"))
    assert not verdict.ok
    line = next(m for m in verdict.missing if m.startswith("condition lineage"))
    assert f"link 2 (sha256:{GEN1}): no provenance signed by a trusted signer" in line
    assert "signature" in line.lower()


def test_lineage_refuses_a_cycle(key_dir: Path, signed: dict[str, Any]) -> None:
    policy = _policy(key_dir, signed, lineage={"from": [f"sha256:{ROOT}"], "maxDepth": 10})
    verdict = _verdict(signed, policy, _chain(signed, gen2_base=GEN1))
    assert not verdict.ok
    assert any(f"link 3 (sha256:{GEN2}): cycle back to sha256:{GEN1}" in m for m in verdict.missing)


def test_the_verify_command_allows_and_refuses_alike(
    key_dir: Path, signed: dict[str, Any], tmp_path: Path, cli: Any
) -> None:
    """The CLI front door reads the same store and gives the same answers (verify -> verify_attestations)."""
    doc = _policy_doc(key_dir, signed["store"], conditions=SLSA_CHECKS, lineage={"from": [f"sha256:{ROOT}"]})
    path = write_policy_doc(tmp_path / "policy.json", doc)
    store_bundle(signed["store"], _chain(signed))
    assert cli("verify", signed["model"], "--policy", path).returncode == 0
    # An untrusted builder's provenance, alone in a fresh store, refuses.
    signed["store"] = tmp_path / "store2"
    store_bundle(
        signed["store"], signed_provenance(signed["root"], signed["key"], builder="https://evil.example")
    )
    doc = _policy_doc(key_dir, signed["store"], conditions=SLSA_CHECKS, lineage=None)
    result = cli("verify", signed["model"], "--policy", write_policy_doc(tmp_path / "p2.json", doc))
    assert result.returncode == 1
    assert "condition builder" in result.stderr
