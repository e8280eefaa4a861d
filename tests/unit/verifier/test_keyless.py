"""Keyless Sigstore bundles verified offline through a `sigstore` authority (DESIGN.md decision 12).

The vector is sigstore-python's own test asset (`tests/vectors/sigstore/`, see tests/vectors/README.md): a
real Sigstore *staging* DSSE bundle (Fulcio certificate, Rekor v2 entry, RFC 3161 timestamp). It is not a
model bundle, so the signature and identity layer is tested directly (`verify_bundle_signature`).
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path

import pytest

pytest.importorskip(
    "sigstore", reason="the keyless tests need the sigstore package (pip install .[sigstore])"
)

from modelsec.attestations.bundle import parse_bundle
from modelsec.errors import MalformedArtifactError, PolicyError, SignatureError
from modelsec.policy import IdentityRule, PolicySet, SigstoreAuthority
from modelsec.verifier.trust.bundles import verify_bundle_signature

VECTOR = (
    Path(__file__).resolve().parents[2] / "vectors" / "sigstore" / "a.dsse.staging-rekor-v2.txt.sigstore.json"
)
IDENTITY = (
    "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
    "extremely-dangerous-oidc-beacon.yml@refs/heads/main"
)
ISSUER = "https://token.actions.githubusercontent.com"


def _authority(
    identity: str | None = IDENTITY,
    issuer: str | None = ISSUER,
    *,
    root: str = "staging",
    identity_regexp: str | None = None,
) -> SigstoreAuthority:
    rule = IdentityRule(
        identity=identity,
        identity_regexp=re.compile(identity_regexp) if identity_regexp else None,
        issuer=issuer,
    )
    return SigstoreAuthority("sigstage", root, (rule,), frozenset({"weights"}))


def _verify(doc: dict[str, object], authority: SigstoreAuthority, role: str | None = "weights") -> str:
    bundle = parse_bundle(json.dumps(doc).encode(), source="a.sigstore.json")
    return verify_bundle_signature(bundle, [], authorities=[authority], role=role).name


@pytest.fixture
def doc() -> dict[str, object]:
    return json.loads(VECTOR.read_bytes())


def test_verifies_offline_with_its_identity_and_issuer(doc: dict[str, object]) -> None:
    name = _verify(doc, _authority())
    assert name.startswith("sigstage: ") and IDENTITY in name


def test_identity_regexp_must_match_in_full(doc: dict[str, object]) -> None:
    assert _verify(doc, _authority(None, identity_regexp=r"https://github\.com/sigstore-conformance/.*"))
    with pytest.raises(SignatureError, match="not an identity the policy trusts"):
        _verify(doc, _authority(None, identity_regexp=r"https://github\.com/sigstore-conformance/"))


def test_wrong_identity_refused(doc: dict[str, object]) -> None:
    with pytest.raises(SignatureError, match="not an identity the policy trusts"):
        _verify(doc, _authority(IDENTITY.replace("main", "evil")))


def test_wrong_issuer_refused(doc: dict[str, object]) -> None:
    with pytest.raises(SignatureError, match="not an identity the policy trusts"):
        _verify(doc, _authority(issuer="https://accounts.google.com"))


def test_authority_without_the_role_is_not_tried(doc: dict[str, object]) -> None:
    with pytest.raises(SignatureError, match="may sign 'gate'"):
        _verify(doc, _authority(), role="gate")


def test_tampered_payload_refused(doc: dict[str, object]) -> None:
    env = doc["dsseEnvelope"]
    assert isinstance(env, dict)
    payload = base64.b64decode(env["payload"])
    env["payload"] = base64.b64encode(payload.replace(b"a.txt", b"b.txt")).decode()
    with pytest.raises(SignatureError, match="keyless verification failed"):
        _verify(doc, _authority())


def test_altered_inclusion_proof_refused(doc: dict[str, object]) -> None:
    material = doc["verificationMaterial"]
    assert isinstance(material, dict)
    proof = material["tlogEntries"][0]["inclusionProof"]
    first = bytearray(base64.b64decode(proof["hashes"][0]))
    first[0] ^= 1
    proof["hashes"][0] = base64.b64encode(bytes(first)).decode()
    with pytest.raises(SignatureError, match="keyless verification failed"):
        _verify(doc, _authority())


def test_staging_root_without_its_fulcio_ca_refuses_the_chain(doc: dict[str, object], tmp_path: Path) -> None:
    import importlib.resources

    staging = importlib.resources.files("sigstore._store") / "https%3A%2F%2Ftuf-repo-cdn.sigstage.dev"
    production = importlib.resources.files("sigstore._store") / "https%3A%2F%2Ftuf-repo-cdn.sigstore.dev"
    root = json.loads((staging / "trusted_root.json").read_bytes())
    # Everything of staging (logs, CT, TSA) except its Fulcio CA, which is replaced by production's.
    root["certificateAuthorities"] = copy.deepcopy(
        json.loads((production / "trusted_root.json").read_bytes())["certificateAuthorities"]
    )
    path = tmp_path / "trusted_root.json"
    path.write_text(json.dumps(root))
    with pytest.raises(SignatureError, match="keyless verification failed") as e:
        _verify(doc, _authority(root=str(path)))
    message = str(e.value)
    # A path-building failure (no Fulcio CA signs the leaf), not a validity-period one.
    assert "certificate chain" in message and "candidates exhausted" in message
    assert "expired" not in message and "not valid" not in message


def test_production_root_refuses_a_staging_bundle(doc: dict[str, object]) -> None:
    with pytest.raises(SignatureError, match="keyless verification failed"):
        _verify(doc, _authority(root="production"))


def test_pinned_keys_alone_refuse_a_keyless_bundle(doc: dict[str, object]) -> None:
    bundle = parse_bundle(json.dumps(doc).encode(), source="a.sigstore.json")
    with pytest.raises(SignatureError):
        verify_bundle_signature(bundle, [], authorities=[])


def test_malformed_certificate_material_is_named(doc: dict[str, object]) -> None:
    doc["verificationMaterial"]["certificate"]["rawBytes"] = "not base64!"  # type: ignore[index]
    with pytest.raises(MalformedArtifactError, match=r"verificationMaterial\.certificate\[0\]\.rawBytes"):
        _verify(doc, _authority())


def test_bad_trusted_root_file_is_a_policy_error(doc: dict[str, object], tmp_path: Path) -> None:
    path = tmp_path / "trusted_root.json"
    path.write_text("{}")
    with pytest.raises(PolicyError, match="trusted root"):
        _verify(doc, _authority(root=str(path)))


def test_policy_file_with_a_sigstore_authority(doc: dict[str, object], tmp_path: Path) -> None:
    policy = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [
                {
                    "name": "keyless",
                    "match": ["file:///**"],
                    "authorities": [
                        {
                            "name": "sigstage",
                            "sigstore": {
                                "trustedRoot": "staging",
                                "identities": [{"identity": IDENTITY, "issuer": ISSUER}],
                            },
                        }
                    ],
                }
            ],
        },
        base_dir=tmp_path,
        source="policy.yaml",
    ).policies[0]
    assert policy.keys == ()
    bundle = parse_bundle(json.dumps(doc).encode(), source="a.sigstore.json")
    assert verify_bundle_signature(bundle, policy.keys, authorities=policy.authorities).name.startswith(
        "sigstage"
    )


def test_policy_without_keys_or_authorities_is_refused(tmp_path: Path) -> None:
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [{"name": "x", "match": ["*"]}],
    }
    with pytest.raises(PolicyError, match=r"policy.yaml: policies\[0\]: trusts nothing"):
        PolicySet.from_mapping(doc, base_dir=tmp_path, source="policy.yaml")


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        ({"identity": IDENTITY}, "needs issuer or issuerRegexp"),
        ({"identity": IDENTITY, "identityRegexp": ".*", "issuer": ISSUER}, "exactly one of identity"),
        ({"identity": IDENTITY, "issuer": ISSUER, "issuerRegexp": ".*"}, "issuer or issuerRegexp, not both"),
        ({"identityRegexp": "(", "issuer": ISSUER}, "not a regular expression"),
    ],
)
def test_sigstore_identity_rules_are_validated(
    identity: dict[str, str], message: str, tmp_path: Path
) -> None:
    authority = {"name": "s", "sigstore": {"identities": [identity]}}
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [{"name": "x", "match": ["*"], "authorities": [authority]}],
    }
    with pytest.raises(PolicyError, match=re.escape(message)):
        PolicySet.from_mapping(doc, base_dir=tmp_path, source="policy.yaml")
