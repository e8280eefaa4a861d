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
import contextlib
import hashlib
import re
from collections.abc import Callable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.statement import is_sha256_hex, parse_statement
from modelsec.errors import Error, MalformedArtifactError, NotFoundError, PolicyError
from modelsec.verifier.stores import AttestationStore, StoredBundle
from modelsec.verifier.stores.directory import subject_root_digest

__all__ = [
    "CURRENT",
    "RECORD_COLUMNS",
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


# The columns of a `StoredRecord`, in its field order, and the condition that a record is current; both
# stores' tables have them (and `seq`, the insertion order, and `bundle`).
RECORD_COLUMNS = "id, root_digest, predicate_type, signer, algorithm, stored_at, stored_by"
CURRENT = "superseded_at IS NULL"
# A driver's `execute(sql, args)` inside one transaction (`sqlite3.Connection.execute`, psycopg's cursor's).
Execute = Callable[[str, tuple[object, ...]], Any]


class RecordStoreBase(abc.ABC):
    """The reads and changes both record stores share, in SQL both dialects accept.

    A store gives its table, its driver's placeholder (`?` SQLite, `%s` psycopg), `put_record` (where the
    stores' locking differs) and two primitives that keep its own transaction and locking semantics:
    `_query` (rows of one read) and `_rowcount` (rows one change touched, committed).
    """

    max_bundle_bytes: int
    max_bundles_per_digest: int
    _table: str
    _placeholder: str

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The store's reference, for diagnostics."""

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
        """Store a (verified) bundle; returns its record and whether it was new (`RecordStore.put_record`).

        In one `_put_transaction`: the record id looked up, the model's current records counted, the
        record inserted; a record the insert finds already there (a racing put) is returned as not new.

        Raises:
            StoreFullError: The model already has `max_bundles_per_digest` current bundles.
            BackendUnavailableError: The write failed.
        """
        bundle_id = record_id or hashlib.sha256(bundle).hexdigest()
        p = self._placeholder
        select = f"SELECT {RECORD_COLUMNS} FROM {self._table} WHERE id = {p}"  # noqa: S608 - constant SQL; values bound
        with self._put_transaction(root_digest) as execute:
            row = execute(select, (bundle_id,)).fetchone()
            if row is not None:
                return StoredRecord(*row), False
            count_sql = f"SELECT count(*) FROM {self._table} WHERE root_digest = {p} AND {CURRENT}"  # noqa: S608 - constant SQL; values bound
            (count,) = execute(count_sql, (root_digest,)).fetchone() or (0,)
            if count >= self.max_bundles_per_digest:
                raise StoreFullError(f"model {root_digest} already has {count} stored bundles (the limit)")
            record = StoredRecord(
                bundle_id, root_digest, predicate_type, signer, algorithm, utc_now(), stored_by
            )
            insert = f"INSERT INTO {self._table} ({RECORD_COLUMNS}, bundle) VALUES ({', '.join([p] * 8)})"  # noqa: S608 - constant SQL; values bound
            if not self._insert(execute, insert, (*astuple(record), bundle)):
                row = execute(select, (bundle_id,)).fetchone()  # the same id, committed meanwhile
                if row is not None:
                    return StoredRecord(*row), False
            return record, True

    @abc.abstractmethod
    def _put_transaction(self, root_digest: str) -> contextlib.AbstractContextManager[Execute]:
        """The write transaction of a put about `root_digest`, serialised with every other put about it.

        Raises:
            BackendUnavailableError: The write failed (the transaction is rolled back).
        """

    @abc.abstractmethod
    def _insert(self, execute: Execute, insert: str, args: tuple[object, ...]) -> bool:
        """Run the record's `insert` in the put's transaction; False if its id was there already."""

    @abc.abstractmethod
    def _query(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        """The rows `sql` reads (one transaction).

        Raises:
            BackendUnavailableError: The store cannot be read.
        """

    @abc.abstractmethod
    def _rowcount(self, sql: str, args: tuple[object, ...]) -> int:
        """How many rows the change `sql` touched, committed (one transaction).

        Raises:
            BackendUnavailableError: The write failed.
        """

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

    def records(self, root_digest: str) -> list[tuple[StoredRecord, bytes]]:
        """Every current bundle about `root_digest`, oldest first, with its record (`RecordStore.records`).

        Raises:
            BackendUnavailableError: The store cannot be read.
        """
        p = self._placeholder
        rows = self._query(
            f"SELECT {RECORD_COLUMNS}, bundle FROM {self._table} WHERE root_digest = {p} AND {CURRENT} "  # noqa: S608 - constant SQL; values bound
            f"ORDER BY seq LIMIT {p}",
            (root_digest, self.max_bundles_per_digest),
        )
        return [(StoredRecord(*r[:7]), bytes(r[7])) for r in rows]

    def bundles(self, digest: str) -> list[bytes]:
        """The current bundles about a model root digest, oldest first."""
        return [b for _, b in self.records(digest)]

    def revision(self, digest: str) -> str | None:
        """None unless the store keeps a change token (`AttestationStore.revision`; SQLite does).

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        return None

    def entries(self, digest: str) -> list[StoredBundle]:
        """`bundles` with each bundle's record id and source (`<uri>#<id>`).

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
            BackendUnavailableError: The store cannot be read.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        return [StoredBundle(r.id, digest, b, f"{self.uri}#{r.id}") for r, b in self.records(digest)]

    def get(self, digest: str, bundle_id: str) -> StoredBundle:
        """One current bundle by record id.

        Raises:
            NotFoundError: No current bundle with this id about `digest`.
            BackendUnavailableError: The store cannot be read.
        """
        p = self._placeholder
        rows = self._query(
            f"SELECT bundle FROM {self._table} WHERE id = {p} AND root_digest = {p} AND {CURRENT}",  # noqa: S608 - constant SQL; values bound
            (bundle_id, digest),
        )
        if not rows:
            raise NotFoundError(f"{self.uri}: no bundle {bundle_id!r} about {digest!r}")
        return StoredBundle(bundle_id, digest, bytes(rows[0][0]), f"{self.uri}#{bundle_id}")

    def page(
        self, *, root_digest: str = "", page_size: int = 100, page_token: str = ""
    ) -> tuple[list[StoredRecord], str]:
        """Current records newest first, `page_size` at a time; returns the page and the next page token.

        Raises:
            MalformedArtifactError: The page token is not one this store issued.
            BackendUnavailableError: The store cannot be read.
        """
        p = self._placeholder
        where, args = f"WHERE seq < {p} AND {CURRENT}", list[object]([decode_page_token(page_token)])
        if root_digest:
            where += f" AND root_digest = {p}"
            args.append(root_digest)
        rows = self._query(
            f"SELECT seq, {RECORD_COLUMNS} FROM {self._table} {where} ORDER BY seq DESC LIMIT {p}",  # noqa: S608 - constant SQL; values bound
            (*args, page_size + 1),
        )
        page = rows[:page_size]
        token = encode_page_token(page[-1][0]) if len(rows) > page_size else ""
        return [StoredRecord(*r[1:]) for r in page], token

    def delete(self, digest: str, bundle_id: str) -> None:
        """Remove the record `bundle_id` about `digest` (superseded or not); the caller is authorised.

        Raises:
            NotFoundError: No such record.
            BackendUnavailableError: The write failed.
        """
        p = self._placeholder
        self._change(
            f"DELETE FROM {self._table} WHERE id = {p} AND root_digest = {p}",  # noqa: S608 - constant SQL; values bound
            (bundle_id, digest),
        )

    def supersede(self, digest: str, bundle_id: str) -> None:
        """Mark the record `bundle_id` about `digest` superseded: kept, no longer read, listed or counted.

        A superseded record does not count against the model's limit; a second put of the same record
        stays superseded (`delete` forgets it).

        Raises:
            NotFoundError: No such current record.
            BackendUnavailableError: The write failed.
        """
        p = self._placeholder
        self._change(
            f"UPDATE {self._table} SET superseded_at = {p} "  # noqa: S608 - constant SQL; values bound
            f"WHERE id = {p} AND root_digest = {p} AND {CURRENT}",
            (utc_now(), bundle_id, digest),
        )

    def _change(self, sql: str, args: tuple[str, ...]) -> None:
        """Run a change whose last two arguments are (record id, digest); NotFoundError if it touched none."""
        bundle_id, digest = args[-2:]
        if not self._rowcount(sql, args):
            raise NotFoundError(f"{self.uri}: no bundle {bundle_id!r} about {digest!r}")


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
