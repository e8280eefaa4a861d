"""Strict DER and PEM for SM2 keys, and password-protected PKCS#8 (PBES2, RFC 8018).

The DER reader accepts X.690 DER only (definite minimal lengths, minimal INTEGERs, no trailing data); every
malformation is a `KeyMaterialError`. PKCS#8 decryption uses `cryptography`'s OpenSSL
ciphers (AES-CBC, and SM4-CBC for GM/T keys from `openssl pkcs8 -v2 sm4-cbc`) and hashlib's PBKDF2 / scrypt,
so it works with either SM2 backend; keys are written with AES-256-CBC.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import Final

from modelsec.errors import KeyMaterialError, UnsupportedAlgorithmError
from modelsec.signer.der import encode_integer, encode_length

PBKDF2_ITERATIONS: Final = 600_000
"""PBKDF2-HMAC-SHA256 iterations used when writing an encrypted key (OWASP 2023 recommendation)."""

_MAX_KEY_FILE_BYTES: Final = 64 * 1024
_MAX_PBKDF2_ITERATIONS: Final = 10_000_000
_MAX_SCRYPT_MEMORY: Final = 256 * 2**20


# --------------------------------------------------------------------------------------------------------
# Strict DER reader / writer for keys (X.690 DER, the subset keys use)
# --------------------------------------------------------------------------------------------------------

_SEQUENCE = 0x30
_INTEGER = 0x02
_BIT_STRING = 0x03
_OCTET_STRING = 0x04
_NULL = 0x05
_OID = 0x06


def _oid_to_str(body: bytes, what: str) -> str:
    if not body or body[-1] & 0x80:
        raise KeyMaterialError(f"{what}: malformed OBJECT IDENTIFIER")
    arcs: list[int] = []
    value = 0
    start = True
    for byte in body:
        if start and byte == 0x80:
            raise KeyMaterialError(f"{what}: OBJECT IDENTIFIER arc is not minimally encoded")
        value = (value << 7) | (byte & 0x7F)
        start = not byte & 0x80
        if start:
            arcs.append(value)
            value = 0
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in [first, arcs[0] - 40 * first, *arcs[1:]])


def _oid_der(dotted: str) -> bytes:
    arcs = [int(a) for a in dotted.split(".")]
    body = bytearray()
    for arc in [40 * arcs[0] + arcs[1], *arcs[2:]]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        body.extend(reversed(chunk))
    return _tlv(_OID, bytes(body))


def _tlv(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + encode_length(len(value)) + value


class _DerReader:
    """Strict DER reader over one constructed value; every malformation is a `KeyMaterialError`."""

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def _fail(self, why: str) -> KeyMaterialError:
        return KeyMaterialError(f"{self._what}: {why}")

    def at_end(self) -> bool:
        return self._pos == len(self._data)

    def end(self) -> None:
        if not self.at_end():
            raise self._fail("unexpected trailing data")

    def peek_tag(self) -> int | None:
        return None if self.at_end() else self._data[self._pos]

    def read_any(self) -> tuple[int, bytes]:
        data, pos = self._data, self._pos
        if pos + 2 > len(data):
            raise self._fail("truncated DER")
        tag = data[pos]
        if tag & 0x1F == 0x1F:
            raise self._fail("multi-byte DER tags are not expected here")
        first = data[pos + 1]
        pos += 2
        if first < 0x80:
            length = first
        else:
            count = first & 0x7F
            if count == 0 or count > 4:
                raise self._fail("indefinite or oversized DER length")
            if pos + count > len(data):
                raise self._fail("truncated DER length")
            length = int.from_bytes(data[pos : pos + count], "big")
            if length < 0x80 or data[pos] == 0:
                raise self._fail("DER length is not minimally encoded")
            pos += count
        if pos + length > len(data):
            raise self._fail("truncated DER value")
        self._pos = pos + length
        return tag, data[pos : pos + length]

    def read(self, tag: int, name: str) -> bytes:
        if self.peek_tag() != tag:
            raise self._fail(f"expected {name}")
        return self.read_any()[1]

    def sequence(self, name: str) -> _DerReader:
        return _DerReader(self.read(_SEQUENCE, name), self._what)

    def integer(self, name: str) -> int:
        body = self.read(_INTEGER, f"INTEGER {name}")
        if not body or body[0] & 0x80:
            raise self._fail(f"{name} is empty or negative")
        if len(body) > 1 and body[0] == 0 and not body[1] & 0x80:
            raise self._fail(f"{name} is not minimally encoded")
        return int.from_bytes(body, "big")

    def oid(self, name: str) -> str:
        return _oid_to_str(self.read(_OID, f"OBJECT IDENTIFIER {name}"), self._what)

    def octet_string(self, name: str) -> bytes:
        return self.read(_OCTET_STRING, f"OCTET STRING {name}")

    def bit_string(self, name: str) -> bytes:
        body = self.read(_BIT_STRING, f"BIT STRING {name}")
        if not body or body[0] != 0:
            raise self._fail(f"{name} is not a whole number of bytes")
        return body[1:]

    def algorithm(self, name: str) -> tuple[str, _DerReader]:
        """Read an AlgorithmIdentifier; returns the OID and a reader over the raw parameters."""
        seq = self.sequence(name)
        oid = seq.oid(f"{name}.algorithm")
        params = _DerReader(seq._data[seq._pos :], self._what)
        return oid, params


# --------------------------------------------------------------------------------------------------------
# OIDs and PEM
# --------------------------------------------------------------------------------------------------------

_OID_EC_PUBLIC_KEY: Final = "1.2.840.10045.2.1"  # RFC 5480 id-ecPublicKey
_OID_SM2_CURVE: Final = "1.2.156.10197.1.301"  # GB/T 33560-2017 / GM/T 0006-2012 sm2p256v1
_OID_PBES2: Final = "1.2.840.113549.1.5.13"  # RFC 8018 §A.4
_OID_PBKDF2: Final = "1.2.840.113549.1.5.12"  # RFC 8018 §A.2
_OID_SCRYPT: Final = "1.3.6.1.4.1.11591.4.11"  # RFC 7914 §7
_PRF_HASHES: Final = {  # RFC 8018 §B.1
    "1.2.840.113549.2.7": "sha1",
    "1.2.840.113549.2.8": "sha224",
    "1.2.840.113549.2.9": "sha256",
    "1.2.840.113549.2.10": "sha384",
    "1.2.840.113549.2.11": "sha512",
}
_OID_HMAC_SHA256: Final = "1.2.840.113549.2.9"
_CBC_CIPHERS: Final = {  # PBES2 encryption schemes: OID -> (cipher name, key bytes); all 16-byte blocks
    "2.16.840.1.101.3.4.1.2": ("AES", 16),  # NIST CSOR aes128-CBC
    "2.16.840.1.101.3.4.1.22": ("AES", 24),  # aes192-CBC
    "2.16.840.1.101.3.4.1.42": ("AES", 32),  # aes256-CBC
    "1.2.156.10197.1.104.2": (
        "SM4",
        16,
    ),  # GM/T 0006-2012 sm4-cbc (GB/T 32907 SM4; `openssl pkcs8 -v2 sm4-cbc`)
}
_OID_AES256_CBC: Final = "2.16.840.1.101.3.4.1.42"

_SM2_ALGORITHM_DER: Final = _tlv(_SEQUENCE, _oid_der(_OID_EC_PUBLIC_KEY) + _oid_der(_OID_SM2_CURVE))

_PEM_BLOCK: Final = re.compile(
    rb"-----BEGIN ([A-Z0-9 ]{1,40})-----(.*?)-----END ([A-Z0-9 ]{1,40})-----", re.S
)
_PEM_WHITESPACE: Final = re.compile(rb"[ \t\r\n]+")


def _pem_decode(data: bytes, labels: tuple[str, ...], what: str) -> tuple[str, bytes]:
    if not isinstance(data, bytes | bytearray):
        raise KeyMaterialError(f"{what}: PEM data must be bytes")
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise KeyMaterialError(f"{what}: larger than {_MAX_KEY_FILE_BYTES} bytes")
    blocks = _PEM_BLOCK.findall(bytes(data))
    if not blocks:
        raise KeyMaterialError(f"{what}: no PEM block found")
    if len(blocks) > 1:
        raise KeyMaterialError(f"{what}: {len(blocks)} PEM blocks found, expected exactly one")
    begin, body, end = blocks[0]
    label = begin.decode("ascii")
    if begin != end:
        raise KeyMaterialError(f"{what}: PEM BEGIN/END labels differ")
    if label not in labels:
        raise KeyMaterialError(f"{what}: PEM block is {label!r}, expected one of {', '.join(labels)}")
    if b":" in body:
        raise KeyMaterialError(
            f"{what}: PEM headers (legacy Proc-Type/DEK-Info encryption) are not supported; "
            "convert the key with `openssl pkcs8 -topk8`"
        )
    try:
        der = base64.b64decode(_PEM_WHITESPACE.sub(b"", body), validate=True)
    except (binascii.Error, ValueError) as e:
        raise KeyMaterialError(f"{what}: PEM body is not valid base64") from e
    return label, der


def _pem_encode(label: str, der: bytes) -> bytes:
    b64 = base64.b64encode(der)
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    head = f"-----BEGIN {label}-----\n".encode("ascii")
    tail = f"-----END {label}-----\n".encode("ascii")
    return head + b"\n".join(lines) + b"\n" + tail


def _check_sm2_algorithm(oid: str, params: _DerReader, what: str) -> None:
    """Accept exactly id-ecPublicKey with namedCurve sm2p256v1."""
    if oid != _OID_EC_PUBLIC_KEY:
        raise UnsupportedAlgorithmError(
            f"{what}: key algorithm {oid} is not SM2 (id-ecPublicKey + sm2p256v1)"
        )
    if params.peek_tag() != _OID:
        raise UnsupportedAlgorithmError(f"{what}: only named-curve EC parameters are supported")
    curve = params.oid("namedCurve")
    params.end()
    if curve != _OID_SM2_CURVE:
        raise UnsupportedAlgorithmError(f"{what}: curve {curve} is not SM2 ({_OID_SM2_CURVE})")


# --------------------------------------------------------------------------------------------------------
# PKCS#8 encryption (PBES2, RFC 8018) with `cryptography` primitives, so that it works for both backends.
# --------------------------------------------------------------------------------------------------------


def _cbc(key: bytes, iv: bytes, data: bytes, *, encrypt: bool, cipher_name: str = "AES") -> bytes:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    block_cipher = algorithms.SM4(key) if cipher_name == "SM4" else algorithms.AES(key)
    cipher = Cipher(block_cipher, modes.CBC(iv))
    ctx = cipher.encryptor() if encrypt else cipher.decryptor()
    return ctx.update(data) + ctx.finalize()


def _pkcs8_encrypt(der: bytes, password: bytes) -> bytes:
    if not isinstance(password, bytes | bytearray) or not password:
        raise KeyMaterialError("SM2 private key: the password must be non-empty bytes")
    salt, iv = secrets.token_bytes(16), secrets.token_bytes(16)
    key = hashlib.pbkdf2_hmac("sha256", bytes(password), salt, PBKDF2_ITERATIONS, 32)
    pad = 16 - len(der) % 16
    ciphertext = _cbc(key, iv, der + bytes([pad]) * pad, encrypt=True)
    prf = _tlv(_SEQUENCE, _oid_der(_OID_HMAC_SHA256) + _tlv(_NULL, b""))
    kdf = _tlv(
        _SEQUENCE,
        _oid_der(_OID_PBKDF2)
        + _tlv(_SEQUENCE, _tlv(_OCTET_STRING, salt) + encode_integer(PBKDF2_ITERATIONS) + prf),
    )
    scheme = _tlv(_SEQUENCE, _oid_der(_OID_AES256_CBC) + _tlv(_OCTET_STRING, iv))
    algorithm = _tlv(_SEQUENCE, _oid_der(_OID_PBES2) + _tlv(_SEQUENCE, kdf + scheme))
    return _tlv(_SEQUENCE, algorithm + _tlv(_OCTET_STRING, ciphertext))


def _derive_key(kdf_oid: str, params: _DerReader, password: bytes, key_len: int, what: str) -> bytes:
    if kdf_oid == _OID_PBKDF2:
        seq = params.sequence("PBKDF2-params")
        params.end()
        salt = seq.octet_string("salt")
        iterations = seq.integer("iterationCount")
        if not 1 <= iterations <= _MAX_PBKDF2_ITERATIONS:
            raise KeyMaterialError(f"{what}: PBKDF2 iteration count {iterations} is out of bounds")
        if seq.peek_tag() == _INTEGER and seq.integer("keyLength") != key_len:
            raise KeyMaterialError(f"{what}: PBKDF2 keyLength does not match the cipher")
        prf = "sha1"  # RFC 8018 §A.2: the default PRF is hmacWithSHA1.
        if not seq.at_end():
            prf_oid, prf_params = seq.algorithm("prf")
            if prf_params.peek_tag() == _NULL:
                prf_params.read(_NULL, "NULL")
            prf_params.end()
            if prf_oid not in _PRF_HASHES:
                raise UnsupportedAlgorithmError(f"{what}: unsupported PBKDF2 PRF {prf_oid}")
            prf = _PRF_HASHES[prf_oid]
        seq.end()
        return hashlib.pbkdf2_hmac(prf, password, salt, iterations, key_len)
    if kdf_oid == _OID_SCRYPT:
        seq = params.sequence("scrypt-params")
        params.end()
        salt = seq.octet_string("salt")
        n, r, p = seq.integer("costParameter"), seq.integer("blockSize"), seq.integer("parallelization")
        if seq.peek_tag() == _INTEGER and seq.integer("keyLength") != key_len:
            raise KeyMaterialError(f"{what}: scrypt keyLength does not match the cipher")
        seq.end()
        if (
            n < 2
            or n & (n - 1)
            or not 1 <= r <= 64
            or not 1 <= p <= 64
            or 128 * r * (n + p + 2) > _MAX_SCRYPT_MEMORY
        ):
            raise KeyMaterialError(f"{what}: scrypt parameters are out of bounds")
        return hashlib.scrypt(
            password, salt=salt, n=n, r=r, p=p, maxmem=_MAX_SCRYPT_MEMORY + 2**20, dklen=key_len
        )
    raise UnsupportedAlgorithmError(f"{what}: unsupported key derivation function {kdf_oid}")


def _pkcs8_decrypt(der: bytes, password: bytes, what: str) -> bytes:
    if not isinstance(password, bytes | bytearray):
        raise KeyMaterialError(f"{what}: the password must be bytes")
    outer = _DerReader(der, what)
    info = outer.sequence("EncryptedPrivateKeyInfo")
    outer.end()
    oid, params = info.algorithm("encryptionAlgorithm")
    ciphertext = info.octet_string("encryptedData")
    info.end()
    if oid != _OID_PBES2:
        raise UnsupportedAlgorithmError(f"{what}: unsupported key encryption {oid} (only PBES2 is supported)")
    pbes2 = params.sequence("PBES2-params")
    params.end()
    kdf_oid, kdf_params = pbes2.algorithm("keyDerivationFunc")
    enc_oid, enc_params = pbes2.algorithm("encryptionScheme")
    pbes2.end()
    if enc_oid not in _CBC_CIPHERS:
        raise UnsupportedAlgorithmError(f"{what}: unsupported key encryption cipher {enc_oid}")
    cipher_name, key_bytes = _CBC_CIPHERS[enc_oid]
    iv = enc_params.octet_string("IV")
    enc_params.end()
    if len(iv) != 16 or not ciphertext or len(ciphertext) % 16:
        raise KeyMaterialError(f"{what}: malformed {cipher_name}-CBC parameters or ciphertext")
    key = _derive_key(kdf_oid, kdf_params, bytes(password), key_bytes, what)
    plain = _cbc(key, iv, ciphertext, encrypt=False, cipher_name=cipher_name)
    pad = plain[-1]
    if not 1 <= pad <= 16 or not hmac.compare_digest(plain[-pad:], bytes([pad]) * pad):
        raise KeyMaterialError(f"{what}: cannot decrypt the key (wrong password or corrupted file)")
    plain = plain[:-pad]
    try:
        probe = _DerReader(plain, what)
        probe.sequence("PrivateKeyInfo")
        probe.end()
    except KeyMaterialError as e:
        raise KeyMaterialError(f"{what}: cannot decrypt the key (wrong password or corrupted file)") from e
    return plain
