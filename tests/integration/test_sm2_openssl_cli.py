"""Interop of modelsec's SM2 keys and signatures with the `openssl` command-line tool (OpenSSL >= 3.0)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from asn1crypto import keys

from modelsec.errors import KeyMaterialError, SignatureError
from modelsec.signer.schemes.sm2 import api as sm2
from modelsec.signer.schemes.sm2.api import DEFAULT_DISTID, Sm2PrivateKey, Sm2PublicKey

pytestmark = pytest.mark.integration

DISTID_OPT = ["-pkeyopt", "distid:" + DEFAULT_DISTID.decode()]
PASSWORD = b"interop passphrase"


def _openssl(
    *args: str | Path, input: bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["openssl", *map(str, args)], input=input, capture_output=True, check=check, timeout=30
    )


@pytest.fixture(scope="module", autouse=True)
def _require_openssl3_with_sm2() -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    version = _openssl("version").stdout.decode()
    match = re.match(r"OpenSSL (\d+)\.", version)
    if not match or int(match.group(1)) < 3:
        pytest.skip(f"needs OpenSSL >= 3.0 (found {version.strip()!r})")
    if _openssl("genpkey", "-algorithm", "SM2", check=False).returncode != 0:
        pytest.skip("this openssl has no SM2")


@pytest.fixture(scope="module")
def key() -> Sm2PrivateKey:
    return sm2.generate_private_key()


@pytest.fixture(scope="module")
def openssl_key_pem() -> bytes:
    return _openssl("genpkey", "-algorithm", "SM2").stdout


@pytest.fixture(params=["openssl", "gmssl"])
def backend(request: pytest.FixtureRequest) -> sm2.Sm2Backend:
    return sm2.backend_by_name(request.param)


def test_openssl_cli_verifies_our_signatures(
    tmp_path: Path, key: Sm2PrivateKey, backend: sm2.Sm2Backend
) -> None:
    message = b"DSSEv1 28 application/vnd.in-toto+json 2 {}"
    (tmp_path / "pub.pem").write_bytes(key.public_key.to_pem())
    (tmp_path / "msg").write_bytes(message)
    (tmp_path / "sig").write_bytes(backend.sign(key, message))
    verify = ["pkeyutl", "-verify", "-pubin", "-inkey", tmp_path / "pub.pem", "-rawin", "-digest", "sm3"]
    ok = _openssl(*verify, *DISTID_OPT, "-in", tmp_path / "msg", "-sigfile", tmp_path / "sig")
    assert b"Signature Verified Successfully" in ok.stdout
    (tmp_path / "msg").write_bytes(message + b" ")
    bad = _openssl(*verify, *DISTID_OPT, "-in", tmp_path / "msg", "-sigfile", tmp_path / "sig", check=False)
    assert bad.returncode != 0


def test_we_verify_openssl_cli_signatures(
    tmp_path: Path, openssl_key_pem: bytes, backend: sm2.Sm2Backend
) -> None:
    (tmp_path / "key.pem").write_bytes(openssl_key_pem)
    (tmp_path / "msg").write_bytes(b"signed by the openssl CLI")
    sign = [
        "pkeyutl",
        "-sign",
        "-inkey",
        tmp_path / "key.pem",
        "-rawin",
        "-digest",
        "sm3",
        "-in",
        tmp_path / "msg",
    ]
    signature = _openssl(*sign, *DISTID_OPT).stdout
    public = Sm2PrivateKey.from_pem(openssl_key_pem).public_key
    backend.verify(public, b"signed by the openssl CLI", signature)
    with pytest.raises(SignatureError):
        backend.verify(public, b"signed by the openssl CLI!", signature)
    # Without -pkeyopt distid, OpenSSL 3 signs with an empty ID: it does not verify under the default ID
    # (the reason decision 2 sets the ID explicitly).
    empty_id = _openssl(*sign).stdout
    with pytest.raises(SignatureError):
        backend.verify(public, b"signed by the openssl CLI", empty_id)
    backend.verify(public, b"signed by the openssl CLI", empty_id, b"")


def test_openssl_pkey_reproduces_our_pem_byte_for_byte(tmp_path: Path, key: Sm2PrivateKey) -> None:
    (tmp_path / "key.pem").write_bytes(key.to_pem())
    (tmp_path / "pub.pem").write_bytes(key.public_key.to_pem())
    assert _openssl("pkey", "-in", tmp_path / "key.pem").stdout == key.to_pem()
    assert _openssl("pkey", "-in", tmp_path / "key.pem", "-pubout").stdout == key.public_key.to_pem()
    assert (
        _openssl("pkey", "-pubin", "-in", tmp_path / "pub.pem", "-pubout").stdout == key.public_key.to_pem()
    )
    # `openssl pkey -outform DER` writes SEC 1 (traditional) DER, not PKCS#8; PKCS#8 DER comes from pkcs8.
    pkcs8_der = _openssl("pkcs8", "-topk8", "-nocrypt", "-in", tmp_path / "key.pem", "-outform", "DER").stdout
    assert pkcs8_der == key.to_der()
    pub_der = _openssl("pkey", "-pubin", "-in", tmp_path / "pub.pem", "-outform", "DER").stdout
    assert pub_der == key.public_key.to_der()


def test_openssl_generated_key_round_trips_byte_for_byte(tmp_path: Path, openssl_key_pem: bytes) -> None:
    (tmp_path / "key.pem").write_bytes(openssl_key_pem)
    canonical = _openssl("pkey", "-in", tmp_path / "key.pem").stdout
    ours = Sm2PrivateKey.from_pem(openssl_key_pem)
    assert ours.to_pem() == canonical == openssl_key_pem
    pub_pem = _openssl("pkey", "-in", tmp_path / "key.pem", "-pubout").stdout
    assert ours.public_key.to_pem() == pub_pem
    assert Sm2PublicKey.from_pem(pub_pem) == ours.public_key
    # `openssl ec` writes SEC 1 ("SM2 PRIVATE KEY" with the curve in [0]); it is the same key.
    sec1 = _openssl("ec", "-in", tmp_path / "key.pem").stdout
    assert Sm2PrivateKey.from_pem(sec1) == ours


@pytest.mark.slow
def test_openssl_reads_our_encrypted_key(tmp_path: Path, key: Sm2PrivateKey) -> None:
    (tmp_path / "enc.pem").write_bytes(key.to_pem(PASSWORD))
    out = _openssl("pkey", "-in", tmp_path / "enc.pem", "-passin", "pass:" + PASSWORD.decode()).stdout
    assert out == key.to_pem()
    wrong = _openssl("pkey", "-in", tmp_path / "enc.pem", "-passin", "pass:wrong", check=False)
    assert wrong.returncode != 0


@pytest.mark.parametrize(
    "args",
    [
        ["pkey", "-aes256"],
        ["pkcs8", "-topk8", "-v2", "aes-128-cbc", "-v2prf", "hmacWithSHA512"],
        ["pkcs8", "-topk8", "-scrypt"],
        ["pkcs8", "-topk8", "-v2", "sm4-cbc"],  # GM/T PKCS#8: PBES2 with SM4-CBC (issue 15)
    ],
    ids=["pkey-aes256", "pkcs8-aes128-sha512", "pkcs8-scrypt", "pkcs8-sm4-cbc"],
)
def test_we_read_openssl_encrypted_keys(tmp_path: Path, openssl_key_pem: bytes, args: list[str]) -> None:
    (tmp_path / "key.pem").write_bytes(openssl_key_pem)
    enc = _openssl(*args, "-in", tmp_path / "key.pem", "-passout", "pass:" + PASSWORD.decode()).stdout
    assert enc.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert Sm2PrivateKey.from_pem(enc, PASSWORD) == Sm2PrivateKey.from_pem(openssl_key_pem)


def test_sm4_cbc_encrypted_key_refuses_a_wrong_password(tmp_path: Path, openssl_key_pem: bytes) -> None:
    (tmp_path / "key.pem").write_bytes(openssl_key_pem)
    enc = _openssl(
        "pkcs8", "-topk8", "-v2", "sm4-cbc", "-in", tmp_path / "key.pem", "-passout", "pass:right"
    ).stdout
    with pytest.raises(KeyMaterialError, match="wrong password"):
        Sm2PrivateKey.from_pem(enc, b"wrong")


def test_curve_parameters_match_openssl() -> None:
    der = _openssl("ecparam", "-name", "SM2", "-param_enc", "explicit", "-outform", "DER").stdout
    # X9.62 ECParameters { version, fieldID { prime-field, p }, curve { a, b, seed? }, base, order, cofactor }
    params = keys.ECDomainParameters.load(der)
    assert params.name == "specified"
    domain = params.chosen
    assert domain["version"].native == "ecdpVer1"
    assert domain["field_id"]["field_type"].dotted == "1.2.840.10045.1.1"
    assert domain["field_id"]["parameters"].native == sm2.SM2_P
    assert int.from_bytes(domain["curve"]["a"].contents, "big") == sm2.SM2_A
    assert int.from_bytes(domain["curve"]["b"].contents, "big") == sm2.SM2_B
    base = domain["base"].contents
    assert base == b"\x04" + sm2.SM2_GX.to_bytes(32, "big") + sm2.SM2_GY.to_bytes(32, "big")
    assert domain["order"].native == sm2.SM2_ORDER
    assert domain["cofactor"].native == 1
