"""ML-DSA-44, ML-DSA-65 and ML-DSA-87 (FIPS 204, pure ML-DSA, empty context) through `cryptography`.

Signatures cover the DSSE PAE exactly like every other scheme: the message is the PAE itself (pure
ML-DSA hashes internally), the context string is empty, and signing is hedged (randomised), so two
signatures of one statement differ. Verification accepts only a signature of the parameter set's exact
size over the PAE; model_signing's fallback to a non-PAE "compat" encoding is not implemented, so such a
signature is refused.

Bundles are shaped as model_signing's ML-DSA signer (sigstore/model-transparency, unreleased) shapes
them: `verificationMaterial.publicKey.hint` = `ML_DSA_65:<hex SHA-256 of the raw FIPS 204 public key>`
(`ML_DSA_44`, `ML_DSA_87` likewise), so its verifier's key-mismatch check accepts our bundles.

Keys: private keys are PKCS#8 PEM holding the 32-byte seed (RFC 9881 `seed` form, what `cryptography`
writes and reads), optionally encrypted. Public keys are SubjectPublicKeyInfo PEM or a raw FIPS 204
public-key file (1312, 1952 or 2592 bytes, as model_signing writes them). model_signing's private-key
files hold the *expanded* FIPS 204 private key (2560, 4032 or 4896 bytes, optionally wrapped in its
`MLDSA-ENC-V1` AES-GCM envelope), as does a PKCS#8 key in the `expandedKey` form: the seed cannot be
recovered from it and `cryptography` signs only from a seed, so those files are refused with that reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import mldsa

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import KeyMaterialError, SignatureError, UnsupportedAlgorithmError
from modelsec.signer.schemes.base import KeyBackend, PublicKeyVerifier, load_pem_private_key

__all__ = ["ML_DSA_44", "ML_DSA_65", "ML_DSA_87", "MlDsaScheme"]

_SPKI = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
_UPSTREAM_ENCRYPTED_HEADER = b"MLDSA-ENC-V1"  # model_signing's password-protected private-key files
_PrivateKey = mldsa.MLDSA44PrivateKey | mldsa.MLDSA65PrivateKey | mldsa.MLDSA87PrivateKey
_PublicKey = mldsa.MLDSA44PublicKey | mldsa.MLDSA65PublicKey | mldsa.MLDSA87PublicKey


@dataclass(frozen=True, slots=True)
class MlDsaScheme:
    """One ML-DSA parameter set (see the module docstring; sizes from FIPS 204 table 2)."""

    algorithm: SignatureAlgorithm
    private_type: type[_PrivateKey]
    public_type: type[_PublicKey]
    oid_der: bytes  # id-ml-dsa-* (NIST CSOR 2.16.840.1.101.3.4.3.17-19) as it appears in SPKI / PKCS#8
    public_key_size: int
    expanded_private_key_size: int
    signature_size: int
    upstream_name: str  # model_signing's variant name, the prefix of its key hint
    default_bundle_name: str
    manifest_hash: HashAlgorithm = HashAlgorithm.SHA256
    signable_hashes: frozenset[HashAlgorithm] = frozenset({HashAlgorithm.SHA256, HashAlgorithm.BLAKE3})
    family: str = "ml-dsa"
    certified: bool = True

    def key_matches(self, der: bytes) -> bool:
        """Whether `der` names this parameter set: its OID, or a raw key file of its exact size."""
        return (
            self.oid_der in der
            or len(der) in (self.public_key_size, self.expanded_private_key_size)
            # model_signing's default variant; the envelope does not say which one it holds.
            or (der.startswith(_UPSTREAM_ENCRYPTED_HEADER) and self.algorithm is SignatureAlgorithm.ML_DSA_65)
        )

    def generate_private_key_pem(self, password: bytes | None) -> tuple[bytes, bytes]:
        """A new key pair; the PKCS#8 (seed) private key is encrypted (best PBES2) when `password` is set."""
        key = self.private_type.generate()
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        )
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        return private, key.public_key().public_bytes(*_SPKI)

    def load_private_key(self, pem: bytes, *, name: str, password: bytes | None) -> KeyBackend:
        """Load a PKCS#8 PEM ML-DSA private key in seed form (optionally encrypted).

        Raises:
            KeyMaterialError: Not a valid PEM private key, wrong, missing or superfluous password, or a
                key without its seed (model_signing's raw or `MLDSA-ENC-V1` files, PKCS#8 `expandedKey`).
            UnsupportedAlgorithmError: Another key type or ML-DSA parameter set.
        """
        if b"-----BEGIN" not in pem:
            raise KeyMaterialError(self._no_seed(name, "a raw or MLDSA-ENC-V1 model_signing key file"))

        def expanded(_: ValueError) -> KeyMaterialError | None:
            if self.oid_der in _pem_der(pem):
                return KeyMaterialError(self._no_seed(name, "a PKCS#8 key in expandedKey form"))
            return None

        key = load_pem_private_key(pem, password, name=name, invalid=expanded)
        if not isinstance(key, self.private_type):
            raise self._other_type(key, name)
        return _MlDsaKeyBackend(self, key)

    def load_public_key(self, pem: bytes, *, name: str) -> tuple[bytes, PublicKeyVerifier]:
        """Load an ML-DSA public key: SubjectPublicKeyInfo PEM or a raw FIPS 204 key of the exact size.

        Returns:
            `(canonical SubjectPublicKeyInfo PEM, verifier)`.

        Raises:
            KeyMaterialError: Not a valid PEM public key, or a raw key of the wrong size.
            UnsupportedAlgorithmError: Another key type or ML-DSA parameter set.
        """
        key: object
        if b"-----BEGIN" in pem:
            try:
                key = serialization.load_pem_public_key(pem)
            except UnsupportedAlgorithm as e:
                raise UnsupportedAlgorithmError(f"{name}: unsupported public key type: {e}") from e
            except ValueError as e:
                raise KeyMaterialError(
                    f"{name}: not a valid PEM public key: give a SubjectPublicKeyInfo PEM file (keygen "
                    "writes PREFIX.pub.pem)"
                ).with_details(str(e)) from e
        elif len(pem) != self.public_key_size:
            raise KeyMaterialError(
                f"{name}: a raw {self.algorithm} public key is {self.public_key_size} bytes, got {len(pem)}"
            )
        else:
            try:
                key = self.public_type.from_public_bytes(pem)
            except ValueError as e:
                raise KeyMaterialError(f"{name}: not a valid raw {self.algorithm} public key ({e})") from e
        if not isinstance(key, self.public_type):
            raise self._other_type(key, name)
        return key.public_bytes(*_SPKI), _MlDsaVerifier(self, key)

    def signature_form_error(self, signature: bytes) -> str | None:
        """Why `signature` is not of this parameter set's fixed length (FIPS 204 table 2); None if it is."""
        if len(signature) != self.signature_size:
            return f"an {self.algorithm} signature is {self.signature_size} bytes, got {len(signature)}"
        return None

    def key_hint(self, public_key: _PublicKey) -> str:
        """model_signing's hint: `ML_DSA_65:` + hex(SHA-256(raw FIPS 204 public key))."""
        return f"{self.upstream_name}:{hashlib.sha256(public_key.public_bytes_raw()).hexdigest()}"

    def _no_seed(self, name: str, what: str) -> str:
        return (
            f"{name}: {what} holds an expanded ML-DSA private key without its 32-byte seed; "
            "cryptography signs only from the seed, which cannot be recovered from the expanded key: "
            "generate a new key with `modelsec keygen --algorithm "
            f"{self.algorithm}` (its public key verifies model_signing's bundles as a raw or PEM file)"
        )

    def _other_type(self, key: object, name: str) -> UnsupportedAlgorithmError:
        from modelsec.signer.schemes import supported_names

        return UnsupportedAlgorithmError(
            f"{name}: {type(key).__name__} keys are not {self.algorithm} keys (use {supported_names()})"
        )


