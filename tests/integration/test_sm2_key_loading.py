"""SM2 key files are read by OpenSSL, after modelsec's structure and KDF-cost checks; the fallback without
libcrypto 3 reads unencrypted keys with asn1crypto and refuses encrypted ones (issues 13 and 15)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from asn1crypto import core, keys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from modelsec.errors import KeyMaterialError, UnsupportedAlgorithmError
from modelsec.signer.schemes.sm2 import _asn1 as _sm2_asn1
from modelsec.signer.schemes.sm2 import _keys as _sm2_keys
from modelsec.signer.schemes.sm2 import _libcrypto as _sm2_libcrypto
from modelsec.signer.schemes.sm2 import api as sm2
from modelsec.signer.schemes.sm2.api import Sm2PrivateKey

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed"),
]

PASSWORD = b"gm/t passphrase"


def _openssl(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["openssl", *map(str, args)], capture_output=True, check=check, timeout=60)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sm2") / "key.pem"
    made = _openssl("genpkey", "-algorithm", "SM2", "-out", path, check=False)
    if made.returncode != 0:
        pytest.skip("this openssl has no SM2")
    return path


@pytest.fixture(scope="module")
def plain(key_file: Path) -> Sm2PrivateKey:
    return Sm2PrivateKey.from_pem(key_file.read_bytes())


def _encrypt(key_file: Path, *args: str, password: bytes = PASSWORD) -> bytes:
    return _openssl("pkcs8", "-topk8", *args, "-in", key_file, "-passout", "pass:" + password.decode()).stdout


def _der(pem: bytes) -> bytes:
    return base64.b64decode(b"".join(pem.strip().splitlines()[1:-1]))


@pytest.fixture
def no_libcrypto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The gmssl fallback: no libcrypto 3 is found (as on a system without OpenSSL 3)."""
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    monkeypatch.setattr(_sm2_libcrypto, "_CANDIDATES", ("libcrypto-does-not-exist.so.3",))
    _sm2_libcrypto._key_libcrypto.cache_clear()
    assert not _sm2_libcrypto.available()
    yield
    _sm2_libcrypto._key_libcrypto.cache_clear()


@pytest.fixture
def no_openssl_decrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object) -> None:
        raise AssertionError("OpenSSL was asked to decrypt a key whose header is out of bounds")

    monkeypatch.setattr(_sm2_libcrypto, "decrypt_pkcs8", forbidden)


# ---------------------------------------------------------------------------------------------------------
# Through OpenSSL
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["-v2", "aes-256-cbc"], ["-v2", "sm4-cbc"], ["-v2", "sm4-cbc", "-v2prf", "hmacWithSHA256"]],
    ids=["aes-256-cbc", "sm4-cbc", "sm4-cbc-sha256"],
)
def test_openssl_cli_encrypted_keys_load(key_file: Path, plain: Sm2PrivateKey, args: list[str]) -> None:
    loaded = Sm2PrivateKey.from_pem(_encrypt(key_file, *args), PASSWORD)
    assert loaded == plain and loaded.public_key == plain.public_key
    with pytest.raises(KeyMaterialError, match="wrong password"):
        Sm2PrivateKey.from_pem(_encrypt(key_file, *args), b"not the passphrase")


