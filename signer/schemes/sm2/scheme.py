"""SM2 with SM3 (GB/T 32918.2-2016, distinguishing ID `1234567812345678`) through `sm2.api`.

Signing and verification run on the SM2 backend chosen by `MODELSEC_SM2_BACKEND` (OpenSSL EVP by default,
hardened gmssl fallback); a loaded signing key keeps the backend of its first signature. SM2 keys sign the
SM3 manifest. The SM2 modules load on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import SignatureError
from modelsec.signer.schemes.base import KeyBackend, PublicKeyVerifier

if TYPE_CHECKING:
    from modelsec.signer.schemes.sm2.api import Sm2Backend, Sm2PrivateKey, Sm2PublicKey

__all__ = ["SM2", "Sm2Scheme"]


@dataclass(frozen=True, slots=True)
class Sm2Scheme:
    """SM2/SM3 (see the module docstring)."""

    algorithm: SignatureAlgorithm = SignatureAlgorithm.SM2
    manifest_hash: HashAlgorithm = HashAlgorithm.SM3
    signable_hashes: frozenset[HashAlgorithm] = frozenset({HashAlgorithm.SM3})
    default_bundle_name: str = "model.sm2.sig"
    family: str = "sm2"
    certified: bool = False
    curve_oid_der: bytes = bytes.fromhex("06082a811ccf5501822d")  # 1.2.156.10197.1.301 sm2p256v1

    def key_matches(self, der: bytes) -> bool:
        """Whether `der` carries the sm2p256v1 namedCurve OID."""
        return self.curve_oid_der in der

    def signature_form_error(self, signature: bytes) -> str | None:
        """Why `signature` is not strict DER SM2 (r, s in [1, n-1], (r + s) mod n != 0); None if it is.

        GB/T 32918.2-2016 section 7.1, steps B1-B2 and B5.
        """
        from modelsec.signer.der import decode_signature
        from modelsec.signer.schemes.sm2._core import SM2_ORDER

        try:
            r, s = decode_signature(signature, SM2_ORDER)
        except SignatureError as e:
            return str(e).removeprefix("invalid signature: ")
        return "(r + s) mod n = 0" if (r + s) % SM2_ORDER == 0 else None

    def generate_private_key_pem(self, password: bytes | None) -> tuple[bytes, bytes]:
        """A new key pair; the PKCS#8 private key is PBES2-encrypted when `password` is set."""
        from modelsec.signer.schemes.sm2 import api as sm2

        key = sm2.generate_private_key()
        return key.to_pem(password), key.public_key.to_pem()

    def load_private_key(self, pem: bytes, *, name: str, password: bytes | None) -> KeyBackend:
        """Load a PKCS#8 (optionally encrypted) or SEC 1 SM2 private key.

        Raises:
            KeyMaterialError: Malformed key, wrong or missing password.
            UnsupportedAlgorithmError: Not an SM2 key, or an unsupported key encryption.
        """
        from modelsec.signer.schemes.sm2 import api as sm2

        return _Sm2KeyBackend(sm2.Sm2PrivateKey.from_pem(pem, password))

    def load_public_key(self, pem: bytes, *, name: str) -> tuple[bytes, PublicKeyVerifier]:
        """Load an SM2 SubjectPublicKeyInfo PEM: `(canonical PEM, verifier)`.

        Raises:
            KeyMaterialError: Malformed key or a point not on the curve.
            UnsupportedAlgorithmError: Not an SM2 key.
        """
        from modelsec.signer.schemes.sm2 import api as sm2

        key = sm2.Sm2PublicKey.from_pem(pem)
        return key.to_pem(), _Sm2Verifier(key)


@dataclass(frozen=True, slots=True, repr=False)
class _Sm2KeyBackend:
    _key: Sm2PrivateKey
    # The backend `MODELSEC_SM2_BACKEND` chose at this key's first signature, kept for the key's others.
    _backend: Sm2Backend | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        return "<SM2 key backend>"

    @property
    def algorithm(self) -> SignatureAlgorithm:
        return SignatureAlgorithm.SM2

    def public_key_pem(self) -> bytes:
        return self._key.public_key.to_pem()

    def sign(self, message: bytes) -> bytes:
        backend = self._backend
        if backend is None:
            from modelsec.signer.schemes.sm2 import api as sm2

            backend = sm2.default_backend()  # threads racing here get the same cached backend
            object.__setattr__(self, "_backend", backend)
        return backend.sign(self._key, message)


@dataclass(frozen=True, slots=True, repr=False)
class _Sm2Verifier:
    _key: Sm2PublicKey
    # As `_Sm2KeyBackend`: the backend `MODELSEC_SM2_BACKEND` chose at this key's first verification.
    _backend: Sm2Backend | None = field(default=None, compare=False)

    def verify(self, signature: bytes, message: bytes, *, name: str) -> None:
        backend = self._backend
        if backend is None:
            from modelsec.signer.schemes.sm2 import api as sm2

            backend = sm2.default_backend()
            object.__setattr__(self, "_backend", backend)
        try:
            # Every backend decodes the signature strictly (`decode_sm2_signature`) before any arithmetic,
            # so the form is checked once here; its reason is looked up only for a refused signature.
            backend.verify(self._key, message, signature)
        except SignatureError:
            problem = SM2.signature_form_error(signature)
            if problem is not None:
                raise SignatureError(
                    f"invalid signature: an sm2 key cannot have made this signature ({problem})"
                ) from None
            raise


SM2 = Sm2Scheme()
