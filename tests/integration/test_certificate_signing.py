"""Certificate signing (issue 29.5): `sign --signing-key K --signing-certificate LEAF [--certificate-chain]`.

modelsec writes model_signing's certificate-mode bundle (the x509 chain in the verification material); the
released model_signing 1.1.1 CLI (`verify certificate`, in its own venv) and modelsec (an X.509 authority of a
policy) accept it, and both refuse it under another root. modelsec's identity rules refuse another identity
(model_signing 1.1.1's `verify certificate` has no identity option: only the chain). PEM and `pkcs11:` keys;
real certificates (`tests.support.pki`); the modelsec CLI in-process.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.conftest import run_cli, write_tiny_model
from tests.integration._ms_venvs import VenvUnavailable, python_for
from tests.support.pki import Pki, corp_policy_doc, make_ca, make_leaf, write_pem
from tests.support.softhsm import Token

pytestmark = pytest.mark.integration


def _model_signing_verify(model: Path, root: Path) -> subprocess.CompletedProcess[str]:
    try:
        python = python_for("1.1.1")
    except VenvUnavailable as e:
        pytest.skip(str(e))
    # The venv's own interpreter runs the released CLI (`python -m model_signing`, its console script).
    return subprocess.run(
        [str(python), "-m", "model_signing", "verify", "certificate", str(model),
         "--signature", str(model / "model.sig"),
         "--certificate_chain", str(root)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _policy(tmp_path: Path, root: Path, identity: dict[str, str] | None = None) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(corp_policy_doc(root, identity, roles=["weights"])))
    return path


def _chain_in_bundle(model: Path) -> list[x509.Certificate]:
    doc = json.loads((model / "model.sig").read_text())
    raw = doc["verificationMaterial"]["x509CertificateChain"]["certificates"]
    return [x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"])) for c in raw]


def test_pem_key_certificate_bundle_verifies_with_model_signing_and_modelsec(
    tmp_path: Path, pki: Pki
) -> None:
    model = write_tiny_model(tmp_path / "m", seed=81)
    key = pki.leaf.key_pem(tmp_path / "leaf.key.pem")
    leaf = write_pem(tmp_path / "leaf.pem", pki.leaf.cert)
    chain = write_pem(tmp_path / "chain.pem", pki.intermediate.cert)
    root = write_pem(tmp_path / "root.pem", pki.root.cert)
    r = run_cli(
        "sign",
        model,
        "--signing-key",
        key,
        "--signing-certificate",
        leaf,
        "--certificate-chain",
        chain,
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert _chain_in_bundle(model) == [pki.leaf.cert, pki.intermediate.cert]
    assert "publicKey" not in json.loads((model / "model.sig").read_text())["verificationMaterial"]

    ms = _model_signing_verify(model, root)
    assert ms.returncode == 0, ms.stdout + ms.stderr
    v = run_cli("verify", model, "--policy", _policy(tmp_path, root), "--json")
    assert v.returncode == 0, v.stdout
    assert [b["key"] for b in json.loads(v.stdout)["bundles"]] == ["corp-ca: release@corp.example"]

    # Another root: both refuse.
    other = write_pem(tmp_path / "other-root.pem", make_ca("other root").cert)
    refused_ms = _model_signing_verify(model, other)
    assert refused_ms.returncode != 0 and "unable to get local issuer certificate" in refused_ms.stderr, (
        refused_ms.stderr
    )
    refused = run_cli("verify", model, "--policy", _policy(tmp_path, other), "--json")
    assert refused.returncode == 1 and json.loads(refused.stdout)["error"]["kind"] == "SignatureError"
    # Another identity: modelsec's rules refuse (model_signing 1.1.1 has no identity check).
    wrong = run_cli(
        "verify", model, "--policy", _policy(tmp_path, root, {"san": "ops@corp.example"}), "--json"
    )
    assert wrong.returncode == 1
    error = json.loads(wrong.stdout)["error"]
    assert error["kind"] == "SignatureError" and "release@corp.example" in error["message"]


def test_pkcs11_key_certificate_bundle_verifies_with_modelsec(
    tmp_path: Path, pki: Pki, softhsm_token: Token
) -> None:
    public = serialization.load_pem_public_key(softhsm_token.public_key("release").read_bytes())
    issued = make_leaf(pki.intermediate, key=None)
    # A leaf for the token's key: the CA signs the token's public key (the private key never leaves it).
    cert = (
        x509.CertificateBuilder()
        .subject_name(issued.cert.subject)
        .issuer_name(issued.cert.issuer)
        .public_key(public)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(issued.cert.not_valid_before_utc)
        .not_valid_after(issued.cert.not_valid_after_utc)
    )
    for ext in issued.cert.extensions:
        cert = cert.add_extension(ext.value, ext.critical)
    from cryptography.hazmat.primitives import hashes

    leaf = write_pem(tmp_path / "leaf.pem", cert.sign(pki.intermediate.key, hashes.SHA256()))
    chain = write_pem(tmp_path / "chain.pem", pki.intermediate.cert)
    root = write_pem(tmp_path / "root.pem", pki.root.cert)
    model = write_tiny_model(tmp_path / "m", seed=82)
    r = run_cli(
        "sign", model, "--signing-key", softhsm_token.uri(), "--signing-certificate", leaf,
        "--certificate-chain", chain, "--json", env=softhsm_token.env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    v = run_cli("verify", model, "--policy", _policy(tmp_path, root), "--json")
    assert v.returncode == 0, v.stdout


def test_a_certificate_of_another_key_is_refused_and_nothing_written(tmp_path: Path, pki: Pki) -> None:
    model = write_tiny_model(tmp_path / "m", seed=83)
    key = make_leaf(pki.intermediate).key_pem(tmp_path / "other.key.pem")
    leaf = write_pem(tmp_path / "leaf.pem", pki.leaf.cert)
    r = run_cli("sign", model, "--signing-key", key, "--signing-certificate", leaf, "--json")
    assert r.returncode == 1
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "KeyMaterialError" and "public key" in error["message"]
    assert not (model / "model.sig").exists()
    not_pem = tmp_path / "junk.pem"
    not_pem.write_text("junk")
    r = run_cli("sign", model, "--signing-key", key, "--signing-certificate", not_pem, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["kind"] == "KeyMaterialError"
    usage = run_cli("sign", model, "--signing-key", key, "--certificate-chain", leaf)
    assert usage.returncode == 2 and "--signing-certificate" in usage.stderr