def test_sm4_cbc_hmac_with_sm3_where_openssl_knows_it(key_file: Path, plain: Sm2PrivateKey) -> None:
    made = _openssl(
        "pkcs8", "-topk8", "-v2", "sm4-cbc", "-v2prf", "hmacWithSM3", "-in", key_file,
        "-passout", "pass:" + PASSWORD.decode(), check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip("this openssl CLI does not know hmacWithSM3 (OpenSSL < 3.2)")
    assert Sm2PrivateKey.from_pem(made.stdout, PASSWORD) == plain


def _gmt_pkcs8(plain: Sm2PrivateKey, password: bytes, iterations: int = 2048) -> bytes:
    """PBES2 with PBKDF2-hmacWithSM3 and SM4-CBC (GM/T 0091-2020), built from the primitives."""
    salt, iv = b"\x01" * 16, b"\x02" * 16
    der = plain.to_der()
    pad = 16 - len(der) % 16
    key = hashlib.pbkdf2_hmac("sm3", password, salt, iterations, 16)
    enc = Cipher(algorithms.SM4(key), modes.CBC(iv)).encryptor()
    ciphertext = enc.update(der + bytes([pad]) * pad) + enc.finalize()
    tlv, oid = _sm2_asn1._tlv, _sm2_asn1._oid_der
    prf = tlv(0x30, oid(_sm2_asn1.OID_HMAC_WITH_SM3) + b"\x05\x00")
    pbkdf2 = tlv(0x30, tlv(0x04, salt) + core.Integer(iterations).dump() + prf)
    kdf = tlv(0x30, oid("1.2.840.113549.1.5.12") + pbkdf2)
    scheme = tlv(0x30, oid("1.2.156.10197.1.104.2") + tlv(0x04, iv))
    algorithm = tlv(0x30, oid("1.2.840.113549.1.5.13") + tlv(0x30, kdf + scheme))
    return _sm2_asn1._pem_encode("ENCRYPTED PRIVATE KEY", tlv(0x30, algorithm + tlv(0x04, ciphertext)))


def test_hmac_with_sm3_loads_or_is_refused_by_name(plain: Sm2PrivateKey) -> None:
    pem = _gmt_pkcs8(plain, PASSWORD)
    if _sm2_libcrypto.knows_oid(_sm2_asn1.OID_HMAC_WITH_SM3):
        assert Sm2PrivateKey.from_pem(pem, PASSWORD) == plain
    else:
        with pytest.raises(UnsupportedAlgorithmError, match=r"hmacWithSM3.*OpenSSL"):
            Sm2PrivateKey.from_pem(pem, PASSWORD)


def _with_iterations(pem: bytes, iterations: int) -> bytes:
    info = keys.EncryptedPrivateKeyInfo.load(_der(pem))
    params = info["encryption_algorithm"]["parameters"]["key_derivation_func"]["parameters"]
    params["iteration_count"] = iterations
    return _sm2_asn1._pem_encode("ENCRYPTED PRIVATE KEY", info.dump(force=True))


@pytest.mark.usefixtures("no_openssl_decrypt")
@pytest.mark.parametrize("iterations", [10_000_001, 2**31 - 1, 2**64])
def test_over_limit_iterations_refused_before_openssl(key_file: Path, iterations: int) -> None:
    pem = _with_iterations(_encrypt(key_file, "-v2", "sm4-cbc"), iterations)
    start = time.monotonic()
    with pytest.raises(KeyMaterialError, match="iteration count"):
        Sm2PrivateKey.from_pem(pem, PASSWORD)
    assert time.monotonic() - start < 1.0


@pytest.mark.usefixtures("no_openssl_decrypt")
def test_over_limit_scrypt_refused_before_openssl(key_file: Path) -> None:
    made = _openssl(
        "pkcs8", "-topk8", "-scrypt", "-scrypt_N", "1024", "-in", key_file, "-passout", "pass:x", check=False
    )
    if made.returncode != 0:
        pytest.skip("this openssl has no scrypt")
    info = keys.EncryptedPrivateKeyInfo.load(_der(made.stdout))
    kdf = info["encryption_algorithm"]["parameters"]["key_derivation_func"]
    raw = _sm2_asn1._ScryptParams.load(kdf["parameters"].dump())
    raw["cost_parameter"] = 2**20  # 128 * 8 * 2^20 bytes = 1 GiB of memory
    kdf["parameters"] = core.Any.load(raw.dump(force=True))
    pem = _sm2_asn1._pem_encode("ENCRYPTED PRIVATE KEY", info.dump(force=True))
    with pytest.raises(KeyMaterialError, match="scrypt parameters are out of bounds"):
        Sm2PrivateKey.from_pem(pem, b"x")


def test_openssl_loading_runs_no_python_scalar_multiplication(
    monkeypatch: pytest.MonkeyPatch, key_file: Path, plain: Sm2PrivateKey
) -> None:
    def forbidden(*args: object) -> None:
        raise AssertionError("pure-Python scalar multiplication on a private key")

    monkeypatch.setattr(_sm2_keys, "_scalar_mult", forbidden)
    assert Sm2PrivateKey.from_pem(key_file.read_bytes()) == plain
    assert Sm2PrivateKey.from_pem(_encrypt(key_file, "-v2", "sm4-cbc"), PASSWORD) == plain
    sec1 = _openssl("ec", "-in", key_file).stdout
    assert Sm2PrivateKey.from_pem(sec1).public_key == plain.public_key


# ---------------------------------------------------------------------------------------------------------
# Without libcrypto 3 (gmssl fallback)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_libcrypto")
def test_fallback_reads_unencrypted_keys_with_asn1crypto(key_file: Path, plain: Sm2PrivateKey) -> None:
    loaded = Sm2PrivateKey.from_pem(key_file.read_bytes())
    assert loaded == plain and loaded.public_key == plain.public_key
    assert Sm2PrivateKey.from_pem(_openssl("ec", "-in", key_file).stdout) == plain
    mismatched = plain.to_der().replace(
        plain.public_key.encoded_point(), Sm2PrivateKey(2).public_key.encoded_point()
    )
    with pytest.raises(KeyMaterialError, match="does not match"):
        Sm2PrivateKey.from_der(mismatched)
    signature = sm2.backend_by_name("gmssl").sign(loaded, b"m")
    sm2.backend_by_name("gmssl").verify(plain.public_key, b"m", signature)


@pytest.mark.usefixtures("no_libcrypto")
def test_fallback_refuses_encrypted_keys_naming_openssl(key_file: Path) -> None:
    with pytest.raises(KeyMaterialError, match="encrypted keys are decrypted by OpenSSL"):
        Sm2PrivateKey.from_pem(_encrypt(key_file, "-v2", "aes-256-cbc"), PASSWORD)
    with pytest.raises(KeyMaterialError, match="iteration count"):  # the bounds still come first
        Sm2PrivateKey.from_pem(_with_iterations(_encrypt(key_file, "-v2", "sm4-cbc"), 2**40), PASSWORD)
