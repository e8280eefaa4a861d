"""SM2 signatures with SM3 (GB/T 32918.2-2016), keys, and the backends that compute them.

This module owns everything about SM2 that is *not* curve arithmetic on secrets:

* curve parameters (GB/T 32918.5-2017 §6, the recommended 256-bit prime curve);
* key values (`Sm2PublicKey`, `Sm2PrivateKey`) and their strict, byte-exact encodings: SubjectPublicKeyInfo
  and PKCS#8 (RFC 5915 ECPrivateKey inside) exactly as `openssl pkey` writes them, and password-protected
  PKCS#8 (PBES2, RFC 8018);
* `Z_A` and `e = SM3(Z_A || M)` (GB/T 32918.2-2016 §5.5 and §6.1);
* the `Sm2Backend` protocol and backend selection.

Two backends implement the protocol: the system OpenSSL >= 3.0 through `ctypes` (`_sm2_openssl`, the default)
and a hardened wrapper around PyPI `gmssl` (`_sm2_gmssl`, the portable fallback). Each self-tests against the
GB/T 32918.5-2017 annex A example on first use and is refused (`BackendUnavailableError`) if the test fails.

Verification order (an invariant of every backend): the signature is decoded as strict DER and `r`, `s` are
checked to lie in [1, n-1] (GB/T 32918.2-2016 §7.1 B1, B2) and `t = (r + s) mod n != 0` (B5) *before* any
curve arithmetic; only then is `e` computed and the curve equation checked. Every failure is a
`SignatureError`; verification never returns a boolean.

The pure-Python point multiplication here is used only to derive and check a public key when a key is
generated or loaded (once per key, never per signature). It is not constant-time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar, cast

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import (
    BackendUnavailableError,
    KeyMaterialError,
    SignatureError,
    UnsupportedAlgorithmError,
)
from modelsec.signer.der import decode_signature, encode_integer, encode_length
from modelsec.signer.hashing import _HASHLIB_SM3, new_hasher

__all__ = [
    "BACKEND_ENV",
    "DEFAULT_DISTID",
    "PBKDF2_ITERATIONS",
    "SM2_A",
    "SM2_B",
    "SM2_GX",
    "SM2_GY",
    "SM2_ORDER",
    "SM2_P",
    "Sm2Backend",
    "Sm2PrivateKey",
    "Sm2PublicKey",
    "backend_by_name",
    "check_distid",
    "compute_digest",
    "compute_za",
    "decode_sm2_signature",
    "default_backend",
    "generate_private_key",
    "sign",
    "verify",
]

_LOG = logging.getLogger(__name__)

# GB/T 32918.5-2017 §6 (identical to GM/T 0003.5-2012): the recommended 256-bit prime curve, cofactor 1.
SM2_P: Final = 0xFFFFFFFEFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF00000000FFFFFFFFFFFFFFFF
SM2_A: Final = 0xFFFFFFFEFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF00000000FFFFFFFFFFFFFFFC
SM2_B: Final = 0x28E9FA9E9D9F5E344D5A9E4BCF6509A7F39789F515AB8F92DDBCBD414D940E93
SM2_GX: Final = 0x32C4AE2C1F1981195F9904466A39C9948FE30BBFF2660BE1715A4589334C74C7
SM2_GY: Final = 0xBC3736A2F4F6779C59BDCEE36B692153D0A9877CC62A474002DF32E52139F0A0
SM2_ORDER: Final = 0xFFFFFFFEFFFFFFFFFFFFFFFFFFFFFFFF7203DF6B21C6052B53BBF40939D54123

DEFAULT_DISTID: Final = b"1234567812345678"
"""The default distinguishing ID of GB/T 35276-2017 §10 / GM/T 0009-2012 (OpenSSL 3 defaults to empty)."""

BACKEND_ENV: Final = "MODELSEC_SM2_BACKEND"
"""Environment variable choosing the backend: `auto` (default), `openssl` or `gmssl`."""

PBKDF2_ITERATIONS: Final = 600_000
"""PBKDF2-HMAC-SHA256 iterations used when writing an encrypted key (OWASP 2023 recommendation)."""

# ENTL is a 16-bit count of *bits* (GB/T 32918.2-2016 §5.5), so at most 8191 bytes; OpenSSL requires
# id_len < UINT16_MAX / 8 (crypto/sm2/sm2_sign.c), one byte less. Both backends use OpenSSL's bound.
_MAX_DISTID_BYTES: Final = 8190
_MAX_KEY_FILE_BYTES: Final = 64 * 1024
_MAX_PBKDF2_ITERATIONS: Final = 10_000_000
_MAX_SCRYPT_MEMORY: Final = 256 * 2**20


@dataclass(frozen=True, slots=True)
class _Curve:
    """Short Weierstrass curve y^2 = x^3 + ax + b over F_p with a base point of prime order n."""

    p: int
    a: int
    b: int
    gx: int
    gy: int
    n: int

    @property
    def byte_length(self) -> int:
        return (self.p.bit_length() + 7) // 8


_T = TypeVar("_T")

_SM2_CURVE: Final = _Curve(SM2_P, SM2_A, SM2_B, SM2_GX, SM2_GY, SM2_ORDER)

# --------------------------------------------------------------------------------------------------------
# SM3 (GB/T 32905-2016): hashlib where the OpenSSL build has it, else `cryptography` (decision 3).
# gmssl's pure-Python SM3 is never used.
# --------------------------------------------------------------------------------------------------------


def _sm3(data: bytes) -> bytes:
    """SM3 digest of `data` (GB/T 32905-2016), through the hashing engine's SM3."""
    h = new_hasher(HashAlgorithm.SM3)
    h.update(data)
    return h.digest()


