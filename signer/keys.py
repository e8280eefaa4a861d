"""Key sources and backends (private keys that sign) and trusted public keys (that verify), for every scheme.

The schemes themselves (ECDSA P-256/P-384 through `cryptography`, SM2 with SM3 through
`modelsec.signer.schemes.sm2.api`) live in `modelsec.signer.schemes`, one module each; this module only
chooses among them by the key's algorithm identifier, and chooses where a private key comes from
(`key_source`).

Verification is strict for every scheme: the signature is decoded strictly before any curve arithmetic, and
failures raise `SignatureError` (never a bool). Keys are PEM: PKCS#8 (optionally encrypted) private keys and
SubjectPublicKeyInfo public keys.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import KeyMaterialError, SignatureError, UnsupportedAlgorithmError
from modelsec.safe_io import read_regular_file
from modelsec.signer.schemes import (
    KeyBackend,
    PublicKeyVerifier,
    SignatureScheme,
    scheme_for,
    schemes_for_key,
)

__all__ = [
    "KeyBackend",
    "KeySource",
    "PemFileKeySource",
    "TrustedKey",
    "generate_private_key_pem",
    "key_file_is_encrypted",
    "key_source",
    "load_private_key",
    "load_private_key_file",
    "load_trusted_key",
    "load_trusted_key_file",
]

_MAX_PEM_BYTES = 64 * 1024
_PEM_BODY = re.compile(rb"-----BEGIN ([A-Z0-9 ]{1,40})-----(.*?)-----END ", re.S)
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]{1,40})-----(.*?)-----END \1-----", re.S)
_PEM_BASE64 = re.compile(rb"[A-Za-z0-9+/=\s]*")


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
    _verifier: PublicKeyVerifier | None = field(default=None, repr=False, compare=False)

    def may(self, role: str) -> bool:
        """Whether this key may sign statements of `role`."""
        return not self.roles or role in self.roles

    def is_named_by(self, selectors: Collection[str]) -> bool:
        """Whether a bundle's stated key ids (`publicKey.hint`, DSSE `keyid`) name this key.

        A bundle names a key by `keyid`, or by its scheme's own hint where it has one (model_signing's
        `ML_DSA_65:<hex SHA-256 of the raw key>`). Only ordering and wording depend on it, never trust.
        """
        hint = getattr(self._verifier, "key_hint", None)
        return self.keyid in selectors or (hint is not None and hint in selectors)

    def verify(self, signature: bytes, message: bytes) -> None:
        """Verify a signature over `message` with this key.

        Args:
            signature: The scheme's signature encoding (DER `SEQUENCE { r, s }`, strict, for ECDSA and SM2).
            message: The signed bytes (the DSSE PAE).

        Raises:
            SignatureError: The signature is malformed, out of range, or does not verify.
        """
        if self._verifier is None:
            raise SignatureError(f"invalid signature: key {self.name!r} has no verifier")
        self._verifier.verify(signature, message, name=self.name)


def _pem_der(pem: bytes) -> tuple[str, bytes]:
    """The label and DER of the first PEM block, for choosing a scheme only (each scheme parses strictly)."""
    found = _PEM_BODY.search(pem)
    if found is None:
        return "", pem
    try:
        return found.group(1).decode("ascii"), base64.b64decode(b"".join(found.group(2).split()))
    except (binascii.Error, ValueError):
        return found.group(1).decode("ascii"), pem


def _candidates(pem: bytes) -> tuple[SignatureScheme, ...]:
    label, der = _pem_der(pem)
    return schemes_for_key(b"" if label == "ENCRYPTED PRIVATE KEY" else der)


def load_trusted_key(pem: bytes, *, name: str, roles: frozenset[str] = frozenset()) -> TrustedKey:
    """Load a SubjectPublicKeyInfo PEM public key of any registered scheme as a trusted key.

    Args:
        pem: The PEM text.
        name: Name used in diagnostics.
        roles: Roles the key may sign for (empty: all).

    Returns:
        The trusted key, with `keyid` = hex(SHA-256(canonical PEM)).

    Raises:
        KeyMaterialError: Not a PEM public key (a private key is refused too), more than one PEM block, or
            anything but base64 inside the block. Text around the one block is ignored (RFC 7468 section 2;
            GnuTLS `certtool --pubkey-info` output).
        UnsupportedAlgorithmError: Another key type or curve.
    """
    return _load_trusted_key(pem, name, roles, where=name)


def _load_trusted_key(pem: bytes, name: str, roles: frozenset[str], *, where: str) -> TrustedKey:
    """`load_trusted_key`; the PEM-shape refusals name `where` (a file's full path) instead of `name`."""
    if len(pem) > _MAX_PEM_BYTES:
        raise KeyMaterialError(f"{name}: key file is too large to be a PEM public key")
    if b"PRIVATE KEY-----" in pem:
        raise KeyMaterialError(f"{name}: is a private key; give the public key (keygen writes *.pub.pem)")
    pem = _single_pem_block(pem, where)
    first: UnsupportedAlgorithmError | None = None
    for scheme in _candidates(pem):
        try:
            canonical, verifier = scheme.load_public_key(pem, name=name)
        except UnsupportedAlgorithmError as e:
            first = first or e
            continue
        return TrustedKey(
            name, scheme.algorithm, canonical, hashlib.sha256(canonical).hexdigest(), roles, verifier
        )
    raise first or UnsupportedAlgorithmError(f"{name}: no signature scheme is registered")


def _single_pem_block(pem: bytes, name: str) -> bytes:
    """The one PEM block of a public key file, without the text around it (RFC 7468 section 2).

    Text before and after the block is explanatory and ignored, as OpenSSL, `cryptography` and
    model_signing ignore it: GnuTLS `certtool --pubkey-info` writes the key's curve, coordinates and IDs
    above the block (model_signing's own test key is such a file). What stays refused: a second PEM
    boundary anywhere (two keys, or a stray BEGIN/END line: PEM parsers read the first block and ignore the
    rest, so the operator who concatenated two keys would trust one they did not mean to), and anything but
    base64 and whitespace inside the block (headers, comments). Text without a BEGIN line is returned
    as it is, for the schemes (a raw FIPS 204 ML-DSA key).

    Returns:
        The block alone, from its BEGIN line to its END line.

    Raises:
        KeyMaterialError: More than one PEM boundary pair, an unterminated block, or text inside the block;
            the message names `name`.
    """
    begins = pem.count(b"-----BEGIN ")
    if begins > 1:
        raise KeyMaterialError(
            f"{name}: holds {begins} PEM blocks; a trusted key file holds exactly one public key"
        )
    if begins == 0:
        return pem
    block = _PEM_BLOCK.search(pem)
    if block is None or pem.count(b"-----END ") != 1:
        raise KeyMaterialError(
            f"{name}: the PEM block is not terminated by one matching END line; a trusted key file holds "
            "exactly one public key"
        )
    if not _PEM_BASE64.fullmatch(block.group(2)):
        raise KeyMaterialError(
            f"{name}: text inside the PEM block (only base64 and whitespace may stand between its BEGIN "
            "and END lines)"
        )
    return block.group(0) + b"\n"


def _read_key_file(path: Path) -> bytes:
    return read_regular_file(
        path, "key file", max_bytes=_MAX_PEM_BYTES, error=KeyMaterialError, follow_symlinks=False
    )


def load_trusted_key_file(
    path: str | os.PathLike[str], *, name: str | None = None, roles: frozenset[str] = frozenset()
) -> TrustedKey:
    """Read `path` (symlinks refused) and load it with `load_trusted_key`; same errors, naming the file."""
    path = Path(path)
    return _load_trusted_key(_read_key_file(path), name or path.name, roles, where=str(path))


def load_private_key(pem: bytes, *, name: str, password: bytes | None = None) -> KeyBackend:
    """Load a PKCS#8 (or SEC 1) PEM private key of any registered scheme as a key backend.

    The key's algorithm identifier chooses the scheme; an encrypted PKCS#8 key hides it, so each scheme
    is tried in registration order until one recognises the decrypted key.

    Args:
        pem: The PEM text; encrypted PKCS#8 needs `password`.
        name: Name used in diagnostics.
        password: Password of an encrypted key, or None.

    Returns:
        A backend signing with the key's scheme.

    Raises:
        KeyMaterialError: Not a private key, wrong or missing password.
        UnsupportedAlgorithmError: Another key type or curve.
    """
    if b"PUBLIC KEY-----" in pem and b"PRIVATE KEY-----" not in pem:
        raise KeyMaterialError(
            f"{name}: is a public key; signing needs the private key (keygen writes *.key.pem)"
        )
    first: UnsupportedAlgorithmError | None = None
    for scheme in _candidates(pem):
        try:
            return scheme.load_private_key(pem, name=name, password=password)
        except UnsupportedAlgorithmError as e:
            first = first or e
    raise first or UnsupportedAlgorithmError(f"{name}: no signature scheme is registered")


def load_private_key_file(path: str | os.PathLike[str], *, password: bytes | None = None) -> KeyBackend:
    """Read `path` (symlinks refused) and load it with `load_private_key`; same errors."""
    path = Path(path)
    return load_private_key(_read_key_file(path), name=path.name, password=password)


def key_file_is_encrypted(path: Path) -> bool:
    """Whether the PEM private key file at `path` is encrypted (PKCS#8 or legacy `Proc-Type: 4,ENCRYPTED`).

    Only the PEM text is looked at (read as `load_private_key_file` reads it); the key is not loaded, so
    a caller can ask for a password before loading it.

    Raises:
        KeyMaterialError: The key file cannot be read (missing, a symlink, not a regular file, too large).
    """
    return b"ENCRYPTED" in _read_key_file(path)


def generate_private_key_pem(
    algorithm: SignatureAlgorithm, *, password: bytes | None = None
) -> tuple[bytes, bytes]:
    """Generate a key pair.

    Args:
        algorithm: The scheme (curve) of the new key.
        password: Encrypt the PKCS#8 private key with this password (best available PBES2), or None.

    Returns:
        `(private PKCS#8 PEM, public SubjectPublicKeyInfo PEM)`.

    Raises:
        UnsupportedAlgorithmError: No scheme is registered for `algorithm`.
    """
    return scheme_for(algorithm).generate_private_key_pem(password)


# -- key sources ------------------------------------------------------------------------------------------


class KeySource(Protocol):
    """Where a private key lives; opens it as a `KeyBackend`.

    A PEM file, or a key in a PKCS#11 token (`modelsec.signer.pkcs11`); `key_source` chooses.
    """

    @property
    def reference(self) -> str:
        """The key reference as the operator wrote it, for diagnostics."""
        ...

    def open(self, *, password: bytes | None = None) -> KeyBackend:
        """Open the key for signing.

        Raises:
            KeyMaterialError: The key cannot be read or decrypted.
            UnsupportedAlgorithmError: The key's scheme is not supported.
        """
        ...


@dataclass(frozen=True, slots=True)
class PemFileKeySource:
    """A PEM private key file (symlinks refused, at most 64 KiB); see `load_private_key` for the formats."""

    path: Path

    @property
    def reference(self) -> str:
        """The file path."""
        return str(self.path)

    def open(self, *, password: bytes | None = None) -> KeyBackend:
        """Read and load the key (`load_private_key_file`); same errors."""
        return load_private_key_file(self.path, password=password)


def key_source(reference: str | os.PathLike[str]) -> KeySource:
    """The key source a private-key reference names: the one place that decides.

    A URI whose scheme is registered in `_URI_KEY_SOURCES` (`pkcs11:`, RFC 7512: a key in a PKCS#11
    token, see `modelsec.signer.pkcs11`) opens through that source; anything else is a PEM file path.

    Args:
        reference: A file path, or a URI.

    Returns:
        The key source; nothing is opened yet (a URI is parsed).

    Raises:
        KeyMaterialError: A malformed URI of a registered scheme (e.g. a PIN written into a `pkcs11:` URI).
    """
    text = os.fspath(reference)
    scheme, colon, _ = text.partition(":")
    from_uri = _URI_KEY_SOURCES.get(scheme.lower()) if colon else None
    return PemFileKeySource(Path(text)) if from_uri is None else from_uri(text)


def _pkcs11_source(text: str) -> KeySource:
    # Imported on use: the verifier imports this module, and PEM keys are the common case.
    from modelsec.signer.pkcs11 import Pkcs11KeySource

    return Pkcs11KeySource.from_uri(text)


# URI scheme -> the key source that opens such URIs. A new key source is its module plus one line here.
_URI_KEY_SOURCES: dict[str, Callable[[str], KeySource]] = {
    "pkcs11": _pkcs11_source,
}
