"""Certificates and times a policy trusts: X.509 root files, RFC 3161 timestamp authorities, key windows.

Loaded by `modelsec.policy` while it converts a policy file; used by `modelsec.verifier.trust.timestamps` and
the bundle verifier. Only cryptography is imported (the `rfc3161-client` extra is needed only to verify).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from modelsec.errors import PolicyError, SignatureError
from modelsec.safe_io import read_regular_file

# cryptography.x509 and the signer's key registry are imported where certificates are read: `modelsec.policy`
# is imported by the loader, whose start-up pays for every module imported here.
if TYPE_CHECKING:
    from cryptography import x509

    from modelsec.policy.models import KeyRefModel, TimestampAuthorityModel
    from modelsec.signer.keys import TrustedKey

__all__ = [
    "KeyWindow",
    "TimestampAuthority",
    "check_validity_window",
    "key_windows",
    "read_pem_certificates",
    "read_root_ders",
    "timestamp_authorities",
    "timestamp_authority",
]

MAX_CERT_FILE_BYTES = 2**20


@dataclass(frozen=True, slots=True)
class TimestampAuthority:
    """A TSA the operator trusts: its root certificate(s) and any intermediates.

    Attributes:
        name: Names the TSA in diagnostics.
        roots: Self-issued certificates that anchor the TSA's chain.
        intermediates: Other certificates of the chain (the TSA's own certificate may be among them).
    """

    name: str
    roots: tuple[x509.Certificate, ...]
    intermediates: tuple[x509.Certificate, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """When a trusted key's signatures count (`validFrom`/`validUntil` of a policy key entry).

    Attributes:
        key: The trusted key (as loaded into `Policy.keys`).
        valid_from: Earliest accepted signature time, or None.
        valid_until: Latest accepted signature time (the key's rotation or revocation), or None.
    """

    key: TrustedKey
    valid_from: datetime | None = None
    valid_until: datetime | None = None

    def check(self, time: datetime) -> None:
        """Refuse a signature whose (trusted or verification) `time` lies outside this window.

        Raises:
            SignatureError: `time` is before `valid_from` or after `valid_until`.
        """
        check_validity_window(
            time, valid_from=self.valid_from, valid_until=self.valid_until, key=self.key.name
        )


def check_validity_window(
    time: datetime, *, valid_from: datetime | None, valid_until: datetime | None, key: str
) -> None:
    """Refuse a signature whose (trusted or verification) time lies outside its key's validity window.

    Raises:
        SignatureError: `time` is before `valid_from` or after `valid_until`.
    """
    if valid_from is not None and time < valid_from:
        raise SignatureError(f"signature time {time.isoformat()} is before key {key!r} validFrom")
    if valid_until is not None and time > valid_until:
        raise SignatureError(f"signature time {time.isoformat()} is after key {key!r} validUntil")


def read_pem_certificates(path: Path, where: str) -> list[x509.Certificate]:
    """Every certificate of a PEM file (at most 1 MiB, symlinks refused).

    Raises:
        PolicyError: The file cannot be read, is too large or holds no valid PEM certificate.
    """
    try:
        data = read_regular_file(
            path, "certificate file", max_bytes=MAX_CERT_FILE_BYTES, error=PolicyError, follow_symlinks=False
        )
    except PolicyError as e:
        e.add_context(where)
        raise
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise PolicyError(f"{where}: {path} holds no valid PEM certificate: {e}") from e


def read_root_ders(path: Path, where: str) -> list[bytes]:
    """The DER of every certificate in a PEM file (`read_pem_certificates`).

    Raises:
        PolicyError: The file cannot be read, is too large or holds no valid PEM certificate.
    """
    from cryptography.hazmat.primitives.serialization import Encoding

    return [c.public_bytes(Encoding.DER) for c in read_pem_certificates(path, where)]


def timestamp_authority(name: str, certs: Sequence[x509.Certificate], where: str) -> TimestampAuthority:
    """A TSA from its chain: self-issued certificates are the roots, the others intermediates.

    Raises:
        PolicyError: No self-issued root among `certs`.
    """
    roots = tuple(c for c in certs if c.subject == c.issuer)
    if not roots:
        raise PolicyError(f"{where}: no self-issued root certificate among the TSA certificates")
    return TimestampAuthority(name, roots, tuple(c for c in certs if c.subject != c.issuer))


def timestamp_authorities(
    items: Sequence[TimestampAuthorityModel], where: str, base_dir: Path
) -> tuple[TimestampAuthority, ...]:
    """The `timestampAuthorities` of a policy entry, their PEM files read relative to `base_dir`.

    Raises:
        PolicyError: A file cannot be read, holds no certificate, or a chain has no self-issued root.
    """
    result = []
    for j, item in enumerate(items):
        at = f"{where}.timestampAuthorities[{j}].certChain"
        certs = [
            c
            for k, f in enumerate(item.cert_chain)
            for c in read_pem_certificates(base_dir / f, f"{at}[{k}]")
        ]
        result.append(timestamp_authority(item.name, certs, at))
    return tuple(result)


def key_windows(keys: Sequence[TrustedKey], items: Sequence[str | KeyRefModel]) -> tuple[KeyWindow, ...]:
    """The validity windows of the loaded `keys` whose policy entries (`items`, same order) give one."""
    return tuple(
        KeyWindow(key, item.valid_from, item.valid_until)
        for key, item in zip(keys, items, strict=True)
        if not isinstance(item, str) and (item.valid_from is not None or item.valid_until is not None)
    )
