"""What the record stores share: the service's store protocol, its records, page tokens, `open_record_store`.

A record store is an `AttestationStore` that also keeps, with each bundle, the metadata of the verification
that admitted it (`put_record`), lists records a page at a time, and withdraws them (`supersede`). Two
implement it, with one semantics:

| URI | implementation | for |
|---|---|---|
| `sqlite:///abs/file.db` | `SqliteAttestationStore` | one process (the service's embedded default) |
| `postgresql://user@host/db?sslmode=verify-full` | `PostgresAttestationStore` | replicas sharing a database |

Semantics both keep (`tests/integration/service/test_store.py` runs one contract against both): a record id
is stored once, whoever puts it and however many put it at once (the put is idempotent and returns whether
it was new); a model holds at most `max_bundles_per_digest` current records, counted in the same transaction
as the insert; a superseded record is kept, no longer read, listed or counted, and a second put of it stays
superseded; a committed change survives the crash of the process that made it.
"""

from __future__ import annotations

import abc
import base64
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.statement import is_sha256_hex, parse_statement
from modelsec.errors import Error, MalformedArtifactError, PolicyError
from modelsec.verifier.stores import AttestationStore, StoredBundle
from modelsec.verifier.stores.directory import subject_root_digest

__all__ = [
    "RecordStore",
    "RecordStoreBase",
    "StoreFullError",
    "StoredRecord",
    "bundle_subject",
    "decode_page_token",
    "encode_page_token",
    "open_record_store",
    "utc_now",
]


class StoreFullError(Error):
    """A model already has as many stored bundles as the store allows (status RESOURCE_EXHAUSTED)."""


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """Metadata of one stored bundle (`id` = hex SHA-256 of the bundle bytes; `stored_at` RFC 3339 UTC)."""

    id: str
    root_digest: str
    predicate_type: str
    signer: str
    algorithm: str
    stored_at: str
    stored_by: str


class RecordStore(AttestationStore, Protocol):
    """The service's store: an `AttestationStore` that keeps admission metadata (see the module docstring)."""

    def put_record(
        self,
        bundle: bytes,
        *,
        record_id: str | None = None,
        root_digest: str,
        predicate_type: str,
        signer: str,
        algorithm: str,
        stored_by: str,
    ) -> tuple[StoredRecord, bool]:
        """Store a (verified) bundle; returns its record and whether it was new.

        Args:
            bundle: The bundle bytes.
            record_id: The record's identity (default: hex SHA-256 of `bundle`); a second put with the same
                id stores nothing, also when several puts race.
            root_digest: The subject's model root digest.
            predicate_type: The statement's predicate type.
            signer: Name of the trusted key that verified it.
            algorithm: Its signature algorithm.
            stored_by: The authenticated identity storing it.

        Raises:
            StoreFullError: The model already has `max_bundles_per_digest` current bundles.
            BackendUnavailableError: The write failed.
        """
        ...

    def records(self, root_digest: str) -> list[tuple[StoredRecord, bytes]]:
        """Every current bundle about `root_digest`, oldest first, with its record.

        Raises:
            BackendUnavailableError: The store cannot be read.
        """
        ...

    def page(
        self, *, root_digest: str = "", page_size: int = 100, page_token: str = ""
    ) -> tuple[list[StoredRecord], str]:
        """Current records newest first, `page_size` at a time; returns the page and the next page token.

        Raises:
            MalformedArtifactError: The page token is not one this store issued.
            BackendUnavailableError: The store cannot be read.
        """
        ...


