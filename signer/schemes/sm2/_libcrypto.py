"""The system OpenSSL >= 3.0 `libcrypto`, bound with `ctypes`, and the SM2 public-key derivation it provides.

`load_libcrypto` finds the library and gives every function modelsec calls its C signature (the SM2 backend,
`_sm2_openssl`, uses it). `decode_private_key` reads (and decrypts) SM2 key files with `OSSL_DECODER`, and
`public_point` computes a private key's public key [d]G in OpenSSL (constant-time `EC_POINT_mul`), so that
no secret scalar meets modelsec's pure-Python curve arithmetic where libcrypto 3 is present.
This module imports no other SM2 module but `_sm2_asn1` and `_sm2_core`, so nothing imports in a circle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from ctypes import POINTER, c_char_p, c_int, c_long, c_size_t, c_ulong, c_void_p
from typing import Final

from modelsec.errors import BackendUnavailableError, KeyMaterialError, UnsupportedAlgorithmError
from modelsec.signer.schemes.sm2._asn1 import pkcs8_der
from modelsec.signer.schemes.sm2._core import _KAT_D, _KAT_X, _KAT_Y, SM2_ORDER

__all__ = [
    "available",
    "decode_private_key",
    "decrypt_pkcs8",
    "knows_oid",
    "load_libcrypto",
    "public_point",
    "version",
]

_MIN_VERSION: Final = 0x30000000
_CANDIDATES: Final = ("libcrypto.so.3", "libcrypto.3.dylib", "libcrypto-3-x64.dll")


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
            _bind(
                lib,
                "OSSL_DECODER_CTX_new_for_pkey",
                c_void_p,
                [POINTER(c_void_p), c_char_p, c_char_p, c_char_p, c_int, c_void_p, c_char_p],
            )
            _bind(lib, "OSSL_DECODER_CTX_set_passphrase", c_int, [c_void_p, c_void_p, c_size_t])
            _bind(lib, "OSSL_DECODER_from_data", c_int, [c_void_p, POINTER(c_void_p), POINTER(c_size_t)])
            _bind(lib, "OSSL_DECODER_CTX_free", None, [c_void_p])
            _bind(lib, "EVP_PKEY_get_bn_param", c_int, [c_void_p, c_char_p, POINTER(c_void_p)])
            _bind(lib, "EVP_PKEY_pairwise_check", c_int, [c_void_p])
            _bind(lib, "BN_bn2binpad", c_int, [c_void_p, c_void_p, c_int])
            _bind(lib, "BN_clear_free", None, [c_void_p])
            _bind(lib, "OBJ_txt2nid", c_int, [c_char_p])
            _bind(lib, "d2i_X509_SIG", c_void_p, [c_void_p, POINTER(c_void_p), c_long])
            _bind(lib, "X509_SIG_free", None, [c_void_p])
            _bind(lib, "PKCS8_decrypt", c_void_p, [c_void_p, c_void_p, c_int])
            _bind(lib, "i2d_PKCS8_PRIV_KEY_INFO", c_int, [c_void_p, POINTER(c_void_p)])
            _bind(lib, "PKCS8_PRIV_KEY_INFO_free", None, [c_void_p])
        except AttributeError as e:
            problems.append(f"{name}: missing symbol ({e})")
            continue
        return lib
    raise BackendUnavailableError("OpenSSL >= 3.0 libcrypto not found: " + "; ".join(problems))


def _errors(lib: ctypes.CDLL) -> str:
    """Drain the thread's OpenSSL error queue into one line."""
    messages: list[str] = []
    buf = ctypes.create_string_buffer(256)
    for _ in range(16):
        code = int(lib.ERR_get_error())
        if not code:
            break
        lib.ERR_error_string_n(code, buf, len(buf))
        messages.append(buf.value.decode("ascii", "replace"))
    lib.ERR_clear_error()
    return "; ".join(messages) or "no OpenSSL error reported"


def _bn_param(lib: ctypes.CDLL, pkey: int, name: bytes) -> int | None:
    bn = c_void_p()
    if lib.EVP_PKEY_get_bn_param(pkey, name, ctypes.byref(bn)) != 1 or not bn.value:
        return None
    out = ctypes.create_string_buffer(32)
    try:
        if lib.BN_bn2binpad(bn, out, 32) != 32:
            return None
        return int.from_bytes(out.raw, "big")
    finally:
        lib.BN_clear_free(bn)
        ctypes.memset(out, 0, 32)


