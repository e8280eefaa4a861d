"""Certificate-mode signing: model_signing's `sign certificate`, with a PEM or `pkcs11:` key.

`CertificateSigner` wraps a key backend and a signing certificate (and the rest of its chain): each bundle
it makes is signed by the key, as key-mode bundles are, and carries the certificates as
`verificationMaterial.x509CertificateChain` (leaf first) instead of a public-key hint
(`modelsec.attestations.bundle.with_certificate_chain`), byte-compatible with model_signing 1.1.x, whose
`verify certificate` builds the path from the leaf to its own roots. modelsec verifies such a bundle through
an X.509 authority of the policy (roots and identity rules; `modelsec.verifier.trust.identity`); nothing in
the bundle is believed by itself.

What is checked when the signer is made: every certificate parses as X.509 PEM, and the signing
certificate's public key is the key's (as model_signing checks). What is not: that the chain leads to any
root, the certificate's validity window or identity (a verifier's decision, at its own time).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations.bundle import sign_statement, with_certificate_chain
from modelsec.attestations.statement import Statement
from modelsec.errors import KeyMaterialError
from modelsec.safe_io import read_regular_file
from modelsec.signer.keys import KeyBackend

__all__ = ["CertificateSigner", "load_certificate_signer"]

_MAX_PEM_BYTES = 1 << 20


class CertificateSigner:
    """A `modelsec.signer.signing.BundleSigner` writing model_signing certificate-mode bundles."""

    def __init__(self, backend: KeyBackend, certificates: Sequence[x509.Certificate]) -> None:
        """Wrap `backend`; `certificates` are the signing certificate then the rest of its chain.

        Raises:
            KeyMaterialError: No certificate, or the signing certificate's public key is not the key's.
        """
        if not certificates:
            raise KeyMaterialError("certificate signing needs the signing certificate")
        leaf_key = (
            certificates[0]
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        own = serialization.load_pem_public_key(backend.public_key_pem()).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        if leaf_key != own:
            raise KeyMaterialError(
                "the signing certificate's public key is not the signing key's "
                "(model_signing refuses the same)"
            )
        self._backend = backend
        self._der = tuple(c.public_bytes(serialization.Encoding.DER) for c in certificates)

    @property
    def algorithm(self) -> SignatureAlgorithm:
        """The key's signature scheme."""
        return self._backend.algorithm

    def public_key_pem(self) -> bytes:
        """The key's (and the signing certificate's) SubjectPublicKeyInfo PEM."""
        return self._backend.public_key_pem()

    def sign_bundle(self, statement: Statement) -> bytes:
        """Sign `statement` with the key; the bundle carries the certificate chain."""
        return with_certificate_chain(
            sign_statement(statement, self._backend), self._der, source=statement.predicate_type
        )


def _read_certificates(path: Path, what: str) -> list[x509.Certificate]:
    data = read_regular_file(path, what, max_bytes=_MAX_PEM_BYTES, error=KeyMaterialError)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise KeyMaterialError(f"{path}: not PEM X.509 certificates ({e})") from e
    return certificates


def load_certificate_signer(
    backend: KeyBackend, signing_certificate: Path, certificate_chain: Sequence[Path] = ()
) -> CertificateSigner:
    """A `CertificateSigner` from PEM files, as model_signing's `sign certificate` takes them.

    Args:
        backend: The private key (PEM file or `pkcs11:` URI, opened by `modelsec.signer.keys.key_source`).
        signing_certificate: PEM file whose first certificate is the signing certificate.
        certificate_chain: PEM files with the rest of the chain (intermediates, optionally the root), in
            order.

    Raises:
        KeyMaterialError: A file is missing, too large or not PEM certificates, or the signing certificate
            is not the key's.
    """
    leaf = _read_certificates(signing_certificate, "signing certificate")[:1]
    chain = [c for p in certificate_chain for c in _read_certificates(p, "certificate chain")]
    return CertificateSigner(backend, [*leaf, *chain])
