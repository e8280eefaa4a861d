"""The system OpenSSL >= 3.0 `libcrypto`, bound with `ctypes`, and the SM2 public-key derivation it provides.

`load_libcrypto` finds the library and gives every function modelsec calls its C signature (the SM2 backend,
`_sm2_openssl`, uses it). `public_point` computes a private key's public key [d]G in OpenSSL (constant-time
`EC_POINT_mul`) instead of the pure-Python multiplication, which stays only for systems without libcrypto 3.
This module imports no other SM2 module but `_sm2_asn1` and `_sm2_core`, so nothing imports in a circle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from ctypes import POINTER, c_char_p, c_int, c_long, c_size_t, c_ulong, c_void_p
from typing import Final

from modelsec.errors import BackendUnavailableError
from modelsec.signer._sm2_asn1 import _BIT_STRING, _OCTET_STRING, _SEQUENCE, _SM2_ALGORITHM_DER, _tlv
from modelsec.signer._sm2_core import _KAT_D, _KAT_X, _KAT_Y, SM2_ORDER
from modelsec.signer.der import encode_integer

__all__ = ["load_libcrypto", "public_point"]

_MIN_VERSION: Final = 0x30000000
_CANDIDATES: Final = ("libcrypto.so.3", "libcrypto.3.dylib", "libcrypto-3-x64.dll")
# SubjectPublicKeyInfo of an SM2 key, up to the 64 bytes x || y of its uncompressed point.
_SPKI_PREFIX: Final = _tlv(_SEQUENCE, _SM2_ALGORITHM_DER + _tlv(_BIT_STRING, b"\x00\x04" + bytes(64)))[:-64]


def _bind(lib: ctypes.CDLL, name: str, restype: type | None, argtypes: list[type]) -> None:
    func = getattr(lib, name)
    func.restype = restype
    func.argtypes = argtypes


def load_libcrypto() -> ctypes.CDLL:
    """Find and load libcrypto >= 3.0, with every function modelsec calls given its C signature."""
    names: list[str] = []
    found = ctypes.util.find_library("crypto")
    if found:
        names.append(found)
    names.extend(n for n in _CANDIDATES if n not in names)
    problems: list[str] = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            _bind(lib, "OpenSSL_version_num", c_ulong, [])
            version = int(lib.OpenSSL_version_num())
        except (OSError, AttributeError) as e:
            problems.append(f"{name}: {e}")
            continue
        if version < _MIN_VERSION:
            problems.append(f"{name}: version 0x{version:08x} is older than 3.0")
            continue
        try:
            _bind(lib, "OpenSSL_version", c_char_p, [c_int])
            _bind(lib, "ERR_clear_error", None, [])
            _bind(lib, "ERR_get_error", c_ulong, [])
            _bind(lib, "ERR_error_string_n", None, [c_ulong, c_char_p, c_size_t])
            _bind(lib, "d2i_PUBKEY", c_void_p, [c_void_p, POINTER(c_void_p), c_long])
            _bind(lib, "d2i_AutoPrivateKey", c_void_p, [c_void_p, POINTER(c_void_p), c_long])
            _bind(lib, "i2d_PUBKEY", c_int, [c_void_p, POINTER(c_void_p)])
            _bind(lib, "EVP_PKEY_free", None, [c_void_p])
            _bind(lib, "EVP_PKEY_up_ref", c_int, [c_void_p])
            _bind(lib, "EVP_PKEY_is_a", c_int, [c_void_p, c_char_p])
            _bind(lib, "EVP_MD_CTX_new", c_void_p, [])
            _bind(lib, "EVP_MD_CTX_free", None, [c_void_p])
            _bind(lib, "EVP_PKEY_CTX_new", c_void_p, [c_void_p, c_void_p])
            _bind(lib, "EVP_PKEY_CTX_free", None, [c_void_p])
            _bind(lib, "EVP_PKEY_CTX_set1_id", c_int, [c_void_p, c_void_p, c_int])
            _bind(lib, "EVP_MD_CTX_set_pkey_ctx", None, [c_void_p, c_void_p])
            _bind(lib, "EVP_sm3", c_void_p, [])
            _bind(lib, "EVP_DigestSignInit", c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p])
            _bind(lib, "EVP_DigestSign", c_int, [c_void_p, c_void_p, POINTER(c_size_t), c_char_p, c_size_t])
            _bind(lib, "EVP_DigestVerifyInit", c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p])
            _bind(lib, "EVP_DigestVerify", c_int, [c_void_p, c_char_p, c_size_t, c_char_p, c_size_t])
        except AttributeError as e:
            problems.append(f"{name}: missing symbol ({e})")
            continue
        return lib
    raise BackendUnavailableError("OpenSSL >= 3.0 libcrypto not found: " + "; ".join(problems))


def _pkcs8_without_public_key(private_value: int) -> bytes:
    """PKCS#8 `PrivateKeyInfo` of an SM2 scalar with no public key: OpenSSL computes [d]G when decoding it."""
    ec_private_key = _tlv(
        _SEQUENCE, encode_integer(1) + _tlv(_OCTET_STRING, private_value.to_bytes(32, "big"))
    )
    return _tlv(_SEQUENCE, encode_integer(0) + _SM2_ALGORITHM_DER + _tlv(_OCTET_STRING, ec_private_key))


def _derive(lib: ctypes.CDLL, private_value: int) -> tuple[int, int] | None:
    der = _pkcs8_without_public_key(private_value)
    buf = ctypes.create_string_buffer(der, len(der))
    try:
        cursor = c_void_p(ctypes.addressof(buf))
        pkey = lib.d2i_AutoPrivateKey(None, ctypes.byref(cursor), len(der))
        if not pkey:
            return None
        try:
            if lib.EVP_PKEY_is_a(pkey, b"SM2") != 1 or lib.i2d_PUBKEY(pkey, None) != len(_SPKI_PREFIX) + 64:
                return None
            out = ctypes.create_string_buffer(len(_SPKI_PREFIX) + 64)
            out_cursor = c_void_p(ctypes.addressof(out))
            if lib.i2d_PUBKEY(pkey, ctypes.byref(out_cursor)) != len(out):
                return None
        finally:
            lib.EVP_PKEY_free(pkey)
    finally:
        ctypes.memset(buf, 0, len(der))
        lib.ERR_clear_error()
    spki = out.raw
    if not spki.startswith(_SPKI_PREFIX):
        return None
    return int.from_bytes(spki[-64:-32], "big"), int.from_bytes(spki[-32:], "big")


@functools.cache
def _deriving_libcrypto() -> ctypes.CDLL | None:
    """Libcrypto if it reproduces the GB/T 32918.5-2017 annex A public key, else None (checked once)."""
    try:
        lib = load_libcrypto()
    except BackendUnavailableError:
        return None
    return lib if _derive(lib, _KAT_D) == (_KAT_X, _KAT_Y) else None


def public_point(private_value: int) -> tuple[int, int] | None:
    """The public key [d]G of an SM2 scalar, computed by OpenSSL.

    The caller validates the point (`Sm2PublicKey` checks the curve equation).

    Args:
        private_value: d, in [1, n-2].

    Returns:
        The affine `(x, y)`, or None when libcrypto 3 with SM2 is missing or failed the annex A check (the
        caller then computes [d]G itself).
    """
    lib = _deriving_libcrypto()
    if lib is None or not 1 <= private_value <= SM2_ORDER - 2:
        return None
    return _derive(lib, private_value)
