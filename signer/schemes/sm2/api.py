"""SM2 signatures with SM3 (GB/T 32918.2-2016): the public API and the choice of backend.

The parts live in private modules, imported in one direction (backends never import this module):

* `_sm2_core`: curve parameters (GB/T 32918.5-2017 §6), SM3, `Z_A` and `e = SM3(Z_A || M)` (GB/T 32918.2-2016
  §5.5, §6.1), the signature checks, and the pure-Python point multiplication kept for the gmssl fallback;
* `_sm2_asn1`: PEM, strict DER checks of key files (`asn1crypto`), the KDF-cost bounds of encrypted PKCS#8,
  and the writers (SPKI, PKCS#8, PBES2 on write);
* `_sm2_keys`: `Sm2PublicKey`, `Sm2PrivateKey`, byte-exact SubjectPublicKeyInfo and PKCS#8 as `openssl pkey`
  writes them; a private key's public key comes from OpenSSL where libcrypto 3 is present (`_sm2_libcrypto`);
* `_sm2_backend`: the `Sm2Backend` protocol and the self-test;
* `_sm2_openssl` (system OpenSSL >= 3.0 through `ctypes`, the default) and `_sm2_gmssl` (hardened PyPI
  `gmssl`, the portable fallback). Each self-tests against the GB/T 32918.5-2017 annex A example on first
  use and is refused (`BackendUnavailableError`) if the test fails.

Verification order (an invariant of every backend): the signature is decoded as strict DER and `r`, `s` are
checked to lie in [1, n-1] (GB/T 32918.2-2016 §7.1 B1, B2) and `t = (r + s) mod n != 0` (B5) *before* any
curve arithmetic; only then is `e` computed and the curve equation checked. Every failure is a
`SignatureError`; verification never returns a boolean.

Key files are read by OpenSSL where libcrypto 3 with SM2 is present, whichever backend signs: modelsec checks
the PEM and the DER structure and bounds an encrypted key's KDF cost first, then OpenSSL decrypts (PBES2 with
PBKDF2 or scrypt, AES-CBC or SM4-CBC, hmacWithSM3 where the build knows it) and returns d and [d]G. Without
libcrypto 3 (gmssl fallback) unencrypted keys are read with `asn1crypto` and encrypted keys are refused.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Final

from modelsec.errors import BackendUnavailableError, UnsupportedAlgorithmError
from modelsec.signer.schemes.sm2._asn1 import PBKDF2_ITERATIONS
from modelsec.signer.schemes.sm2._backend import Sm2Backend
from modelsec.signer.schemes.sm2._core import (
    BACKEND_ENV,
    DEFAULT_DISTID,
    SM2_A,
    SM2_B,
    SM2_GX,
    SM2_GY,
    SM2_ORDER,
    SM2_P,
    check_distid,
    compute_digest,
    compute_za,
    decode_sm2_signature,
)
from modelsec.signer.schemes.sm2._keys import Sm2PrivateKey, Sm2PublicKey, generate_private_key

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


_backends: dict[str, Sm2Backend] = {}
_backends_lock = threading.Lock()


def _make_openssl() -> Sm2Backend:
    from modelsec.signer.schemes.sm2._openssl import OpenSslSm2Backend

    return OpenSslSm2Backend()


def _make_gmssl() -> Sm2Backend:
    from modelsec.signer.schemes.sm2._gmssl import GmsslSm2Backend

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