def _hmac_sm3(key: bytes, data: bytes) -> bytes:
    """HMAC-SM3 (RFC 2104 over SM3), used by the deterministic nonce of the gmssl backend."""
    if _HASHLIB_SM3:
        return hmac.new(key, data, "sm3").digest()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import hmac as crypto_hmac

    h = crypto_hmac.HMAC(key, hashes.SM3())
    h.update(data)
    return h.finalize()


# --------------------------------------------------------------------------------------------------------
# Curve arithmetic in Jacobian coordinates. Used only to derive public keys (not constant-time).
# --------------------------------------------------------------------------------------------------------

_Jacobian = tuple[int, int, int]
_INFINITY: Final[_Jacobian] = (1, 1, 0)


def _jacobian_double(point: _Jacobian, curve: _Curve) -> _Jacobian:
    # dbl-2007-bl (Bernstein-Lange Explicit-Formulas Database), any a.
    x1, y1, z1 = point
    p = curve.p
    if z1 == 0 or y1 == 0:
        return _INFINITY
    xx = x1 * x1 % p
    yy = y1 * y1 % p
    yyyy = yy * yy % p
    zz = z1 * z1 % p
    s = 2 * ((x1 + yy) ** 2 - xx - yyyy) % p
    m = (3 * xx + curve.a * zz * zz) % p
    x3 = (m * m - 2 * s) % p
    y3 = (m * (s - x3) - 8 * yyyy) % p
    z3 = ((y1 + z1) ** 2 - yy - zz) % p
    return x3, y3, z3


def _jacobian_add_affine(point: _Jacobian, x2: int, y2: int, curve: _Curve) -> _Jacobian:
    # madd-2007-bl: Jacobian + affine, with the doubling and inverse cases handled.
    x1, y1, z1 = point
    p = curve.p
    if z1 == 0:
        return x2, y2, 1
    z1z1 = z1 * z1 % p
    u2 = x2 * z1z1 % p
    s2 = y2 * z1 * z1z1 % p
    h = (u2 - x1) % p
    r = 2 * (s2 - y1) % p
    if h == 0:
        return _jacobian_double(point, curve) if r == 0 else _INFINITY
    hh = h * h % p
    i = 4 * hh % p
    j = h * i % p
    v = x1 * i % p
    x3 = (r * r - j - 2 * v) % p
    y3 = (r * (v - x3) - 2 * y1 * j) % p
    z3 = ((z1 + h) ** 2 - z1z1 - hh) % p
    return x3, y3, z3


def _scalar_mult(k: int, x: int, y: int, curve: _Curve) -> tuple[int, int] | None:
    """Compute [k](x, y) in affine coordinates; None for the point at infinity."""
    acc = _INFINITY
    for bit in bin(k)[2:]:
        acc = _jacobian_double(acc, curve)
        if bit == "1":
            acc = _jacobian_add_affine(acc, x, y, curve)
    xj, yj, zj = acc
    if zj == 0:
        return None
    z_inv = pow(zj, -1, curve.p)
    z_inv2 = z_inv * z_inv % curve.p
    return xj * z_inv2 % curve.p, yj * z_inv2 * z_inv % curve.p


def _on_curve(x: int, y: int, curve: _Curve) -> bool:
    return (y * y - (x * x * x + curve.a * x + curve.b)) % curve.p == 0


# --------------------------------------------------------------------------------------------------------
# Z_A and e (GB/T 32918.2-2016 §5.5, §6.1 A1-A2)
# --------------------------------------------------------------------------------------------------------