def _decode(
    lib: ctypes.CDLL, der: bytes, structure: bytes, password: bytes | None
) -> tuple[int, tuple[int, int]] | str:
    """Decode one whole DER key with `OSSL_DECODER`; `(d, (x, y))`, or OpenSSL's reason for refusing it."""
    pkey = c_void_p()
    ctx = lib.OSSL_DECODER_CTX_new_for_pkey(ctypes.byref(pkey), b"DER", structure, None, 0, None, None)
    if not ctx:
        return "OpenSSL has no decoder for " + structure.decode()
    buf = ctypes.create_string_buffer(der, len(der))
    secret = ctypes.create_string_buffer(password or b"", len(password or b""))
    try:
        if password is not None and lib.OSSL_DECODER_CTX_set_passphrase(ctx, secret, len(password)) != 1:
            return _errors(lib)
        cursor, left = c_void_p(ctypes.addressof(buf)), c_size_t(len(der))
        if lib.OSSL_DECODER_from_data(ctx, ctypes.byref(cursor), ctypes.byref(left)) != 1 or not pkey.value:
            return _errors(lib)
        try:
            if left.value != 0:
                return "trailing data after the key"
            if lib.EVP_PKEY_is_a(pkey, b"SM2") != 1:
                return "not SM2"
            pctx = lib.EVP_PKEY_CTX_new(pkey, None)
            try:
                # An embedded public key must be [d]G (OpenSSL computes [d]G itself when there is none).
                if not pctx or lib.EVP_PKEY_pairwise_check(pctx) != 1:
                    return "the public key in the file does not match the private key"
            finally:
                lib.EVP_PKEY_CTX_free(pctx)
            d, x, y = (_bn_param(lib, pkey.value, name) for name in (b"priv", b"qx", b"qy"))
            if d is None or x is None or y is None:
                return "OpenSSL did not return the key's scalar and point"
            return d, (x, y)
        finally:
            lib.EVP_PKEY_free(pkey)
    finally:
        lib.OSSL_DECODER_CTX_free(ctx)
        ctypes.memset(buf, 0, len(der))
        ctypes.memset(secret, 0, len(secret))
        lib.ERR_clear_error()


@functools.cache
def _key_libcrypto() -> ctypes.CDLL | None:
    """Libcrypto if it decodes the GB/T 32918.5-2017 annex A key to the annex public key, else None."""
    try:
        lib = load_libcrypto()
    except BackendUnavailableError:
        return None
    known = _decode(lib, pkcs8_der(_KAT_D, None), b"PrivateKeyInfo", None)
    return lib if known == (_KAT_D, (_KAT_X, _KAT_Y)) else None


def available() -> bool:
    """Whether SM2 keys are read and derived by OpenSSL (libcrypto >= 3.0 with SM2 that passed the check)."""
    return _key_libcrypto() is not None


def knows_oid(dotted: str) -> bool:
    """Whether this libcrypto knows an OBJECT IDENTIFIER (e.g. hmacWithSM3, known from OpenSSL 3.2 on)."""
    lib = _key_libcrypto()
    if lib is None:
        return False
    try:
        return int(lib.OBJ_txt2nid(dotted.encode("ascii"))) != 0
    finally:
        lib.ERR_clear_error()


def version() -> str:
    """The libcrypto version string, for messages."""
    lib = _key_libcrypto()
    raw = lib.OpenSSL_version(0) if lib is not None else None
    return raw.decode("ascii", "replace") if isinstance(raw, bytes) else "no libcrypto 3"


