"""The protocols a signature scheme implements: the scheme itself, its signing keys and its verifying keys.

A scheme is one module under `modelsec.signer.schemes` that pairs key generation, private-key loading
(signing) and public-key loading (verification) for one `SignatureAlgorithm`, like model_signing's
`_signing/sign_<method>.py`. The registry (`modelsec.signer.schemes`) is the only place that lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import Error, KeyMaterialError, UnsupportedAlgorithmError

__all__ = ["KeyBackend", "PublicKeyVerifier", "SignatureScheme"]


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
        """Sign `message`; returns the scheme's signature encoding (DER `SEQUENCE { r, s }` for ECDSA/SM2)."""
        ...


class PublicKeyVerifier(Protocol):
    """A loaded public key of one scheme that checks signatures and raises, never returning a bool."""

    def verify(self, signature: bytes, message: bytes, *, name: str) -> None:
        """Verify `signature` over `message`.

        Args:
            signature: The signature exactly as carried by the DSSE envelope.
            message: The signed bytes (the DSSE PAE).
            name: The trusted key's name, for diagnostics.

        Raises:
            SignatureError: The signature is malformed, out of range, or does not verify.
        """
        ...


class SignatureScheme(Protocol):
    """One signature scheme: its names, the manifest it signs, and its keys.

    Attributes (read-only properties):
        algorithm: The policy/CLI spelling (`SignatureAlgorithm` value).
        manifest_hash: File digest algorithm of the manifest this scheme's keys sign (DESIGN.md decision 2).
        signable_hashes: Manifest hash types a signature of this scheme is accepted over at verification.
        default_bundle_name: The bundle file name written into the model directory by default.
        family: Schemes of one family may stand in for each other when `verify` decides whether a
            default-named bundle could have been signed by a configured key (ECDSA P-256 and P-384 share
            `ecdsa`).
        certified: Whether an authority's X.509 certificates can carry this scheme's keys (the ecosystem's
            CAs and Fulcio issue no SM2 certificates); decides whether a configured authority could verify a
            bundle of this scheme (`verify`'s skipping of default-named bundles, `--require`).
    """

    @property
    def algorithm(self) -> SignatureAlgorithm:
        """The scheme's policy and CLI name."""
        ...

    @property
    def manifest_hash(self) -> HashAlgorithm:
        """The hash type of the manifest this scheme signs."""
        ...

    @property
    def signable_hashes(self) -> frozenset[HashAlgorithm]:
        """The manifest hash types a signature of this scheme may cover."""
        ...

    @property
    def default_bundle_name(self) -> str:
        """The default bundle file name."""
        ...

    @property
    def family(self) -> str:
        """The family of interchangeable schemes (see the class docstring)."""
        ...

    @property
    def certified(self) -> bool:
        """Whether X.509 authorities can vouch for keys of this scheme (see the class docstring)."""
        ...

    def key_matches(self, der: bytes) -> bool:
        """Whether an unencrypted SubjectPublicKeyInfo, PKCS#8 or SEC 1 DER names this scheme's key type.

        A cheap look at the algorithm identifier that decides which scheme parses the key; the scheme's
        loader then parses it strictly. An encrypted key matches no scheme.
        """
        ...

    def signature_form_error(self, signature: bytes) -> str | None:
        """Why `signature` cannot be this scheme's signature, from its encoding alone; None if it can be.

        The scheme's strict decoding, nothing verified: DER `SEQUENCE { r, s }` with r and s in [1, n-1] of
        the scheme's curve (ECDSA, SM2), or the parameter set's fixed length (ML-DSA, FIPS 204 table 2). A
        key's verifier refuses with this reason before any arithmetic.
        """
        ...

    def generate_private_key_pem(self, password: bytes | None) -> tuple[bytes, bytes]:
        """Generate a key pair: `(private PKCS#8 PEM, encrypted when password is set; public SPKI PEM)`."""
        ...

    def load_private_key(self, pem: bytes, *, name: str, password: bytes | None) -> KeyBackend:
        """Load a PEM private key of this scheme.

        Raises:
            KeyMaterialError: Malformed key, wrong or missing password.
            UnsupportedAlgorithmError: The key is not of this scheme (the registry then tries another).
        """
        ...

    def load_public_key(self, pem: bytes, *, name: str) -> tuple[bytes, PublicKeyVerifier]:
        """Load a SubjectPublicKeyInfo PEM of this scheme: `(canonical PEM, verifier)`.

        Raises:
            KeyMaterialError: Malformed key.
            UnsupportedAlgorithmError: The key is not of this scheme.
        """
        ...


def load_pem_private_key(
    pem: bytes,
    password: bytes | None,
    *,
    name: str,
    invalid: Callable[[ValueError], Error | None] | None = None,
) -> Any:
    """A PEM private key through `cryptography`, its failures as modelsec errors naming `name`.

    Args:
        pem: The PEM file's bytes.
        password: Its password, or None for an unencrypted key.
        name: Names the key in messages.
        invalid: Called when `cryptography` cannot read the key; a scheme returns a more specific error
            (or None for the generic one).

    Raises:
        KeyMaterialError: Not a valid PEM private key, wrong, missing or superfluous password.
        UnsupportedAlgorithmError: A key type `cryptography` does not support.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(pem, password)
    except TypeError as e:
        if password is not None:
            raise KeyMaterialError(f"{name}: a password was given but the key is not encrypted") from e
        raise KeyMaterialError(
            f"{name}: key is encrypted and no password was given (the CLI reads $MODELSEC_KEY_PASSWORD "
            "or prompts; the server reads the key's passwordEnv)"
        ) from e
    except UnsupportedAlgorithm as e:
        raise UnsupportedAlgorithmError(f"{name}: unsupported private key type: {e}") from e
    except ValueError as e:
        specific = invalid(e) if invalid is not None else None
        if specific is not None:
            raise specific from e
        raise KeyMaterialError(f"{name}: not a valid PEM private key, or wrong password ({e})") from e
