"""PEM, strict DER parsing (through `asn1crypto`) and writing of SM2 keys, and PBES2 encryption on write.

Reading: every structure is parsed by `asn1crypto` and accepted only if re-encoding it gives back the same
bytes, so BER (indefinite or non-minimal lengths, non-minimal INTEGERs) and trailing data are refused; every
malformation is a `KeyMaterialError`. An `EncryptedPrivateKeyInfo` is not decrypted here: `check_encrypted`
reads its header and bounds the key-derivation cost (OpenSSL's PKCS#8 decryption has no limit on PBKDF2
iterations or scrypt memory), and OpenSSL decrypts it (`_sm2_libcrypto.decode_private_key`).

Writing: SubjectPublicKeyInfo and PKCS#8 byte-identical to `openssl pkey`, and `pkcs8_encrypt` (PBES2 with
PBKDF2-HMAC-SHA256 and AES-256-CBC through `cryptography` and hashlib, so either SM2 backend writes it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from typing import ClassVar, Final, TypeVar

from asn1crypto import core, keys

from modelsec.errors import KeyMaterialError, UnsupportedAlgorithmError
from modelsec.signer.der import encode_integer, encode_length

PBKDF2_ITERATIONS: Final = 600_000
"""PBKDF2-HMAC-SHA256 iterations used when writing an encrypted key (OWASP 2023 recommendation)."""

_MAX_KEY_FILE_BYTES: Final = 64 * 1024
_MAX_PBKDF2_ITERATIONS: Final = 10_000_000
_MAX_SCRYPT_MEMORY: Final = 256 * 2**20

_SEQUENCE = 0x30
_BIT_STRING = 0x03
_OCTET_STRING = 0x04
_NULL = 0x05
_OID = 0x06

_OID_EC_PUBLIC_KEY: Final = "1.2.840.10045.2.1"  # RFC 5480 id-ecPublicKey
_OID_SM2_CURVE: Final = "1.2.156.10197.1.301"  # GB/T 33560-2017 / GM/T 0006-2012 sm2p256v1
_OID_PBES2: Final = "1.2.840.113549.1.5.13"  # RFC 8018 §A.4
_OID_PBKDF2: Final = "1.2.840.113549.1.5.12"  # RFC 8018 §A.2
_OID_SCRYPT: Final = "1.3.6.1.4.1.11591.4.11"  # RFC 7914 §7
_OID_HMAC_SHA256: Final = "1.2.840.113549.2.9"
OID_HMAC_WITH_SM3: Final = "1.2.156.10197.1.401.3.1"
"""hmacWithSM3 as GM/T 0091-2020 and OpenSSL (from 3.2 on, `-v2prf hmacWithSM3`) write it."""
_PRFS: Final = {  # RFC 8018 §B.1, plus GM/T 0091-2020 hmacWithSM3
    "1.2.840.113549.2.7": "hmacWithSHA1",
    "1.2.840.113549.2.8": "hmacWithSHA224",
    "1.2.840.113549.2.9": "hmacWithSHA256",
    "1.2.840.113549.2.10": "hmacWithSHA384",
    "1.2.840.113549.2.11": "hmacWithSHA512",
    OID_HMAC_WITH_SM3: "hmacWithSM3",
}
_CBC_CIPHERS: Final = {  # PBES2 encryption schemes; all have 16-byte blocks and IVs
    "2.16.840.1.101.3.4.1.2": "aes-128-cbc",
    "2.16.840.1.101.3.4.1.22": "aes-192-cbc",
    "2.16.840.1.101.3.4.1.42": "aes-256-cbc",
    "1.2.156.10197.1.104.2": "sm4-cbc",  # GM/T 0006-2012 (`openssl pkcs8 -v2 sm4-cbc`)
}
_OID_AES256_CBC: Final = "2.16.840.1.101.3.4.1.42"

_ASN1_ERRORS: Final = (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError)
_A = TypeVar("_A", bound=core.Asn1Value)


# --------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------


def _tlv(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + encode_length(len(value)) + value


def _oid_der(dotted: str) -> bytes:
    return bytes(core.ObjectIdentifier(dotted).dump())


_SM2_ALGORITHM_DER: Final = _tlv(_SEQUENCE, _oid_der(_OID_EC_PUBLIC_KEY) + _oid_der(_OID_SM2_CURVE))


def spki_der(point: bytes) -> bytes:
    """SubjectPublicKeyInfo of an SM2 point, byte-identical to `openssl pkey -pubin -outform DER`."""
    return _tlv(_SEQUENCE, _SM2_ALGORITHM_DER + _tlv(_BIT_STRING, b"\x00" + point))


def pkcs8_der(private_value: int, point: bytes | None) -> bytes:
    """PKCS#8 `PrivateKeyInfo` of an SM2 key as `openssl pkey` writes it (the point in ECPrivateKey [1])."""
    public = b"" if point is None else _tlv(0xA1, _tlv(_BIT_STRING, b"\x00" + point))
    ec_private_key = _tlv(
        _SEQUENCE, encode_integer(1) + _tlv(_OCTET_STRING, private_value.to_bytes(32, "big")) + public
    )
    return _tlv(_SEQUENCE, encode_integer(0) + _SM2_ALGORITHM_DER + _tlv(_OCTET_STRING, ec_private_key))