def check_distid(distid: bytes) -> None:
    """Check that a distinguishing ID can be encoded in `Z_A` (ENTL is 16 bits of *bit* length).

    Args:
        distid: The signer's distinguishing ID (GB/T 32918.2-2016 §5.5), usually `DEFAULT_DISTID`.

    Raises:
        UnsupportedAlgorithmError: `distid` is not bytes or is longer than 8190 bytes.
    """
    if not isinstance(distid, bytes | bytearray):
        raise UnsupportedAlgorithmError("SM2 distinguishing ID must be bytes")
    if len(distid) > _MAX_DISTID_BYTES:
        raise UnsupportedAlgorithmError(f"SM2 distinguishing ID is longer than {_MAX_DISTID_BYTES} bytes")


def _za(distid: bytes, x: int, y: int, curve: _Curve) -> bytes:
    check_distid(distid)
    size = curve.byte_length
    fields = (curve.a, curve.b, curve.gx, curve.gy, x, y)
    return _sm3(
        (len(distid) * 8).to_bytes(2, "big")
        + bytes(distid)
        + b"".join(v.to_bytes(size, "big") for v in fields)
    )


def compute_za(public_key: Sm2PublicKey, distid: bytes = DEFAULT_DISTID) -> bytes:
    """Compute `Z_A = SM3(ENTL_A || ID_A || a || b || x_G || y_G || x_A || y_A)`.

    Source: GB/T 32918.2-2016 §5.5.

    Args:
        public_key: The signer's public key.
        distid: The signer's distinguishing ID.

    Returns:
        The 32-byte `Z_A`.

    Raises:
        UnsupportedAlgorithmError: `distid` cannot be encoded (see `check_distid`).
    """
    return _za(distid, public_key.x, public_key.y, _SM2_CURVE)


def compute_digest(public_key: Sm2PublicKey, message: bytes, distid: bytes = DEFAULT_DISTID) -> bytes:
    """Compute the signed digest `e = SM3(Z_A || M)` (GB/T 32918.2-2016 §6.1 steps A1-A2).

    Args:
        public_key: The signer's public key.
        message: The raw message `M` (for modelsec, the DSSE PAE bytes).
        distid: The signer's distinguishing ID.

    Returns:
        The 32-byte `e` (big-endian integer encoding as in the standard).

    Raises:
        UnsupportedAlgorithmError: `distid` cannot be encoded (see `check_distid`).
    """
    return _sm3(compute_za(public_key, distid) + bytes(message))