def _pem_der(pem: bytes) -> bytes:
    """The DER of a PEM block, or b"" when it cannot be decoded (only to recognise an OID)."""
    lines = [ln for ln in pem.strip().splitlines() if not ln.startswith(b"-----")]
    try:
        return base64.b64decode(b"".join(lines))
    except (binascii.Error, ValueError):
        return b""


@dataclass(frozen=True, slots=True, repr=False)
class _MlDsaKeyBackend:
    _scheme: MlDsaScheme
    _key: _PrivateKey

    def __repr__(self) -> str:
        return f"<ML-DSA key backend {self.algorithm}>"

    @property
    def algorithm(self) -> SignatureAlgorithm:
        return self._scheme.algorithm

    def public_key_pem(self) -> bytes:
        return self._key.public_key().public_bytes(*_SPKI)

    def key_hint(self) -> str:
        return self._scheme.key_hint(self._key.public_key())

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


@dataclass(frozen=True, slots=True, repr=False)
class _MlDsaVerifier:
    _scheme: MlDsaScheme
    _key: _PublicKey

    @property
    def key_hint(self) -> str:
        """model_signing's hint for this key (`MlDsaScheme.key_hint`), which its bundles state."""
        return self._scheme.key_hint(self._key)

    def verify(self, signature: bytes, message: bytes, *, name: str) -> None:
        problem = self._scheme.signature_form_error(signature)
        if problem is not None:
            raise SignatureError(
                f"invalid signature: an {self._scheme.algorithm} key cannot have made this signature "
                f"({problem}; key {name!r})"
            )
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            raise SignatureError(f"invalid signature: does not verify under key {name!r}") from None


_OID_PREFIX = bytes.fromhex("06096086480165030403")  # OBJECT IDENTIFIER 2.16.840.1.101.3.4.3.

ML_DSA_44 = MlDsaScheme(
    algorithm=SignatureAlgorithm.ML_DSA_44,
    private_type=mldsa.MLDSA44PrivateKey,
    public_type=mldsa.MLDSA44PublicKey,
    oid_der=_OID_PREFIX + b"\x11",
    public_key_size=1312,
    expanded_private_key_size=2560,
    signature_size=2420,
    upstream_name="ML_DSA_44",
    default_bundle_name="model.ml-dsa-44.sig",
)
ML_DSA_65 = MlDsaScheme(
    algorithm=SignatureAlgorithm.ML_DSA_65,
    private_type=mldsa.MLDSA65PrivateKey,
    public_type=mldsa.MLDSA65PublicKey,
    oid_der=_OID_PREFIX + b"\x12",
    public_key_size=1952,
    expanded_private_key_size=4032,
    signature_size=3309,
    upstream_name="ML_DSA_65",
    default_bundle_name="model.ml-dsa-65.sig",
)
ML_DSA_87 = MlDsaScheme(
    algorithm=SignatureAlgorithm.ML_DSA_87,
    private_type=mldsa.MLDSA87PrivateKey,
    public_type=mldsa.MLDSA87PublicKey,
    oid_der=_OID_PREFIX + b"\x13",
    public_key_size=2592,
    expanded_private_key_size=4896,
    signature_size=4627,
    upstream_name="ML_DSA_87",
    default_bundle_name="model.ml-dsa-87.sig",
)
