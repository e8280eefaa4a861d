"""Key backends (private keys that sign) and trusted public keys (that verify), one protocol for all curves.

* ECDSA P-256 with SHA-256 and P-384 with SHA-384 (FIPS 186-5) through `cryptography`; signatures are DER,
  deterministic (RFC 6979), so golden files are reproducible, and low-S (s <= n/2: of the two valid
  forms (r, s) and (r, n - s) the signer emits the smaller). Verification accepts high-S too (model_signing
  emits it).
* SM2 with SM3 (GB/T 32918.2-2016, distinguishing ID `1234567812345678`) through `modelsec.signer.sm2`
  (OpenSSL EVP backend by default, hardened gmssl fallback).

Verification is strict for every algorithm: the DER signature is decoded by `modelsec.signer.der` (strict
DER, r and s in [1, n-1]) before any curve arithmetic, and failures raise `SignatureError` (never a bool).
Keys are PEM: PKCS#8 (optionally encrypted) private keys and SubjectPublicKeyInfo public keys.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import KeyMaterialError, SignatureError, UnsupportedAlgorithmError
from modelsec.signer.der import decode_signature, encode_signature

if TYPE_CHECKING:
    from modelsec.signer.sm2 import Sm2PrivateKey, Sm2PublicKey

__all__ = [
    "KeyBackend",
    "TrustedKey",
    "generate_private_key_pem",
    "load_private_key",
    "load_private_key_file",
    "load_trusted_key",
    "load_trusted_key_file",
]

_SM2_CURVE_OID_DER = bytes.fromhex("06082a811ccf5501822d")  # 1.2.156.10197.1.301
_MAX_PEM_BYTES = 64 * 1024

_CURVES: dict[str, tuple[SignatureAlgorithm, hashes.HashAlgorithm]] = {
    "secp256r1": (SignatureAlgorithm.ECDSA_P256, hashes.SHA256()),
    "secp384r1": (SignatureAlgorithm.ECDSA_P384, hashes.SHA384()),
}
_EC_CURVE_FOR = {
    SignatureAlgorithm.ECDSA_P256: ec.SECP256R1,
    SignatureAlgorithm.ECDSA_P384: ec.SECP384R1,
}


class KeyBackend(Protocol):
    """Signs bytes with a private key it never exposes (PEM file, PKCS#11, KMS)."""

    @property
    def algorithm(self) -> SignatureAlgorithm:
        """The signature scheme (curve and hash)."""
        ...

    def public_key_pem(self) -> bytes:
        """The SubjectPublicKeyInfo PEM of the key."""
        ...

    def sign(self, message: bytes) -> bytes:
        """Sign `message`; returns a DER `SEQUENCE { r, s }`."""
        ...


def _ec_algorithm(curve: ec.EllipticCurve) -> tuple[SignatureAlgorithm, hashes.HashAlgorithm]:
    try:
        return _CURVES[curve.name]
    except KeyError:
        raise UnsupportedAlgorithmError(
            f"ECDSA curve {curve.name} is not supported (use P-256 or P-384)"
        ) from None


@dataclass(frozen=True, slots=True, repr=False)
class _EcdsaKeyBackend:
    _key: ec.EllipticCurvePrivateKey

    def __repr__(self) -> str:
        return f"<ECDSA key backend {self.algorithm}>"

    @property
    def algorithm(self) -> SignatureAlgorithm:
        return _ec_algorithm(self._key.curve)[0]

    def public_key_pem(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, message: bytes) -> bytes:
        algorithm, digest = _ec_algorithm(self._key.curve)
        signature = self._key.sign(message, ec.ECDSA(digest, deterministic_signing=True))
        # (r, s) and (r, n - s) both verify; emit the low-S form (s <= n/2), which strict verifiers
        # (BIP 62 style) require. Verification still accepts either.
        order = _ORDERS[algorithm]
        r, s = decode_signature(signature, order)
        return signature if s <= order // 2 else encode_signature(r, order - s)


@dataclass(frozen=True, slots=True, repr=False)
class _Sm2KeyBackend:
    _key: Sm2PrivateKey  # the SM2 module itself is imported lazily

    def __repr__(self) -> str:
        return "<SM2 key backend>"

    @property
    def algorithm(self) -> SignatureAlgorithm:
        return SignatureAlgorithm.SM2

    def public_key_pem(self) -> bytes:
        return self._key.public_key.to_pem()

    def sign(self, message: bytes) -> bytes:
        from modelsec.signer import sm2

        return sm2.default_backend().sign(self._key, message)


@dataclass(frozen=True, slots=True)
class TrustedKey:
    """A public key the operator trusts (from policy or `--key`), never one taken from an artifact.

    Attributes:
        name: Operator-chosen name (defaults to the file name) used in diagnostics.
        algorithm: The signature scheme the key verifies.
        pem: The SubjectPublicKeyInfo PEM, as re-serialised canonically.
        keyid: hex(SHA-256(pem)): the hint/keyid a bundle may use to select this key.
        roles: What the key may sign (`weights`, `watermark`, `gate`); empty means all.
    """

    name: str
    algorithm: SignatureAlgorithm
    pem: bytes = field(repr=False)
    keyid: str
    roles: frozenset[str] = frozenset()
    _verifier: ec.EllipticCurvePublicKey | Sm2PublicKey | None = field(
        default=None, repr=False, compare=False
    )

    def may(self, role: str) -> bool:
        """Whether this key may sign statements of `role`."""
        return not self.roles or role in self.roles

    def verify(self, signature: bytes, message: bytes) -> None:
        """Verify a DER signature over `message` with this key.

        Args:
            signature: DER `SEQUENCE { r, s }`, strict.
            message: The signed bytes (the DSSE PAE).

        Raises:
            SignatureError: The signature is malformed, out of range, or does not verify.
        """
        if self._verifier is None:
            raise SignatureError(f"invalid signature: key {self.name!r} has no verifier")
        if not isinstance(self._verifier, ec.EllipticCurvePublicKey):
            from modelsec.signer import sm2

            sm2.default_backend().verify(self._verifier, message, signature)
            return
        digest = _ec_algorithm(self._verifier.curve)[1]
        decode_signature(signature, _ORDERS[self.algorithm])
        try:
            self._verifier.verify(signature, message, ec.ECDSA(digest))
        except InvalidSignature:
            raise SignatureError(f"invalid signature: does not verify under key {self.name!r}") from None


_ORDERS = {
    SignatureAlgorithm.ECDSA_P256: 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
    SignatureAlgorithm.ECDSA_P384: int(
        "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973", 16
    ),
}


def _is_sm2(der_or_pem: bytes) -> bool:
    if b"-----BEGIN" in der_or_pem:
        try:
            import base64

            body = b"".join(
                line for line in der_or_pem.splitlines() if line and not line.startswith(b"-----")
            )
            der_or_pem = base64.b64decode(body)
        except ValueError:
            return False
    return _SM2_CURVE_OID_DER in der_or_pem


def load_trusted_key(pem: bytes, *, name: str, roles: frozenset[str] = frozenset()) -> TrustedKey:
    """Load a SubjectPublicKeyInfo PEM public key (ECDSA P-256/P-384 or SM2) as a trusted key.

    Args:
        pem: The PEM text.
        name: Name used in diagnostics.
        roles: Roles the key may sign for (empty: all).

    Returns:
        The trusted key, with `keyid` = hex(SHA-256(canonical PEM)).

    Raises:
        KeyMaterialError: Not a PEM public key (a private key is refused too).
        UnsupportedAlgorithmError: Another key type or curve.
    """
    if len(pem) > _MAX_PEM_BYTES:
        raise KeyMaterialError(f"{name}: key file is too large to be a PEM public key")
    if b"PRIVATE KEY-----" in pem:
        raise KeyMaterialError(f"{name}: is a private key; give the public key (keygen writes *.pub.pem)")
    if _is_sm2(pem):
        from modelsec.signer import sm2

        sm2_key = sm2.Sm2PublicKey.from_pem(pem)
        canonical = sm2_key.to_pem()
        return TrustedKey(
            name, SignatureAlgorithm.SM2, canonical, hashlib.sha256(canonical).hexdigest(), roles, sm2_key
        )
    try:
        key = serialization.load_pem_public_key(pem)
    except UnsupportedAlgorithm as e:
        raise UnsupportedAlgorithmError(f"{name}: unsupported public key type: {e}") from e
    except ValueError as e:
        raise KeyMaterialError(f"{name}: not a valid PEM public key ({e})") from e
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UnsupportedAlgorithmError(
            f"{name}: {type(key).__name__} keys are not supported (use ECDSA P-256/P-384 or SM2)"
        )
    algorithm = _ec_algorithm(key.curve)[0]
    canonical = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return TrustedKey(name, algorithm, canonical, hashlib.sha256(canonical).hexdigest(), roles, key)


def _read_key_file(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise KeyMaterialError(f"{path}: cannot open key file: {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise KeyMaterialError(f"{path}: key file is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX_PEM_BYTES + 1)
    if len(data) > _MAX_PEM_BYTES:
        raise KeyMaterialError(f"{path}: key file is larger than {_MAX_PEM_BYTES} bytes")
    return data


def load_trusted_key_file(
    path: Path, *, name: str | None = None, roles: frozenset[str] = frozenset()
) -> TrustedKey:
    """Read `path` (symlinks refused) and load it with `load_trusted_key`; same errors."""
    return load_trusted_key(_read_key_file(path), name=name or path.name, roles=roles)


def load_private_key(pem: bytes, *, name: str, password: bytes | None = None) -> KeyBackend:
    """Load a PKCS#8 (or SEC 1) PEM private key as a key backend.

    Args:
        pem: The PEM text; encrypted PKCS#8 needs `password`.
        name: Name used in diagnostics.
        password: Password of an encrypted key, or None.

    Returns:
        A backend signing with ECDSA P-256/P-384 or SM2.

    Raises:
        KeyMaterialError: Not a private key, wrong or missing password.
        UnsupportedAlgorithmError: Another key type or curve.
    """
    if b"PUBLIC KEY-----" in pem and b"PRIVATE KEY-----" not in pem:
        raise KeyMaterialError(
            f"{name}: is a public key; signing needs the private key (keygen writes *.key.pem)"
        )
    if _is_sm2(pem):
        return _sm2_backend(pem, password)
    try:
        key = serialization.load_pem_private_key(pem, password)
    except TypeError as e:
        if password is not None:
            raise KeyMaterialError(f"{name}: a password was given but the key is not encrypted") from e
        raise KeyMaterialError(
            f"{name}: key is encrypted and no password was given (the CLI reads $MODELSEC_KEY_PASSWORD or "
            "prompts; the server reads the key's passwordEnv)"
        ) from e
    except UnsupportedAlgorithm as e:
        if b"ENCRYPTED PRIVATE KEY" in pem:  # an encrypted SM2 key: cryptography cannot name its curve
            return _sm2_backend(pem, password)
        raise UnsupportedAlgorithmError(f"{name}: unsupported private key type: {e}") from e
    except ValueError as e:
        raise KeyMaterialError(f"{name}: not a valid PEM private key, or wrong password ({e})") from e
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise UnsupportedAlgorithmError(
            f"{name}: {type(key).__name__} keys are not supported (use ECDSA P-256/P-384 or SM2)"
        )
    _ec_algorithm(key.curve)
    return _EcdsaKeyBackend(key)


def _sm2_backend(pem: bytes, password: bytes | None) -> KeyBackend:
    from modelsec.signer import sm2

    return _Sm2KeyBackend(sm2.Sm2PrivateKey.from_pem(pem, password))


def load_private_key_file(path: Path, *, password: bytes | None = None) -> KeyBackend:
    """Read `path` (symlinks refused) and load it with `load_private_key`; same errors."""
    return load_private_key(_read_key_file(path), name=path.name, password=password)


def generate_private_key_pem(
    algorithm: SignatureAlgorithm, *, password: bytes | None = None
) -> tuple[bytes, bytes]:
    """Generate a key pair.

    Args:
        algorithm: The scheme (curve) of the new key.
        password: Encrypt the PKCS#8 private key with this password (best available PBES2), or None.

    Returns:
        `(private PKCS#8 PEM, public SubjectPublicKeyInfo PEM)`.
    """
    if algorithm is SignatureAlgorithm.SM2:
        from modelsec.signer import sm2

        sm2_key = sm2.generate_private_key()
        return sm2_key.to_pem(password), sm2_key.public_key.to_pem()
    key = ec.generate_private_key(_EC_CURVE_FOR[algorithm]())
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public
