"""Gate and watermark attestations signed under a certificate count through the policy's authorities, by role.

Before: `verify_attestations` tried pinned keys only, so a gate run by a CI identity holding a corporate
certificate was ignored ("no trusted key allowed to sign 'gate'") even when the policy named its CA.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.policy import IdentityRule, X509Authority
from modelsec.signer import load_private_key_file
from modelsec.verifier import verify_attestations
from modelsec.verifier.attestations import GATE_PREDICATE_TYPE, WATERMARK_PREDICATE_TYPE
from tests.support.pki import Issued, Pki, make_ca, make_leaf, with_certificate_chain
from tests.unit.verifier.test_joint_verification import (  # noqa: F401
    NOW,
    _bundles,
    gate_predicate,
    setup,
    watermark_predicate,
)

GATE_ID = "https://ci.corp.example/gate"


def _authority(root: Issued, roles: set[str], identity: str = GATE_ID) -> X509Authority:
    der = root.cert.public_bytes(serialization.Encoding.DER)
    return X509Authority("gate-ca", (der,), (IdentityRule(identity=identity),), frozenset(roles))


def _cert_bundle(s: dict[str, Any], tmp_path: Path, pki: Pki, kind: str) -> bytes:
    """An attestation signed with the leaf's key, carrying leaf + intermediate instead of a key hint."""
    leaf = make_leaf(pki.intermediate, san=GATE_ID)  # under the session's code-signing root
    key = load_private_key_file(leaf.key_pem(tmp_path / f"{kind}-leaf.key.pem"))
    if kind == "gate":
        ptype, pred = GATE_PREDICATE_TYPE, gate_predicate()
    else:
        ptype, pred = WATERMARK_PREDICATE_TYPE, watermark_predicate()
    signed = sign_statement(Statement((Subject("m", {"sha256": s["root"]}),), ptype, pred), key)
    return with_certificate_chain(signed, leaf.cert, pki.intermediate.cert)


def _verdict(s: dict[str, Any], authority: X509Authority, gate: bytes, wm: bytes | None = None) -> Any:
    policy = dataclasses.replace(s["policy"], authorities=(authority,))
    return verify_attestations(s["root"], _bundles(s, gate=gate, wm=wm), policy, now=NOW)


def test_certificate_signed_attestations_count_through_an_authority_with_the_role(
    setup: dict[str, Any],  # noqa: F811
    pki: Pki,
    tmp_path: Path,
) -> None:
    gate = _cert_bundle(setup, tmp_path, pki, "gate")
    wm = _cert_bundle(setup, tmp_path, pki, "watermark")
    verdict = _verdict(setup, _authority(pki.root, {"gate", "watermark"}), gate, wm)
    assert verdict.ok, verdict.reasons()
    signers = {e.kind: e.key for e in verdict.evidence}
    assert signers["robustness"] == signers["watermark"] == f"gate-ca: {GATE_ID}"
    # Pinned keys keep working beside the authority (the weights signatures here).
    assert signers["signature"] in {"ci-weights", "ci-sm2"}


def test_an_authority_vouches_only_for_its_roles(
    setup: dict[str, Any],  # noqa: F811
    pki: Pki,
    tmp_path: Path,
) -> None:
    gate = _cert_bundle(setup, tmp_path, pki, "gate")
    verdict = _verdict(setup, _authority(pki.root, {"watermark"}), gate)
    assert not verdict.ok
    assert verdict.missing == ("robustness: no robustness-gate attestation",)
    assert any("no trusted key allowed to sign 'gate'" in i for i in verdict.ignored)


def test_wrong_identity_or_untrusted_root_is_ignored_not_trusted(
    setup: dict[str, Any],  # noqa: F811
    pki: Pki,
    tmp_path: Path,
) -> None:
    gate = _cert_bundle(setup, tmp_path, pki, "gate")
    wrong_id = _verdict(setup, _authority(pki.root, {"gate"}, identity="https://ci.corp.example/other"), gate)
    assert not wrong_id.ok and any("not an identity the policy trusts" in i for i in wrong_id.ignored)
    other_root = _verdict(setup, _authority(make_ca("other root"), {"gate"}), gate)
    assert not other_root.ok and any("does not verify to a configured root" in i for i in other_root.ignored)
