"""The `Sm2Backend` protocol and the known-answer self-test every backend passes before it is used."""

from __future__ import annotations

from typing import Protocol

from modelsec.errors import BackendUnavailableError, SignatureError
from modelsec.signer.der import encode_signature
from modelsec.signer.schemes.sm2._core import (
    _KAT_D,
    _KAT_MESSAGE,
    _KAT_R,
    _KAT_S,
    _KAT_X,
    _KAT_Y,
    DEFAULT_DISTID,
)
from modelsec.signer.schemes.sm2._keys import Sm2PrivateKey, Sm2PublicKey

__all__ = ["Sm2Backend"]


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


def _self_test(backend: Sm2Backend) -> None:
    """Fail closed unless `backend` verifies the annex signature, rejects a forgery and round-trips."""
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
