"""Certificate trust end to end: model_signing's `certificate` method, verified through an X.509 authority.

A root CA, an intermediate and leaves are made here with `cryptography`; model_signing 1.1.1 signs the model
with the leaf (its bundle carries leaf + intermediate + root as `x509CertificateChain`), and modelsec
verifies it only through the root named in the policy (DESIGN.md decision 12).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from modelsec.errors import PolicyError, SignatureError
from modelsec.policy import Policy, PolicySet
from modelsec.verifier import verify_model
from tests.conftest import run_cli, write_tiny_model
from tests.x509_support import NOW, SAN, Issued, corp_policy_doc
from tests.x509_support import make_ca as _ca
from tests.x509_support import make_leaf as _leaf
from tests.x509_support import write_pem as _pem

signing = pytest.importorskip("model_signing.signing", reason="model_signing is the reference signer")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki() -> tuple[Issued, Issued]:
    root = _ca("corp root")
    return root, _ca("corp signing intermediate", root)


def _sign(tmp_path: Path, leaf: Issued, chain: list[x509.Certificate]) -> Path:
    model = write_tiny_model(tmp_path / "m")
    key = tmp_path / "leaf.key.pem"
    key.write_bytes(
        leaf.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    signing.Config().use_certificate_signer(
        private_key=key,
        signing_certificate=_pem(tmp_path / "leaf.pem", leaf.cert),
        certificate_chain=[_pem(tmp_path / "chain.pem", *chain)],
    ).sign(model, model / "model.sig")
    return model


def _policy(tmp_path: Path, root: x509.Certificate, identity: dict[str, str]) -> Policy:
    _pem(tmp_path / "root.pem", root)
    doc = corp_policy_doc("root.pem", identity, roles=["weights"])
    return PolicySet.from_mapping(doc, base_dir=tmp_path, source="policy.yaml").policies[0]


Setup = Callable[..., tuple[Path, Policy]]


@pytest.fixture
def setup(tmp_path: Path, pki: tuple[Issued, Issued]) -> Setup:
    root, intermediate = pki

    def make(identity: dict[str, str] | None = None, **leaf_options: object) -> tuple[Path, Policy]:
        leaf = _leaf(intermediate, **leaf_options)  # type: ignore[arg-type]
        model = _sign(tmp_path, leaf, [intermediate.cert, root.cert])
        return model, _policy(tmp_path, root.cert, identity or {"san": SAN})

    return make


def test_model_signing_certificate_bundle_verifies_through_the_root(setup: Setup) -> None:
    model, policy = setup()
    verified = verify_model(model, policy)
    signed = {p.name for p in model.rglob("*") if p.is_file()} - {"model.sig"}
    assert verified.files == len(signed) and verified.bundles[0].key.name == f"corp-ca: {SAN}"


def test_san_regexp(setup: Setup) -> None:
    model, policy = setup({"sanRegexp": r".*@corp\.example"})
    assert verify_model(model, policy).bundles[0].key.name.startswith("corp-ca: ~.*@corp")


def test_untrusted_root_refused(setup: Setup, tmp_path: Path) -> None:
    model, _ = setup()
    # The bundle carries its own root: believed only if the policy names it.
    other = _policy(tmp_path, _ca("other root").cert, {"san": SAN})
    with pytest.raises(SignatureError, match="does not verify to a configured root"):
        verify_model(model, other)


def test_wrong_san_refused(setup: Setup) -> None:
    model, policy = setup(san="intern@corp.example")
    with pytest.raises(SignatureError, match=r"intern@corp\.example.*not an identity the policy trusts"):
        verify_model(model, policy)


def test_expired_leaf_refused(setup: Setup) -> None:
    model, policy = setup(not_after=NOW - datetime.timedelta(minutes=1))
    with pytest.raises(SignatureError, match=r"does not verify to a configured root.*not valid at"):
        verify_model(model, policy)


def test_leaf_without_code_signing_refused(setup: Setup) -> None:
    model, policy = setup(eku=(ExtendedKeyUsageOID.EMAIL_PROTECTION,))
    with pytest.raises(SignatureError, match="does not include code signing"):
        verify_model(model, policy)


def test_pinned_keys_alone_refuse_a_certificate_bundle(setup: Setup, key_dir: Path) -> None:
    model, _ = setup()
    with pytest.raises(SignatureError):
        verify_model(model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]))


def test_authority_must_name_a_readable_root(tmp_path: Path) -> None:
    (tmp_path / "root.pem").write_text("not a certificate")
    with pytest.raises(PolicyError, match=r"authorities\[0\]\.x509\.roots\[0\]"):
        PolicySet.from_mapping(corp_policy_doc("root.pem"), base_dir=tmp_path, source="policy.yaml")


def test_cli_verify_with_a_policy_file(setup: Setup, tmp_path: Path) -> None:
    model, _ = setup()
    (tmp_path / "policy.json").write_text(json.dumps(corp_policy_doc("root.pem")))
    r = run_cli("verify", model, "--policy", tmp_path / "policy.json", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["bundles"][0]["key"] == f"corp-ca: {SAN}"
    (tmp_path / "root.pem").write_bytes(_ca("other root").cert.public_bytes(serialization.Encoding.PEM))
    r = run_cli("verify", model, "--policy", tmp_path / "policy.json", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["kind"] == "SignatureError"


def test_cli_certificate_chain_without_a_policy_file(setup: Setup, tmp_path: Path, key_dir: Path) -> None:
    """`--certificate-chain ROOT.pem [--identity SAN]`, as `model_signing verify certificate` is used."""
    model, _ = setup()
    root = tmp_path / "root.pem"  # written by `setup`
    r = run_cli("verify", model, "--certificate-chain", root, "--identity", SAN, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["bundles"][0]["key"] == f"certificate-chain: {SAN}"
    # Without --identity any code-signing leaf under the root is accepted (model_signing's rule); the
    # key name says which identity signed. model_signing's underscore spelling is accepted too.
    r = run_cli("verify", model, "--certificate-chain", root, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["bundles"][0]["key"] == f"certificate-chain: any identity ({SAN})"
    # Beside a pinned key that did not sign it, the certificate still decides.
    r = run_cli("verify", model, "--certificate-chain", root, "--trusted-key", key_dir / "ecdsa-p256.pub.pem")
    assert r.returncode == 0, r.stdout + r.stderr
    # Refusals: another identity; a root that is not the bundle's (its own root is never believed alone).
    r = run_cli("verify", model, "--certificate-chain", root, "--identity", "intern@corp.example", "--json")
    assert r.returncode == 1
    assert "not an identity the policy trusts" in json.loads(r.stdout)["error"]["message"]
    other = _pem(tmp_path / "other-root.pem", _ca("other root").cert)
    r = run_cli("verify", model, "--certificate-chain", other)
    assert r.returncode == 1 and "does not verify to a configured root" in r.stderr
    (tmp_path / "junk.pem").write_text("not a certificate")
    r = run_cli("verify", model, "--certificate-chain", tmp_path / "junk.pem", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["kind"] == "PolicyError"
    assert "--certificate-chain[0]" in json.loads(r.stdout)["error"]["message"]
