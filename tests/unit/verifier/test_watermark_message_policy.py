"""Policy `attestations.watermark.message`: a watermark attestation counts only for the message it commits to.

A release's mark carries a message (`modelsec watermark embed -m release-2`); its attestation records only a
commitment to it, keyed by the watermark key (`WatermarkKey.message_commitment`). Without `message`, an
attestation of another release's message (`release-1` re-used for a different build) satisfies the policy;
with it, that attestation is ignored (naming the field) and the requirement fails closed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import KeyMaterialError, PolicyError
from modelsec.policy import PolicySet, WatermarkRequirement
from modelsec.verifier import verify_attestations
from modelsec.watermark import WatermarkKey, load_key_file
from tests.unit.verifier.test_joint_verification import (
    NOW,
    _bundles,
    setup,  # noqa: F401  (fixture)
    watermark_predicate,
)

FIELD = "attestations.watermark.message"


def _key(tmp_path: Path, name: str = "wm.key") -> tuple[Path, WatermarkKey]:
    path = tmp_path / name
    path.write_text(os.urandom(32).hex() + "\n")
    return path, load_key_file(path)


def _watermark(tmp_path: Path, **section: Any) -> WatermarkRequirement | None:
    """The watermark requirement of a one-policy file whose `attestations.watermark` is `section`."""
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "prod",
                "match": ["file:///models/**"],
                "keys": [str(tmp_path / "trusted.pub.pem")],
                "attestations": {"watermark": section},
            }
        ],
    }
    return PolicySet.from_mapping(doc, base_dir=tmp_path, source="policy.yaml").policies[0].watermark


@pytest.fixture
def trusted(tmp_path: Path, key_dir: Path) -> Path:
    (tmp_path / "trusted.pub.pem").write_bytes((key_dir / "ecdsa-p256.pub.pem").read_bytes())
    return tmp_path


def _attestation(setup: dict[str, Any], commitment: str, embedded_at: str | None = None) -> bytes:  # noqa: F811
    predicate = watermark_predicate()
    predicate["messageCommitment"]["value"] = commitment
    if embedded_at is not None:
        predicate["embeddedAt"] = embedded_at
    return setup["attest"]("watermark", predicate)  # type: ignore[no-any-return]


def _verdict(setup: dict[str, Any], wm: bytes, req: WatermarkRequirement | None, *extra: bytes) -> Any:  # noqa: F811
    policy = setup["policy"] if req is None else dataclasses.replace(setup["policy"], watermark=req)
    return verify_attestations(setup["root"], _bundles(setup, wm=wm, extra=list(extra)), policy, now=NOW)


@pytest.mark.parametrize(
    ("policy_message", "attested", "same_key", "accepted"),
    [
        ("release-2", b"release-2", True, True),
        ("hex:72656c656173652d32", b"release-2", True, True),  # the `embed -m` encoding, hex form
        ("release-2", b"release-1", True, False),  # another release's message, the right key
        ("release-2", b"release-2", False, False),  # the right message, committed under another key
        ("Release-2", b"release-2", True, False),
    ],
)
def test_message_selects_the_attestation(
    setup: dict[str, Any],  # noqa: F811
    trusted: Path,
    policy_message: str,
    attested: bytes,
    same_key: bool,
    accepted: bool,
) -> None:
    key_file, key = _key(trusted)
    signer_key = key if same_key else _key(trusted, "other.key")[1]
    wm = _attestation(setup, signer_key.message_commitment(attested))
    req = _watermark(trusted, keyFile="wm.key", message=policy_message)
    assert req is not None and req.key_file == key_file
    verdict = _verdict(setup, wm, req)
    assert verdict.ok is accepted, verdict.reasons()
    if not accepted:
        # Ignored (not a veto) with the field named; with no other record the requirement fails closed.
        assert verdict.missing == ("watermark: no watermark attestation",)
        assert not verdict.refused
        assert any(FIELD in line for line in verdict.ignored), verdict.ignored
    # Without the policy field, the same attestation is accepted (what a re-used message got through before).
    assert _verdict(setup, wm, _watermark(trusted, keyFile="wm.key")).ok


def test_a_newer_record_of_another_message_does_not_hide_the_right_one(
    setup: dict[str, Any],  # noqa: F811
    trusted: Path,
) -> None:
    _, key = _key(trusted)
    right = _attestation(setup, key.message_commitment(b"release-2"), "2026-11-01T00:00:00Z")
    newer = _attestation(setup, key.message_commitment(b"release-1"), "2026-11-20T00:00:00Z")
    req = _watermark(trusted, keyFile="wm.key", message="release-2")
    verdict = _verdict(setup, right, req, newer)
    assert verdict.ok, verdict.reasons()
    assert any(FIELD in line for line in verdict.ignored)
    # Without `message` the newer record decides (and passes): the message is not looked at.
    assert _verdict(setup, right, _watermark(trusted, keyFile="wm.key"), newer).ok


@pytest.mark.parametrize(
    ("section", "error", "match"),
    [
        ({"message": "release-2"}, PolicyError, r"attestations\.watermark: message needs keyFile"),
        ({"keyFile": "wm.key", "message": ""}, PolicyError, r"attestations\.watermark\.message"),
        ({"keyFile": "wm.key", "message": 2}, PolicyError, r"attestations\.watermark\.message"),
        ({"keyFile": "wm.key", "message": "hex:zz"}, PolicyError, r"attestations\.watermark\.message: .*hex"),
        ({"keyFile": "absent.key", "message": "r"}, KeyMaterialError, r"attestations\.watermark\.keyFile: "),
        ({"keyFile": "trusted.pub.pem", "message": "r"}, KeyMaterialError, r"watermark\.keyFile: .*PEM"),
    ],
)
def test_bad_message_sections_are_refused_at_load(
    trusted: Path, section: dict[str, Any], error: type[Exception], match: str
) -> None:
    _key(trusted)
    with pytest.raises(error, match=match):
        _watermark(trusted, **section)


def test_message_is_optional_and_keyfile_alone_is_unchanged(trusted: Path) -> None:
    req = _watermark(trusted, keyFile="absent.key")  # a path only: not read without `message`
    assert req is not None and req.message_commitment is None
    assert _watermark(trusted, required=False, keyFile="wm.key", message="x") is None