def pkcs8_encrypt(der: bytes, password: bytes) -> bytes:
    """Encrypt a `PrivateKeyInfo` as PBES2: PBKDF2-HMAC-SHA256 (`PBKDF2_ITERATIONS`), AES-256-CBC."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if not isinstance(password, bytes | bytearray) or not password:
        raise KeyMaterialError("SM2 private key: the password must be non-empty bytes")
    salt, iv = secrets.token_bytes(16), secrets.token_bytes(16)
    key = hashlib.pbkdf2_hmac("sha256", bytes(password), salt, PBKDF2_ITERATIONS, 32)
    pad = 16 - len(der) % 16
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    ciphertext = encryptor.update(der + bytes([pad]) * pad) + encryptor.finalize()
    prf = _tlv(_SEQUENCE, _oid_der(_OID_HMAC_SHA256) + _tlv(_NULL, b""))
    kdf = _tlv(
        _SEQUENCE,
        _oid_der(_OID_PBKDF2)
        + _tlv(_SEQUENCE, _tlv(_OCTET_STRING, salt) + encode_integer(PBKDF2_ITERATIONS) + prf),
    )
    scheme = _tlv(_SEQUENCE, _oid_der(_OID_AES256_CBC) + _tlv(_OCTET_STRING, iv))
    algorithm = _tlv(_SEQUENCE, _oid_der(_OID_PBES2) + _tlv(_SEQUENCE, kdf + scheme))
    return _tlv(_SEQUENCE, algorithm + _tlv(_OCTET_STRING, ciphertext))


# --------------------------------------------------------------------------------------------------------
# PEM
# --------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------
# Strict reading
# --------------------------------------------------------------------------------------------------------


class _AlgorithmIdentifier(core.Sequence):  # type: ignore[misc]
    """RFC 5280 §4.1.1.2 `AlgorithmIdentifier`, parameters left raw (checked by `_check_sm2_algorithm`)."""

    _fields: ClassVar = [("algorithm", core.ObjectIdentifier), ("parameters", core.Any, {"optional": True})]


class _SubjectPublicKeyInfo(core.Sequence):  # type: ignore[misc]
    """RFC 5280 §4.1 `SubjectPublicKeyInfo`."""

    _fields: ClassVar = [("algorithm", _AlgorithmIdentifier), ("public_key", core.BitString)]


class _OneAsymmetricKey(core.Sequence):  # type: ignore[misc]
    """RFC 5958 `OneAsymmetricKey` (PKCS#8 `PrivateKeyInfo` v1/v2, with the optional `publicKey [1]`)."""

    _fields: ClassVar = [
        ("version", core.Integer),
        ("private_key_algorithm", _AlgorithmIdentifier),
        ("private_key", core.OctetString),
        ("attributes", keys.Attributes, {"implicit": 0, "optional": True}),
        ("public_key", core.BitString, {"implicit": 1, "optional": True}),
    ]


class _ECPrivateKey(core.Sequence):  # type: ignore[misc]
    """RFC 5915 §3 `ECPrivateKey`."""

    _fields: ClassVar = [
        ("version", core.Integer),
        ("private_key", core.OctetString),
        ("parameters", keys.ECDomainParameters, {"explicit": 0, "optional": True}),
        ("public_key", core.BitString, {"explicit": 1, "optional": True}),
    ]


class _ScryptParams(core.Sequence):  # type: ignore[misc]
    """RFC 7914 §7 `scrypt-params`."""

    _fields: ClassVar = [
        ("salt", core.OctetString),
        ("cost_parameter", core.Integer),
        ("block_size", core.Integer),
        ("parallelization_parameter", core.Integer),
        ("key_length", core.Integer, {"optional": True}),
    ]


def _load(spec: type[_A], der: bytes, what: str, name: str) -> _A:
    """Parse `der` as `spec`, refusing anything that is not exactly its DER encoding."""
    try:
        value: _A = spec.load(der, strict=True)
        _ = value.native  # parse every field now, so that a malformation surfaces here
        canonical = value.dump(force=True)
    except _ASN1_ERRORS as e:
        raise KeyMaterialError(f"{what}: malformed {name} ({e})") from e
    if canonical != der:
        raise KeyMaterialError(f"{what}: {name} is not minimally DER-encoded (BER or trailing data)")
    return value


def _check_curve(params: core.Asn1Value, what: str) -> None:
    """Accept exactly the namedCurve sm2p256v1 (RFC 5480 §2.1.1 ECParameters)."""
    try:
        if isinstance(params, keys.ECDomainParameters):
            named = params.chosen if params.name == "named" else None
        else:
            # Exactly a universal, primitive OBJECT IDENTIFIER: `parsed` looks at the tag number only.
            named = params.parsed if params.dump()[:1] == bytes([_OID]) else None
    except _ASN1_ERRORS as e:
        raise KeyMaterialError(f"{what}: malformed EC parameters ({e})") from e
    if not isinstance(named, core.ObjectIdentifier):
        raise UnsupportedAlgorithmError(f"{what}: only named-curve EC parameters are supported")
    curve = named.dotted
    if curve != _OID_SM2_CURVE:
        raise UnsupportedAlgorithmError(f"{what}: curve {curve} is not SM2 ({_OID_SM2_CURVE})")


def _check_sm2_algorithm(algorithm: core.Sequence, what: str) -> None:
    """Accept exactly id-ecPublicKey with namedCurve sm2p256v1."""
    oid = algorithm["algorithm"].dotted
    if oid != _OID_EC_PUBLIC_KEY:
        raise UnsupportedAlgorithmError(
            f"{what}: key algorithm {oid} is not SM2 (id-ecPublicKey + sm2p256v1)"
        )
    _check_curve(algorithm["parameters"], what)


def _bit_string_bytes(value: core.Asn1Value, what: str, name: str) -> bytes:
    contents = bytes(value.contents or b"")
    if not contents or contents[0] != 0:
        raise KeyMaterialError(f"{what}: {name} is not a whole number of bytes")
    return contents[1:]


def spki_point(der: bytes, what: str) -> bytes:
    """The encoded point of a DER SubjectPublicKeyInfo of an SM2 key (not yet checked to be on the curve).

    Raises:
        UnsupportedAlgorithmError: Another algorithm or curve.
        KeyMaterialError: Malformed or non-DER input.
    """
    spki = _load(_SubjectPublicKeyInfo, der, what, "SubjectPublicKeyInfo")
    _check_sm2_algorithm(spki["algorithm"], what)
    return _bit_string_bytes(spki["public_key"], what, "subjectPublicKey")


def ec_private_key(der: bytes, what: str, *, require_curve: bool) -> tuple[int, bytes | None]:
    """Read an RFC 5915 `ECPrivateKey` on the SM2 curve.

    Returns:
        The scalar d and the embedded public point, if the key carries one.

    Raises:
        UnsupportedAlgorithmError: Curve parameters other than sm2p256v1.
        KeyMaterialError: Malformed or non-DER input, wrong version, missing curve (SEC 1 files).
    """
    key = _load(_ECPrivateKey, der, what, "ECPrivateKey")
    if key["version"].native != 1:
        raise KeyMaterialError(f"{what}: ECPrivateKey version must be 1")
    raw = bytes(key["private_key"].contents or b"")
    if not 1 <= len(raw) <= 32:
        raise KeyMaterialError(f"{what}: private scalar must be 1 to 32 bytes")
    if key["parameters"].native is not None:
        _check_curve(key["parameters"], what)
    elif require_curve:
        raise KeyMaterialError(f"{what}: SEC 1 key without curve parameters")
    public = key["public_key"]
    point = None if public.native is None else _bit_string_bytes(public, what, "ECPrivateKey.publicKey")
    return int.from_bytes(raw, "big"), point


def private_key_info(der: bytes, what: str) -> tuple[int, bytes | None]:
    """Read a PKCS#8 `PrivateKeyInfo` / `OneAsymmetricKey` (RFC 5208, RFC 5958) holding an SM2 key.

    Returns:
        The scalar d and the public point embedded in the key (ECPrivateKey [1], else OneAsymmetricKey [1]).

    Raises:
        UnsupportedAlgorithmError: Not an SM2 key.
        KeyMaterialError: Malformed or non-DER input, unsupported version, two public keys that differ.
    """
    info = _load(_OneAsymmetricKey, der, what, "PrivateKeyInfo")
    version = info["version"].native
    if version not in (0, 1):
        raise KeyMaterialError(f"{what}: unsupported PKCS#8 version {version}")
    _check_sm2_algorithm(info["private_key_algorithm"], what)
    d, point = ec_private_key(bytes(info["private_key"].contents or b""), what, require_curve=False)
    if info["public_key"].native is not None:
        outer = _bit_string_bytes(info["public_key"], what, "publicKey")
        if point is not None and outer != point:
            raise KeyMaterialError(f"{what}: PKCS#8 public key does not match the private key")
        point = outer
    return d, point


def is_encrypted_pkcs8(der: bytes) -> bool:
    """Whether DER PKCS#8 is an `EncryptedPrivateKeyInfo` (its first element is a SEQUENCE, not a version)."""
    if len(der) < 3 or der[0] != _SEQUENCE:
        return False
    offset = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7F)
    return len(der) > offset and der[offset] == _SEQUENCE


