"""A signing certificate asserting CA:TRUE (issue 27, 8): refused by default, saying why and what accepts it.

model_signing's own test certificates sign with a leaf whose basicConstraints say `CA:TRUE`; the end-entity
profile (RFC 5280 section 4.2.1.9, CA/B Forum) refuses such a leaf. The strict default stays; the refusal
names the problem and the per-authority setting `allowCaLeaf`, which accepts such a leaf only when its key
usage has digitalSignature and its extended key usage codeSigning. Real chains (`tests.support.pki`), real
model_signing certificate bundles, the CLI in-process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.conftest import run_cli, write_tiny_model
from tests.support.pki import KEY_USAGE_NONE, Issued, Pki, corp_policy_doc, make_leaf, write_pem

signing = pytest.importorskip("model_signing.signing", reason="model_signing is the reference signer")

pytestmark = pytest.mark.integration

# KeyUsage(digital_signature, content_commitment, key_encipherment, data_encipherment, key_agreement,
# key_cert_sign, crl_sign, encipher_only, decipher_only)
CA_USAGE = x509.KeyUsage(True, False, False, False, False, True, True, False, False)
CERT_SIGN_ONLY = x509.KeyUsage(False, False, False, False, False, True, True, False, False)


def _signed_model(tmp_path: Path, pki: Pki, leaf: Issued) -> Path:
    model = write_tiny_model(tmp_path / "m")
    signing.Config().use_certificate_signer(
        private_key=leaf.key_pem(tmp_path / "leaf.key.pem"),
        signing_certificate=write_pem(tmp_path / "leaf.pem", leaf.cert),
        certificate_chain=[write_pem(tmp_path / "chain.pem", pki.intermediate.cert, pki.root.cert)],
    ).sign(model, model / "model.sig")
    return model


def _verify(tmp_path: Path, pki: Pki, model: Path, *, allow_ca_leaf: bool | None) -> dict[str, Any]:
    write_pem(tmp_path / "root.pem", pki.root.cert)
    doc = corp_policy_doc("root.pem", roles=["weights"])
    if allow_ca_leaf is not None:
        doc["policies"][0]["authorities"][0]["x509"]["allowCaLeaf"] = allow_ca_leaf
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(doc))
    r = run_cli("verify", model, "--policy", policy, "--json")
    out: dict[str, Any] = json.loads(r.stdout)
    assert (r.returncode == 0) == out["ok"], r
    return out


@pytest.mark.parametrize("allow", [None, False])
def test_a_ca_leaf_is_refused_by_default_saying_why_and_what_accepts_it(
    tmp_path: Path, pki: Pki, allow: bool | None
) -> None:
    model = _signed_model(tmp_path, pki, make_leaf(pki.intermediate, ca=True, key_usage=CA_USAGE))
    out = _verify(tmp_path, pki, model, allow_ca_leaf=allow)
    assert out["ok"] is False and out["error"]["kind"] == "SignatureError"
    message = out["error"]["message"]
    assert "corp-ca: the signing certificate asserts CA:TRUE (basicConstraints)" in message
    assert "set `allowCaLeaf: true` in the x509 of authority 'corp-ca'" in message


@pytest.mark.parametrize("usage", [CA_USAGE, None], ids=["keyCertSign-too", "digitalSignature-only"])
def test_allow_ca_leaf_accepts_a_code_signing_ca_leaf(
    tmp_path: Path, pki: Pki, usage: x509.KeyUsage | None
) -> None:
    model = _signed_model(tmp_path, pki, make_leaf(pki.intermediate, ca=True, key_usage=usage))
    out = _verify(tmp_path, pki, model, allow_ca_leaf=True)
    assert out["ok"] is True, out
    assert [b["key"] for b in out["bundles"]] == ["corp-ca: release@corp.example"]


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"key_usage": CERT_SIGN_ONLY}, "its key usage does not include digitalSignature"),
        ({"key_usage": KEY_USAGE_NONE}, "has no key usage (digitalSignature needed)"),
        ({"eku": (ExtendedKeyUsageOID.SERVER_AUTH,)}, "its extended key usage does not include code signing"),
    ],
    ids=["no-digitalSignature", "no-keyUsage", "no-codeSigning"],
)
def test_allow_ca_leaf_still_needs_digital_signature_and_code_signing(
    tmp_path: Path, pki: Pki, options: dict[str, Any], why: str
) -> None:
    model = _signed_model(tmp_path, pki, make_leaf(pki.intermediate, ca=True, **options))
    out = _verify(tmp_path, pki, model, allow_ca_leaf=True)
    assert out["ok"] is False and out["error"]["kind"] == "SignatureError"
    message = out["error"]["message"]
    assert "corp-ca: the signing certificate (CA:TRUE, accepted by allowCaLeaf)" in message
    assert why in message


def test_allow_ca_leaf_leaves_ordinary_leaves_as_they_were(tmp_path: Path, pki: Pki) -> None:
    model = _signed_model(tmp_path, pki, make_leaf(pki.intermediate))
    assert _verify(tmp_path, pki, model, allow_ca_leaf=True)["ok"] is True
    # An end-entity leaf with keyCertSign is still held to the end-entity profile.
    model = _signed_model(tmp_path / "ksign", pki, make_leaf(pki.intermediate, key_usage=CA_USAGE))
    out = _verify(tmp_path, pki, model, allow_ca_leaf=True)
    assert out["ok"] is False and "keyCertSign" in out["error"]["message"]