def decode_sm2_signature(signature: bytes) -> tuple[int, int]:
    """Decode an SM2 signature and apply every check that needs no curve arithmetic.

    Strict DER `SEQUENCE { r, s }` with r, s in [1, n-1] (GB/T 32918.2-2016 §7.1 B1-B2, via
    `modelsec.signer.der.decode_signature`) and `t = (r + s) mod n != 0` (B5). Every backend calls this before
    it touches the curve.

    Args:
        signature: DER-encoded signature.

    Returns:
        `(r, s)`.

    Raises:
        SignatureError: The encoding or a range check fails.
    """
    if not isinstance(signature, bytes | bytearray):
        raise SignatureError("SM2 signature must be bytes")
    r, s = decode_signature(bytes(signature), SM2_ORDER)
    if (r + s) % SM2_ORDER == 0:
        raise SignatureError("invalid SM2 signature: (r + s) mod n = 0")
    return r, s


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
_AES_CBC_KEY_BYTES: Final = {  # NIST CSOR: aes128-CBC, aes192-CBC, aes256-CBC
    "2.16.840.1.101.3.4.1.2": 16,
    "2.16.840.1.101.3.4.1.22": 24,
    "2.16.840.1.101.3.4.1.42": 32,
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
# Keys
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class Sm2PublicKey:
    """An SM2 public key: a validated affine point of the SM2 curve (GB/T 32918.1-2016 §6.2.1).

    Construction checks that both coordinates are field elements and that the point satisfies the curve
    equation; the point at infinity cannot be represented. The cofactor is 1, so every such point has order n.

    Attributes:
        x: Affine x coordinate, in [0, p-1].
        y: Affine y coordinate, in [0, p-1].
    """

    x: int
    y: int

    def __post_init__(self) -> None:
        for name, value in (("x", self.x), ("y", self.y)):
            if type(value) is not int:
                raise KeyMaterialError(f"SM2 public key: {name} must be an int")
            if not 0 <= value < SM2_P:
                raise KeyMaterialError(f"SM2 public key: {name} is not a field element")
        if not _on_curve(self.x, self.y, _SM2_CURVE):
            raise KeyMaterialError("SM2 public key: point is not on the SM2 curve")

    def __repr__(self) -> str:
        return f"Sm2PublicKey(x=0x{self.x:064x}, y=0x{self.y:064x})"

    @classmethod
    def from_encoded_point(cls, point: bytes) -> Sm2PublicKey:
        """Load an uncompressed SEC 1 point `04 || x || y` (65 bytes).

        Args:
            point: The encoded point.

        Returns:
            The validated public key.

        Raises:
            KeyMaterialError: Wrong length, compressed or hybrid form, or not on the curve.
        """
        if len(point) != 65 or point[0] != 0x04:
            raise KeyMaterialError("SM2 public key: expected a 65-byte uncompressed point (04 || x || y)")
        return cls(int.from_bytes(point[1:33], "big"), int.from_bytes(point[33:], "big"))

    @classmethod
    def from_der(cls, data: bytes) -> Sm2PublicKey:
        """Load a DER SubjectPublicKeyInfo (RFC 5280 §4.1, RFC 5480 §2) holding an SM2 key.

        Args:
            data: DER bytes: algorithm id-ecPublicKey with namedCurve 1.2.156.10197.1.301, uncompressed point.

        Returns:
            The validated public key.

        Raises:
            UnsupportedAlgorithmError: Another algorithm or curve (e.g. P-256, RSA, Ed25519).
            KeyMaterialError: Malformed or non-DER input, compressed point, or a point not on the curve.
        """
        what = "SM2 public key"
        if not isinstance(data, bytes | bytearray):
            raise KeyMaterialError(f"{what}: DER data must be bytes")
        outer = _DerReader(bytes(data), what)
        spki = outer.sequence("SubjectPublicKeyInfo")
        outer.end()
        oid, params = spki.algorithm("algorithm")
        _check_sm2_algorithm(oid, params, what)
        point = spki.bit_string("subjectPublicKey")
        spki.end()
        return cls.from_encoded_point(point)

    @classmethod
    def from_pem(cls, data: bytes) -> Sm2PublicKey:
        """Load a PEM `PUBLIC KEY` (SubjectPublicKeyInfo) holding an SM2 key.

        Args:
            data: PEM bytes with exactly one `PUBLIC KEY` block.

        Returns:
            The validated public key.

        Raises:
            UnsupportedAlgorithmError: Another algorithm or curve.
            KeyMaterialError: Not PEM, another PEM label, or malformed key (see `from_der`).
        """
        _, der = _pem_decode(data, ("PUBLIC KEY",), "SM2 public key")
        return cls.from_der(der)

    def encoded_point(self) -> bytes:
        """Return the uncompressed SEC 1 encoding `04 || x || y` (65 bytes)."""
        return b"\x04" + self.x.to_bytes(32, "big") + self.y.to_bytes(32, "big")

    def to_der(self) -> bytes:
        """Return the DER SubjectPublicKeyInfo, byte-identical to `openssl pkey -pubin -outform DER`."""
        return _tlv(_SEQUENCE, _SM2_ALGORITHM_DER + _tlv(_BIT_STRING, b"\x00" + self.encoded_point()))

    def to_pem(self) -> bytes:
        """Return the PEM `PUBLIC KEY`, byte-identical to `openssl pkey -pubin -pubout` (64-column base64)."""
        return _pem_encode("PUBLIC KEY", self.to_der())


class Sm2PrivateKey:
    """An SM2 private key: a scalar d in [1, n-2] and its public key [d]G (GB/T 32918.1-2016 §6.1).

    d = n-1 is excluded because signing divides by 1 + d (GB/T 32918.2-2016 §6.1 A6). The scalar never
    appears in `repr` or `str`. Keys compare equal in constant time on d; they are not hashable, and
    cannot be pickled or copied (serialize them with `to_pem(password)`).
    """

    __slots__ = ("_d", "_native", "_native_lock", "_public_key")

    _d: int
    _native: dict[object, object]
    _native_lock: threading.Lock
    _public_key: Sm2PublicKey

    def __init__(self, private_value: int) -> None:
        """Create a key from its scalar; derives the public key (pure Python, a few milliseconds).

        Args:
            private_value: The secret scalar d.

        Raises:
            KeyMaterialError: d is not an int in [1, n-2].
        """
        if type(private_value) is not int or not 1 <= private_value <= SM2_ORDER - 2:
            raise KeyMaterialError("SM2 private key: scalar is outside [1, n-2]")
        point = _scalar_mult(private_value, SM2_GX, SM2_GY, _SM2_CURVE)
        if point is None:  # Unreachable for d in [1, n-1]; kept so a broken formula fails closed.
            raise KeyMaterialError("SM2 private key: [d]G is the point at infinity")
        self._d = private_value
        self._public_key = Sm2PublicKey(*point)
        self._native = {}
        self._native_lock = threading.Lock()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Sm2PrivateKey(public_key={self._public_key!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sm2PrivateKey):
            return NotImplemented
        return hmac.compare_digest(self._d.to_bytes(32, "big"), other._d.to_bytes(32, "big"))

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Sm2PrivateKey cannot be pickled; serialize it with to_pem(password)")

    @property
    def public_key(self) -> Sm2PublicKey:
        """The public key [d]G."""
        return self._public_key

    def private_value(self) -> int:
        """Return the secret scalar d. For backends only; never log or persist it outside `to_pem`."""
        return self._d

    def native_key(self, backend: object, load: Callable[[], _T]) -> _T:
        """Return `backend`'s native form of this key (e.g. an OpenSSL `EVP_PKEY`), loading it once.

        For backends only. Decoding a PKCS#8 key costs OpenSSL about as much as a signature, so a backend
        keeps its decoded key here, with this key, instead of decoding it for every signature. The object
        `load` returns lives exactly as long as this key (or until `drop_native_keys`): it must free its
        native resources when it is garbage-collected.

        Args:
            backend: The backend that owns the native key (one native key per backend).
            load: Creates the native key; called at most once per backend while the key holds it.

        Returns:
            What `load` returned for `backend`.
        """
        native = self._native.get(backend)
        if native is None:
            with self._native_lock:
                native = self._native.get(backend)
                if native is None:
                    native = self._native[backend] = load()
        return cast(_T, native)

    def drop_native_keys(self) -> None:
        """Release every backend's native form of this key now (backends load it again on the next use)."""
        with self._native_lock:
            self._native.clear()

    # -- loading -------------------------------------------------------------------------------------------

    @classmethod
    def from_der(cls, data: bytes, password: bytes | None = None) -> Sm2PrivateKey:
        """Load a DER PKCS#8 key: `PrivateKeyInfo` (RFC 5208/5958) or `EncryptedPrivateKeyInfo` (PBES2).

        The inner key is an RFC 5915 `ECPrivateKey`; an embedded public key must equal [d]G.

        Args:
            data: DER bytes.
            password: Required for an encrypted key; must be None for a plain one.

        Returns:
            The private key.

        Raises:
            UnsupportedAlgorithmError: Not an SM2 key, or an unsupported encryption scheme.
            KeyMaterialError: Malformed input, wrong or missing password, d outside [1, n-2], or a public key
                that does not match d.
        """
        what = "SM2 private key"
        if not isinstance(data, bytes | bytearray):
            raise KeyMaterialError(f"{what}: DER data must be bytes")
        data = bytes(data)
        if len(data) > _MAX_KEY_FILE_BYTES:
            raise KeyMaterialError(f"{what}: larger than {_MAX_KEY_FILE_BYTES} bytes")
        probe = _DerReader(data, what).sequence("PKCS#8")
        if probe.peek_tag() == _SEQUENCE:
            if password is None:
                raise KeyMaterialError(f"{what}: the key is encrypted; a password is required")
            data = _pkcs8_decrypt(data, password, what)
        elif password is not None:
            raise KeyMaterialError(f"{what}: a password was given but the key is not encrypted")
        return cls._from_private_key_info(data, what)

    @classmethod
    def from_pem(cls, data: bytes, password: bytes | None = None) -> Sm2PrivateKey:
        """Load a PEM key: `PRIVATE KEY`, `ENCRYPTED PRIVATE KEY` (PKCS#8), `EC`/`SM2 PRIVATE KEY` (SEC 1).

        Args:
            data: PEM bytes with exactly one key block.
            password: Required for `ENCRYPTED PRIVATE KEY`; must be None otherwise.

        Returns:
            The private key.

        Raises:
            UnsupportedAlgorithmError: Not an SM2 key, or an unsupported encryption scheme.
            KeyMaterialError: Not PEM, legacy PEM encryption, wrong or missing password, malformed key.
        """
        what = "SM2 private key"
        labels = ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "EC PRIVATE KEY", "SM2 PRIVATE KEY")
        label, der = _pem_decode(data, labels, what)
        if label in ("EC PRIVATE KEY", "SM2 PRIVATE KEY"):  # SEC 1; `openssl ec` 3.0 writes "SM2 PRIVATE KEY"
            if password is not None:
                raise KeyMaterialError(f"{what}: a password was given but the key is not encrypted")
            outer = _DerReader(der, what)
            key = cls._from_ec_private_key(outer.read(_SEQUENCE, "ECPrivateKey"), what, require_curve=True)
            outer.end()
            return key
        encrypted = label == "ENCRYPTED PRIVATE KEY"
        probe = _DerReader(der, what).sequence("PKCS#8")
        if encrypted != (probe.peek_tag() == _SEQUENCE):
            raise KeyMaterialError(f"{what}: PEM label {label!r} does not match its content")
        return cls.from_der(der, password)

    @classmethod
    def _from_private_key_info(cls, der: bytes, what: str) -> Sm2PrivateKey:
        outer = _DerReader(der, what)
        info = outer.sequence("PrivateKeyInfo")
        outer.end()
        version = info.integer("version")
        if version not in (0, 1):
            raise KeyMaterialError(f"{what}: unsupported PKCS#8 version {version}")
        oid, params = info.algorithm("privateKeyAlgorithm")
        _check_sm2_algorithm(oid, params, what)
        inner = _DerReader(info.octet_string("privateKey"), what)
        key = cls._from_ec_private_key(inner.read(_SEQUENCE, "ECPrivateKey"), what, require_curve=False)
        inner.end()
        if info.peek_tag() == 0xA0:  # attributes [0]: carry nothing modelsec uses
            info.read_any()
        if info.peek_tag() == 0x81:  # OneAsymmetricKey publicKey [1] (RFC 5958)
            embedded = info.read_any()[1]
            if embedded[:1] != b"\x00" or embedded[1:] != key.public_key.encoded_point():
                raise KeyMaterialError(f"{what}: PKCS#8 public key does not match the private key")
        info.end()
        return key

    @classmethod
    def _from_ec_private_key(cls, body: bytes, what: str, *, require_curve: bool) -> Sm2PrivateKey:
        # RFC 5915 §3: ECPrivateKey ::= SEQUENCE { version 1, privateKey OCTET STRING,
        #   parameters [0] ECParameters OPTIONAL, publicKey [1] BIT STRING OPTIONAL }
        seq = _DerReader(body, what)
        if seq.integer("ECPrivateKey.version") != 1:
            raise KeyMaterialError(f"{what}: ECPrivateKey version must be 1")
        raw = seq.octet_string("ECPrivateKey.privateKey")
        if not 1 <= len(raw) <= 32:
            raise KeyMaterialError(f"{what}: private scalar must be 1 to 32 bytes")
        if seq.peek_tag() == 0xA0:
            params = _DerReader(seq.read_any()[1], what)
            _check_sm2_algorithm(_OID_EC_PUBLIC_KEY, params, what)
        elif require_curve:
            raise KeyMaterialError(f"{what}: SEC 1 key without curve parameters")
        embedded: bytes | None = None
        if seq.peek_tag() == 0xA1:
            wrapper = _DerReader(seq.read_any()[1], what)
            embedded = wrapper.bit_string("ECPrivateKey.publicKey")
            wrapper.end()
        seq.end()
        key = cls(int.from_bytes(raw, "big"))
        if embedded is not None and embedded != key.public_key.encoded_point():
            raise KeyMaterialError(f"{what}: embedded public key does not match the private key")
        return key

    # -- writing -------------------------------------------------------------------------------------------

    def to_der(self) -> bytes:
        """Return the unencrypted DER PKCS#8 key, byte-identical to the DER inside `openssl pkey`'s PEM.

        That is also `openssl pkcs8 -topk8 -nocrypt -outform DER`; `openssl pkey -outform DER` writes SEC 1.

        Returns:
            `PrivateKeyInfo { 0, {id-ecPublicKey, sm2p256v1}, ECPrivateKey { 1, d (32 bytes), [1] point } }`.
        """
        ec_private_key = _tlv(
            _SEQUENCE,
            encode_integer(1)
            + _tlv(_OCTET_STRING, self._d.to_bytes(32, "big"))
            + _tlv(0xA1, _tlv(_BIT_STRING, b"\x00" + self._public_key.encoded_point())),
        )
        return _tlv(_SEQUENCE, encode_integer(0) + _SM2_ALGORITHM_DER + _tlv(_OCTET_STRING, ec_private_key))

    def to_pem(self, password: bytes | None = None) -> bytes:
        """Return the key as PEM PKCS#8, encrypted when a password is given.

        Without a password the output is byte-identical to `openssl pkey`. With a password it is an
        `ENCRYPTED PRIVATE KEY` using PBES2 (RFC 8018) with PBKDF2-HMAC-SHA256 (`PBKDF2_ITERATIONS`
        iterations, 16-byte random salt) and AES-256-CBC, the scheme `openssl pkey -aes256` uses (with more
        iterations), so `openssl pkey -passin` reads it.

        Args:
            password: The passphrase, or None for an unencrypted key.

        Returns:
            PEM bytes.

        Raises:
            KeyMaterialError: The password is empty.
        """
        if password is None:
            return _pem_encode("PRIVATE KEY", self.to_der())
        return _pem_encode("ENCRYPTED PRIVATE KEY", _pkcs8_encrypt(self.to_der(), password))


def generate_private_key() -> Sm2PrivateKey:
    """Generate a key with d drawn uniformly from [1, n-2] by `secrets` (GB/T 32918.1-2016 §6.1).

    Returns:
        A new private key.
    """
    return Sm2PrivateKey(secrets.randbelow(SM2_ORDER - 2) + 1)


# --------------------------------------------------------------------------------------------------------
# PKCS#8 encryption (PBES2, RFC 8018) with `cryptography` primitives, so that it works for both backends.
# --------------------------------------------------------------------------------------------------------


def _aes_cbc(key: bytes, iv: bytes, data: bytes, *, encrypt: bool) -> bytes:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    cipher = Cipher(algorithms.AES(key), modes.CBC(iv))
    ctx = cipher.encryptor() if encrypt else cipher.decryptor()
    return ctx.update(data) + ctx.finalize()


def _pkcs8_encrypt(der: bytes, password: bytes) -> bytes:
    if not isinstance(password, bytes | bytearray) or not password:
        raise KeyMaterialError("SM2 private key: the password must be non-empty bytes")
    salt, iv = secrets.token_bytes(16), secrets.token_bytes(16)
    key = hashlib.pbkdf2_hmac("sha256", bytes(password), salt, PBKDF2_ITERATIONS, 32)
    pad = 16 - len(der) % 16
    ciphertext = _aes_cbc(key, iv, der + bytes([pad]) * pad, encrypt=True)
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
    if enc_oid not in _AES_CBC_KEY_BYTES:
        raise UnsupportedAlgorithmError(f"{what}: unsupported key encryption cipher {enc_oid}")
    iv = enc_params.octet_string("IV")
    enc_params.end()
    if len(iv) != 16 or not ciphertext or len(ciphertext) % 16:
        raise KeyMaterialError(f"{what}: malformed AES-CBC parameters or ciphertext")
    key = _derive_key(kdf_oid, kdf_params, bytes(password), _AES_CBC_KEY_BYTES[enc_oid], what)
    plain = _aes_cbc(key, iv, ciphertext, encrypt=False)
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


# --------------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------------


class Sm2Backend(Protocol):
    """Computes SM2 signatures with SM3 (GB/T 32918.2-2016) over raw messages.

    Implementations compute `e = SM3(Z_A || M)` themselves from the key and `distid`, call
    `decode_sm2_signature` before any curve arithmetic, and raise instead of returning booleans.
    """

    @property
    def name(self) -> str:
        """Short backend name: `openssl` or `gmssl`."""
        ...

    def sign(self, private_key: Sm2PrivateKey, message: bytes, distid: bytes = DEFAULT_DISTID) -> bytes:
        """Sign the raw message `M`.

        Args:
            private_key: The signing key.
            message: The raw message `M` (not a digest).
            distid: The signer's distinguishing ID.

        Returns:
            DER `SEQUENCE { r INTEGER, s INTEGER }`.

        Raises:
            UnsupportedAlgorithmError: `distid` cannot be encoded.
            BackendUnavailableError: The backend failed to produce a signature.
        """
        ...

    def verify(
        self, public_key: Sm2PublicKey, message: bytes, signature: bytes, distid: bytes = DEFAULT_DISTID
    ) -> None:
        """Verify a DER signature over the raw message `M`; return only if it is valid.

        Args:
            public_key: The trusted public key.
            message: The raw message `M`.
            signature: DER `SEQUENCE { r, s }`.
            distid: The signer's distinguishing ID.

        Raises:
            SignatureError: On any failure, whatever its cause.
        """
        ...


_backends: dict[str, Sm2Backend] = {}
_backends_lock = threading.Lock()


def _make_openssl() -> Sm2Backend:
    from modelsec.signer._sm2_openssl import OpenSslSm2Backend

    return OpenSslSm2Backend()


def _make_gmssl() -> Sm2Backend:
    from modelsec.signer._sm2_gmssl import GmsslSm2Backend

    return GmsslSm2Backend()


_FACTORIES: Final[dict[str, Callable[[], Sm2Backend]]] = {"openssl": _make_openssl, "gmssl": _make_gmssl}


def backend_by_name(name: str) -> Sm2Backend:
    """Return the named backend, loading and self-testing it on first use (then cached).

    Args:
        name: `openssl`, `gmssl` or `auto` (OpenSSL if it has SM2 and passes its self-test, else gmssl).

    Returns:
        A self-tested backend.

    Raises:
        UnsupportedAlgorithmError: Unknown backend name.
        BackendUnavailableError: The backend is missing or failed its GB/T 32918.5 self-test.
    """
    name = name.strip().lower()
    if name == "auto":
        chosen = _backends.get("auto")
        if chosen is None:
            try:
                chosen = backend_by_name("openssl")
            except BackendUnavailableError as e:
                _LOG.warning("OpenSSL SM2 backend unavailable (%s); falling back to gmssl", e)
                chosen = backend_by_name("gmssl")
            with _backends_lock:
                chosen = _backends.setdefault("auto", chosen)
        return chosen
    if name not in _FACTORIES:
        raise UnsupportedAlgorithmError(f"unknown SM2 backend {name!r}; expected auto, openssl or gmssl")
    with _backends_lock:
        backend = _backends.get(name)
        if backend is None:
            backend = _FACTORIES[name]()
            _backends[name] = backend
        return backend


def default_backend() -> Sm2Backend:
    """Return the backend chosen by `MODELSEC_SM2_BACKEND` (`auto` when unset).

    Returns:
        A self-tested backend (instances are cached per name).

    Raises:
        UnsupportedAlgorithmError: The variable names no known backend.
        BackendUnavailableError: The chosen backend (or, for `auto`, both) is unavailable.
    """
    return backend_by_name(os.environ.get(BACKEND_ENV, "auto") or "auto")


def sign(
    private_key: Sm2PrivateKey,
    message: bytes,
    *,
    distid: bytes = DEFAULT_DISTID,
    backend: Sm2Backend | None = None,
) -> bytes:
    """Sign the raw message `M` with SM2/SM3 (GB/T 32918.2-2016 §6).

    Args:
        private_key: The signing key.
        message: The raw message.
        distid: The signer's distinguishing ID (modelsec always uses `DEFAULT_DISTID`).
        backend: Backend to use; `default_backend()` when None.

    Returns:
        DER `SEQUENCE { r, s }`.

    Raises:
        UnsupportedAlgorithmError: `distid` cannot be encoded.
        BackendUnavailableError: No usable backend.

    Example:
        >>> key = generate_private_key()
        >>> verify(key.public_key, b"m", sign(key, b"m"))
    """
    return (backend or default_backend()).sign(private_key, message, distid)


def verify(
    public_key: Sm2PublicKey,
    message: bytes,
    signature: bytes,
    *,
    distid: bytes = DEFAULT_DISTID,
    backend: Sm2Backend | None = None,
) -> None:
    """Verify an SM2/SM3 signature over the raw message `M` (GB/T 32918.2-2016 §7).

    Args:
        public_key: The trusted public key (never taken from the artifact).
        message: The raw message.
        signature: DER `SEQUENCE { r, s }`.
        distid: The signer's distinguishing ID.
        backend: Backend to use; `default_backend()` when None.

    Raises:
        SignatureError: The signature is invalid, malformed or out of range.
        BackendUnavailableError: No usable backend.
    """
    (backend or default_backend()).verify(public_key, message, signature, distid)


# --------------------------------------------------------------------------------------------------------
# Known answer shared by the backends' self-tests: GB/T 32918.5-2017 annex A (signature example).
# --------------------------------------------------------------------------------------------------------

_KAT_D: Final = 0x3945208F7B2144B13F36E38AC6D39F95889393692860B51A42FB81EF4DF7C5B8
_KAT_X: Final = 0x09F9DF311E5421A150DD7D161E4BC5C672179FAD1833FC076BB08FF356F35020
_KAT_Y: Final = 0xCCEA490CE26775A52DC6EA718CC1AA600AED05FBF35E084A6632F6072DA9AD13
_KAT_MESSAGE: Final = b"message digest"
_KAT_K: Final = 0x59276E27D506861A16680F3AD9C02DCCEF3CC1FA3CDBE4CE6D54B80DEAC1BC21
_KAT_R: Final = 0xF5A03B0648D2C4630EEAC513E1BB81A15944DA3827D5B74143AC7EACEEE720B3
_KAT_S: Final = 0xB1B6AA29DF212FD8763182BC0D421CA1BB9038FD1F7F42D4840B69C485BBC1AA


def _self_test(backend: Sm2Backend) -> None:
    """Fail closed unless `backend` verifies the annex signature, rejects a forgery and round-trips."""
    from modelsec.signer.der import encode_signature

    public = Sm2PublicKey(_KAT_X, _KAT_Y)
    private = Sm2PrivateKey(_KAT_D)
    if private.public_key != public:
        raise BackendUnavailableError("SM2: public key derivation does not reproduce GB/T 32918.5 annex A")
    known = encode_signature(_KAT_R, _KAT_S)
    try:
        backend.verify(public, _KAT_MESSAGE, known)
    except SignatureError as e:
        raise BackendUnavailableError(f"SM2 backend {backend.name}: known-answer verification failed") from e
    try:
        backend.verify(public, _KAT_MESSAGE + b".", known)
    except SignatureError:
        pass
    else:
        raise BackendUnavailableError(
            f"SM2 backend {backend.name}: accepted a signature over the wrong message"
        )
    try:
        backend.verify(public, _KAT_MESSAGE, backend.sign(private, _KAT_MESSAGE))
    except SignatureError as e:
        raise BackendUnavailableError(f"SM2 backend {backend.name}: sign/verify round trip failed") from e