class RecordStoreBase(abc.ABC):
    """What both record stores derive from `put_record` and `records`: the protocol's put and reads."""

    max_bundle_bytes: int

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The store's reference, for diagnostics."""

    @abc.abstractmethod
    def put_record(
        self,
        bundle: bytes,
        *,
        record_id: str | None = None,
        root_digest: str,
        predicate_type: str,
        signer: str,
        algorithm: str,
        stored_by: str,
    ) -> tuple[StoredRecord, bool]:
        """`RecordStore.put_record`."""

    @abc.abstractmethod
    def records(self, root_digest: str) -> list[tuple[StoredRecord, bytes]]:
        """`RecordStore.records`."""

    def put(self, data: bytes) -> tuple[StoredBundle, bool]:
        """File a bundle under its subject's root digest (the protocol's put; no verification metadata).

        Raises:
            MalformedArtifactError: Too large, not a bundle, or no sha256 subject.
            StoreFullError: The model already has `max_bundles_per_digest` bundles.
            BackendUnavailableError: The write failed.
        """
        digest, predicate_type = bundle_subject(data, self.max_bundle_bytes)
        record, created = self.put_record(
            data, root_digest=digest, predicate_type=predicate_type, signer="", algorithm="", stored_by=""
        )
        return StoredBundle(record.id, digest, data, f"{self.uri}#{record.id}"), created

    def bundles(self, digest: str) -> list[bytes]:
        """The current bundles about a model root digest, oldest first."""
        return [b for _, b in self.records(digest)]

    def entries(self, digest: str) -> list[StoredBundle]:
        """`bundles` with each bundle's record id and source (`<uri>#<id>`).

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
            BackendUnavailableError: The store cannot be read.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        return [StoredBundle(r.id, digest, b, f"{self.uri}#{r.id}") for r, b in self.records(digest)]


def utc_now() -> str:
    """Now as the stores record it: RFC 3339 UTC with microseconds (`2025-01-31T12:00:00.000000Z`)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def bundle_subject(data: bytes, max_bundle_bytes: int) -> tuple[str, str]:
    """(model root digest, predicate type) of a bundle filed by the protocol's `put` (nothing verified).

    Raises:
        MalformedArtifactError: Larger than `max_bundle_bytes`, not a bundle, or no sha256 subject.
    """
    digest = subject_root_digest(data, max_bundle_bytes)
    statement = parse_statement(parse_bundle(data, source="bundle").envelope.payload, what="bundle")
    return digest, statement.predicate_type


def encode_page_token(seq: int) -> str:
    """The page token that continues below the record sequence number `seq`."""
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode()


def decode_page_token(token: str) -> int:
    """The sequence number a page token continues below (`2**63 - 1` for the first page).

    Raises:
        MalformedArtifactError: Not a token `encode_page_token` made (checked before decoding a long one).
    """
    if not token:
        return 2**63 - 1
    seq = None
    if len(token) <= 64:
        try:
            match = re.fullmatch(
                r"seq:([1-9][0-9]{0,17})", base64.urlsafe_b64decode(token.encode()).decode("ascii")
            )
        except (ValueError, UnicodeDecodeError):
            match = None
        seq = int(match.group(1)) if match else None
    if seq is None:
        raise MalformedArtifactError(f"page_token {token[:80]!r} is not a token this server issued")
    return seq


def open_record_store(
    reference: str,
    *,
    password: str | None = None,
    max_bundles_per_digest: int = 256,
    max_bundle_bytes: int = 16 * 2**20,
) -> RecordStore:
    """Open the record store a URI names: `sqlite://PATH` or `postgresql://…` (`postgres://` alike).

    Args:
        reference: The store URI. A PostgreSQL URI is a libpq connection URI (TLS by its `sslmode`,
            `sslrootcert`, `sslcert`, `sslkey` parameters); its password is better given as `password`.
        password: The database password (PostgreSQL only; it overrides one in the URI). None leaves it to
            the URI or to libpq (`PGPASSWORD`, `PGPASSFILE`).
        max_bundles_per_digest: Most current bundles one model may hold.
        max_bundle_bytes: Largest bundle `put` accepts.

    Returns:
        The store, opened: SQLite has its file, PostgreSQL a connection and its schema.

    Raises:
        PolicyError: Another scheme, or no target.
        BackendUnavailableError: The store cannot be opened (PostgreSQL: unreachable, authentication,
            TLS, the schema).
        ModuleNotFoundError: `psycopg`, when the `postgres` extra is not installed (the CLI names the extra).
    """
    scheme, sep, target = reference.partition("://")
    scheme = scheme.lower()
    if not sep or not target or scheme not in ("sqlite", "postgresql", "postgres"):
        raise PolicyError(
            f"record store {reference[:200]!r}: use sqlite:///PATH or postgresql://USER@HOST/DATABASE"
        )
    if scheme == "sqlite":
        from pathlib import Path

        from modelsec.verifier.stores.sqlite import SqliteAttestationStore

        return SqliteAttestationStore(
            Path(target), max_bundles_per_digest=max_bundles_per_digest, max_bundle_bytes=max_bundle_bytes
        )
    from modelsec.verifier.stores.postgres import connect_store

    return connect_store(
        reference,
        password=password,
        max_bundles_per_digest=max_bundles_per_digest,
        max_bundle_bytes=max_bundle_bytes,
    )
