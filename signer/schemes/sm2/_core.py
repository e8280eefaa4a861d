"""SM2 parameters, SM3, Z_A and e, the signature checks every backend runs first, the annex-A known answer.

No secrets pass through this module except in `_scalar_mult`, the pure-Python point multiplication that
derives a public key [d]G only when OpenSSL (`modelsec.signer.schemes.sm2._libcrypto`) cannot: the gmssl
fallback on a system without libcrypto 3. It is not constant-time and runs once per key, never per signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import SignatureError, UnsupportedAlgorithmError
from modelsec.modelformat.hashing import hmac_sm3, new_hasher
from modelsec.signer.der import decode_signature

if TYPE_CHECKING:
    from modelsec.signer.schemes.sm2._keys import Sm2PublicKey

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

# ENTL is a 16-bit count of *bits* (GB/T 32918.2-2016 §5.5), so at most 8191 bytes; OpenSSL requires
# id_len < UINT16_MAX / 8 (crypto/sm2/sm2_sign.c), one byte less. Both backends use OpenSSL's bound.
_MAX_DISTID_BYTES: Final = 8190


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
    return hmac_sm3(key, data)


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
# Known answer shared by the backends' self-tests: GB/T 32918.5-2017 annex A (signature example).
# --------------------------------------------------------------------------------------------------------

_KAT_D: Final = 0x3945208F7B2144B13F36E38AC6D39F95889393692860B51A42FB81EF4DF7C5B8
_KAT_X: Final = 0x09F9DF311E5421A150DD7D161E4BC5C672179FAD1833FC076BB08FF356F35020
_KAT_Y: Final = 0xCCEA490CE26775A52DC6EA718CC1AA600AED05FBF35E084A6632F6072DA9AD13
_KAT_MESSAGE: Final = b"message digest"
_KAT_K: Final = 0x59276E27D506861A16680F3AD9C02DCCEF3CC1FA3CDBE4CE6D54B80DEAC1BC21
_KAT_R: Final = 0xF5A03B0648D2C4630EEAC513E1BB81A15944DA3827D5B74143AC7EACEEE720B3
_KAT_S: Final = 0xB1B6AA29DF212FD8763182BC0D421CA1BB9038FD1F7F42D4840B69C485BBC1AA
