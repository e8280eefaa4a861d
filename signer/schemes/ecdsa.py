"""ECDSA over NIST P-256 with SHA-256 and P-384 with SHA-384 (FIPS 186-5), through `cryptography`.

Signatures are DER, deterministic (RFC 6979), so golden files are reproducible, and low-S (s <= n/2: of
the two valid forms (r, s) and (r, n - s) the signer emits the smaller). Verification accepts high-S too
(model_signing emits it) but decodes the DER strictly (`modelsec.signer.der`, r and s in [1, n-1]) before
`cryptography` sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import KeyMaterialError, SignatureError, UnsupportedAlgorithmError
from modelsec.signer.der import decode_signature, encode_signature
from modelsec.signer.schemes.base import KeyBackend, PublicKeyVerifier, load_pem_private_key

__all__ = ["ECDSA_P256", "ECDSA_P384", "EcdsaScheme"]

_SPKI = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True, slots=True)
class EcdsaScheme:
    """ECDSA on one named curve with its fixed hash (see the module docstring)."""

    algorithm: SignatureAlgorithm
    curve: type[ec.EllipticCurve]
    hash: type[hashes.HashAlgorithm]
    order: int
    curve_oid_der: bytes  # the namedCurve OID as it appears in an SPKI / PKCS#8 / SEC 1 DER
    default_bundle_name: str
    manifest_hash: HashAlgorithm = HashAlgorithm.SHA256
    signable_hashes: frozenset[HashAlgorithm] = frozenset({HashAlgorithm.SHA256, HashAlgorithm.BLAKE3})
    family: str = "ecdsa"
    certified: bool = True

    def key_matches(self, der: bytes) -> bool:
        """Whether `der` carries this scheme's namedCurve OID."""
        return self.curve_oid_der in der

    def generate_private_key_pem(self, password: bytes | None) -> tuple[bytes, bytes]:
        """A new key pair; the PKCS#8 private key is encrypted (best PBES2) when `password` is set."""
        key = ec.generate_private_key(self.curve())
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        )
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        return private, key.public_key().public_bytes(*_SPKI)

    def load_private_key(self, pem: bytes, *, name: str, password: bytes | None) -> KeyBackend:
        """Load a PKCS#8 (or SEC 1) PEM private key on this curve.

        Raises:
            KeyMaterialError: Not a valid PEM private key, wrong, missing or superfluous password.
            UnsupportedAlgorithmError: Another key type or curve.
        """
        key = load_pem_private_key(pem, password, name=name)
        self._check_curve(key, name)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise KeyMaterialError(f"{name}: not a private key")
        return _EcdsaKeyBackend(self, key)

    def load_public_key(self, pem: bytes, *, name: str) -> tuple[bytes, PublicKeyVerifier]:
        """Load a SubjectPublicKeyInfo PEM on this curve: `(canonical PEM, verifier)`.

        Raises:
            KeyMaterialError: Not a valid PEM public key.
            UnsupportedAlgorithmError: Another key type or curve.
        """
        try:
            key = serialization.load_pem_public_key(pem)
        except UnsupportedAlgorithm as e:
            raise UnsupportedAlgorithmError(f"{name}: unsupported public key type: {e}") from e
        except ValueError as e:
            raise KeyMaterialError(
                f"{name}: not a valid PEM public key: give a SubjectPublicKeyInfo PEM file (keygen writes "
                "PREFIX.pub.pem)"
            ).with_details(str(e)) from e
        self._check_curve(key, name)
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise KeyMaterialError(f"{name}: not a public key")
        return key.public_bytes(*_SPKI), _EcdsaVerifier(self, key)

    def signature_form_error(self, signature: bytes) -> str | None:
        """Why `signature` is not strict DER ECDSA on this curve (r, s in [1, n-1]); None if it is."""
        try:
            decode_signature(signature, self.order)
        except SignatureError as e:
            return str(e).removeprefix("invalid signature: ")
        return None

    def _check_curve(self, key: object, name: str) -> None:
        if not isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
            from modelsec.signer.schemes import supported_names

            raise UnsupportedAlgorithmError(
                f"{name}: {type(key).__name__} keys are not supported (use {supported_names()})"
            )
        if not isinstance(key.curve, self.curve):
            raise UnsupportedAlgorithmError(
                f"{name}: ECDSA curve {key.curve.name} is not supported (use P-256 or P-384)"
            )


@dataclass(frozen=True, slots=True, repr=False)
class _EcdsaKeyBackend:
    _scheme: EcdsaScheme
    _key: ec.EllipticCurvePrivateKey

    def __repr__(self) -> str:
        return f"<ECDSA key backend {self.algorithm}>"

    @property
    def algorithm(self) -> SignatureAlgorithm:
        return self._scheme.algorithm

    def public_key_pem(self) -> bytes:
        return self._key.public_key().public_bytes(*_SPKI)

    def sign(self, message: bytes) -> bytes:
        signature = self._key.sign(message, ec.ECDSA(self._scheme.hash(), deterministic_signing=True))
        # (r, s) and (r, n - s) both verify; emit the low-S form (s <= n/2), which strict verifiers
        # (BIP 62 style) require. Verification still accepts either.
        order = self._scheme.order
        r, s = decode_signature(signature, order)
        return signature if s <= order // 2 else encode_signature(r, order - s)


@dataclass(frozen=True, slots=True, repr=False)
class _EcdsaVerifier:
    _scheme: EcdsaScheme
    _key: ec.EllipticCurvePublicKey

    def verify(self, signature: bytes, message: bytes, *, name: str) -> None:
        problem = self._scheme.signature_form_error(signature)
        if problem is not None:
            raise SignatureError(
                f"invalid signature: an {self._scheme.algorithm} key cannot have made this signature "
                f"({problem})"
            )
        try:
            self._key.verify(signature, message, ec.ECDSA(self._scheme.hash()))
        except InvalidSignature:
            raise SignatureError(f"invalid signature: does not verify under key {name!r}") from None


ECDSA_P256 = EcdsaScheme(
    algorithm=SignatureAlgorithm.ECDSA_P256,
    curve=ec.SECP256R1,
    hash=hashes.SHA256,
    order=0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
    curve_oid_der=bytes.fromhex("06082a8648ce3d030107"),  # 1.2.840.10045.3.1.7 prime256v1
    default_bundle_name="model.sig",
)
ECDSA_P384 = EcdsaScheme(
    algorithm=SignatureAlgorithm.ECDSA_P384,
    curve=ec.SECP384R1,
    hash=hashes.SHA384,
    order=int(
        "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973", 16
    ),
    curve_oid_der=bytes.fromhex("06052b81040022"),  # 1.3.132.0.34 secp384r1
    default_bundle_name="model.p384.sig",
)