def check_encrypted(der: bytes, what: str) -> str:
    """Check an `EncryptedPrivateKeyInfo` header before anything decrypts it, bounding its cost.

    Accepted: PBES2 (RFC 8018) with PBKDF2 (1 to 10 000 000 iterations; PRF HMAC-SHA-1/-224/-256/-384/-512
    or hmacWithSM3) or scrypt (at most 256 MiB), and AES-CBC or SM4-CBC.

    Returns:
        The PRF name when it is hmacWithSM3 (the caller asks OpenSSL whether it knows it), else "".

    Raises:
        UnsupportedAlgorithmError: Another scheme, KDF, PRF or cipher.
        KeyMaterialError: Malformed header, or a cost or IV outside the bounds.
    """
    info = _load(keys.EncryptedPrivateKeyInfo, der, what, "EncryptedPrivateKeyInfo")
    algorithm = info["encryption_algorithm"]
    if algorithm["algorithm"].dotted != _OID_PBES2:
        raise UnsupportedAlgorithmError(
            f"{what}: unsupported key encryption {algorithm['algorithm'].dotted} (only PBES2 is supported)"
        )
    params = algorithm["parameters"]
    scheme = params["encryption_scheme"]
    cipher = scheme["algorithm"].dotted
    if cipher not in _CBC_CIPHERS:
        raise UnsupportedAlgorithmError(f"{what}: unsupported key encryption cipher {cipher}")
    iv = scheme["parameters"].native
    ciphertext = info["encrypted_data"].native
    if not isinstance(iv, bytes) or len(iv) != 16 or not ciphertext or len(ciphertext) % 16:
        raise KeyMaterialError(f"{what}: malformed CBC parameters or ciphertext")
    kdf = params["key_derivation_func"]
    kdf_oid = kdf["algorithm"].dotted
    if kdf_oid == _OID_PBKDF2:
        pbkdf2 = kdf["parameters"]
        iterations = pbkdf2["iteration_count"].native
        if not 1 <= iterations <= _MAX_PBKDF2_ITERATIONS:
            raise KeyMaterialError(f"{what}: PBKDF2 iteration count {iterations} is out of bounds")
        prf_oid = pbkdf2["prf"]["algorithm"].dotted
        if prf_oid not in _PRFS:
            raise UnsupportedAlgorithmError(f"{what}: unsupported PBKDF2 PRF {prf_oid}")
        return "hmacWithSM3" if prf_oid == OID_HMAC_WITH_SM3 else ""
    if kdf_oid == _OID_SCRYPT:
        scrypt = _load(_ScryptParams, kdf["parameters"].dump(), what, "scrypt-params")
        n, r, p = (scrypt[f].native for f in ("cost_parameter", "block_size", "parallelization_parameter"))
        memory = 128 * r * (n + p + 2)
        if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 64 or memory > _MAX_SCRYPT_MEMORY:
            raise KeyMaterialError(f"{what}: scrypt parameters are out of bounds")
        return ""
    raise UnsupportedAlgorithmError(f"{what}: unsupported key derivation function {kdf_oid}")