def decrypt_pkcs8(der: bytes, password: bytes, what: str) -> bytes:
    """Decrypt an `EncryptedPrivateKeyInfo` with OpenSSL (`PKCS8_decrypt`) into DER `PrivateKeyInfo`.

    The caller has bounded the KDF cost first (`_sm2_asn1.check_encrypted`); OpenSSL does not.

    Raises:
        BackendUnavailableError: libcrypto 3 with SM2 is not available (check `available()` first).
        KeyMaterialError: Wrong password or corrupted file.
    """
    lib = _key_libcrypto()
    if lib is None:
        raise BackendUnavailableError("OpenSSL >= 3.0 libcrypto with SM2 is not available")
    buf = ctypes.create_string_buffer(der, len(der))
    secret = ctypes.create_string_buffer(password, len(password))
    sig = p8inf = None
    try:
        cursor = c_void_p(ctypes.addressof(buf))
        sig = lib.d2i_X509_SIG(None, ctypes.byref(cursor), len(der))
        if not sig or cursor.value != ctypes.addressof(buf) + len(der):
            raise KeyMaterialError(f"{what}: OpenSSL cannot read the EncryptedPrivateKeyInfo: {_errors(lib)}")
        p8inf = lib.PKCS8_decrypt(sig, secret, len(password))
        size = int(lib.i2d_PKCS8_PRIV_KEY_INFO(p8inf, None)) if p8inf else 0
        if size <= 0:
            raise KeyMaterialError(
                f"{what}: cannot decrypt the key (wrong password or corrupted file): {_errors(lib)}"
            )
        out = ctypes.create_string_buffer(size)
        out_cursor = c_void_p(ctypes.addressof(out))
        if lib.i2d_PKCS8_PRIV_KEY_INFO(p8inf, ctypes.byref(out_cursor)) != size:
            raise KeyMaterialError(f"{what}: OpenSSL could not re-encode the decrypted key")
        plain = out.raw
        ctypes.memset(out, 0, size)
        return plain
    finally:
        if p8inf:
            lib.PKCS8_PRIV_KEY_INFO_free(p8inf)
        if sig:
            lib.X509_SIG_free(sig)
        ctypes.memset(buf, 0, len(der))
        ctypes.memset(secret, 0, len(password))
        lib.ERR_clear_error()


def decode_private_key(
    der: bytes, structure: str, password: bytes | None, what: str
) -> tuple[int, tuple[int, int]]:
    """Decode (and, for `EncryptedPrivateKeyInfo`, decrypt) an SM2 private key with OpenSSL.

    The caller has checked the structure and, for an encrypted key, bounded its KDF cost first.

    Args:
        der: DER of the key.
        structure: `PrivateKeyInfo`, `EncryptedPrivateKeyInfo` or `type-specific` (SEC 1).
        password: The passphrase of an encrypted key (any bytes), else None.
        what: Names the key in errors.

    Returns:
        d and the public point (x, y): the file's (checked to be [d]G), or [d]G computed by OpenSSL.

    Raises:
        BackendUnavailableError: libcrypto 3 with SM2 is not available (check `available()` first).
        UnsupportedAlgorithmError: The key is not an SM2 key.
        KeyMaterialError: OpenSSL refused the key: wrong password, corrupted file, mismatched public key.
    """
    lib = _key_libcrypto()
    if lib is None:
        raise BackendUnavailableError("OpenSSL >= 3.0 libcrypto with SM2 is not available")
    result = _decode(lib, der, structure.encode("ascii"), password)
    if isinstance(result, tuple):
        return result
    if result == "not SM2":
        raise UnsupportedAlgorithmError(f"{what}: not an SM2 key (id-ecPublicKey + sm2p256v1)")
    if password is not None:
        raise KeyMaterialError(f"{what}: cannot decrypt the key (wrong password or corrupted file): {result}")
    raise KeyMaterialError(f"{what}: OpenSSL cannot decode the key: {result}")


def public_point(private_value: int) -> tuple[int, int] | None:
    """The public key [d]G of an SM2 scalar, computed by OpenSSL (constant-time `EC_POINT_mul`).

    The caller validates the point (`Sm2PublicKey` checks the curve equation).

    Args:
        private_value: d, in [1, n-2].

    Returns:
        The affine `(x, y)`, or None when libcrypto 3 with SM2 is missing or failed the annex A check (the
        caller then computes [d]G itself).
    """
    lib = _key_libcrypto()
    if lib is None or not 1 <= private_value <= SM2_ORDER - 2:
        return None
    result = _decode(lib, pkcs8_der(private_value, None), b"PrivateKeyInfo", None)
    return result[1] if isinstance(result, tuple) else None
