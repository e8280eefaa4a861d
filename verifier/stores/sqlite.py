"""The SQLite attestation store (`sqlite://`): the service's embedded default, one database file.

Bundles are stored by their subject's model root digest with the metadata of the verification that
admitted them (signer, algorithm, who stored them, when). The store itself trusts nothing: the service
verifies a bundle against the policy before `put_record`, and every reader (webhook, `verify_attestations`)
verifies again what it reads. Durability: WAL journal with `synchronous=FULL` (a committed put survives a
crash or restart); concurrent writers (threads or several server processes on one data directory) are
serialised by SQLite's lock with a busy timeout; a record id (the service's: the signed statement and the
verifying key; default: SHA-256 of the bytes) is stored once, so a put is idempotent. Implements
`modelsec.verifier.stores.records.RecordStore` with the PostgreSQL store's semantics (replicas on several
hosts share that one; SQLite serves the processes of one host); the service uses `put_record` to keep the
admitting verification's metadata with each bundle. `supersede` marks a record so that readers no longer
get it (kept for audit); `delete` removes it.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from dataclasses import astuple
from pathlib import Path
from typing import Any

from modelsec.errors import BackendUnavailableError, NotFoundError
from modelsec.verifier.stores import StoredBundle
from modelsec.verifier.stores.records import (
    RecordStoreBase,
    StoredRecord,
    StoreFullError,
    decode_page_token,
    encode_page_token,
    utc_now,
)

__all__ = ["SqliteAttestationStore", "StoreFullError", "StoredRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS attestations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    root_digest TEXT NOT NULL,
    predicate_type TEXT NOT NULL,
    signer TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    stored_at TEXT NOT NULL,
    stored_by TEXT NOT NULL,
    bundle BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS attestations_by_digest ON attestations (root_digest, seq);
"""
_COLUMNS = "id, root_digest, predicate_type, signer, algorithm, stored_at, stored_by"
_CURRENT = "superseded_at IS NULL"


class SqliteAttestationStore(RecordStoreBase):
    """A durable, concurrency-safe bundle store in one SQLite file.

    Raises (every method):
        BackendUnavailableError: The database cannot be opened or written (disk full, locked too long).
    """

    def __init__(
        self, path: Path, *, max_bundles_per_digest: int = 256, max_bundle_bytes: int = 16 * 2**20
    ) -> None:
        self.path = path
        self.max_bundles_per_digest = max_bundles_per_digest
        self.max_bundle_bytes = max_bundle_bytes
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, timeout=10.0, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            # Check and migrate under the write lock: processes opening one database at once would otherwise
            # both see the column missing and the second ALTER would fail.
            self._db.execute("BEGIN IMMEDIATE")
            try:
                columns = {row[1] for row in self._db.execute("PRAGMA table_info(attestations)")}
                if "superseded_at" not in columns:  # a database written before records could be superseded
                    self._db.execute("ALTER TABLE attestations ADD COLUMN superseded_at TEXT")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{path}: cannot open the attestation store: {e}") from e

    @property
    def uri(self) -> str:
        """`sqlite://<path>`."""
        return f"sqlite://{self.path}"

    def check(self) -> None:
        """Raise `BackendUnavailableError` unless the database answers a query."""
        self._query("SELECT 1", ())

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

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
                id stores nothing.
            root_digest: The subject's model root digest.
            predicate_type: The statement's predicate type.
            signer: Name of the trusted key that verified it.
            algorithm: Its signature algorithm.
            stored_by: The authenticated identity storing it.

        Raises:
            StoreFullError: The model already has `max_bundles_per_digest` bundles.
            BackendUnavailableError: The write failed.
        """
        bundle_id = record_id or hashlib.sha256(bundle).hexdigest()
        now = utc_now()
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    row = self._db.execute(
                        f"SELECT {_COLUMNS} FROM attestations WHERE id = ?",  # noqa: S608 - constant SQL
                        (bundle_id,),
                    ).fetchone()
                    if row is not None:
                        self._db.execute("COMMIT")
                        return StoredRecord(*row), False
                    (count,) = self._db.execute(
                        f"SELECT COUNT(*) FROM attestations WHERE root_digest = ? AND {_CURRENT}",  # noqa: S608 - constant SQL
                        (root_digest,),
                    ).fetchone()
                    if count >= self.max_bundles_per_digest:
                        raise StoreFullError(
                            f"model {root_digest} already has {count} stored bundles (the limit)"
                        )
                    record = StoredRecord(
                        bundle_id, root_digest, predicate_type, signer, algorithm, now, stored_by
                    )
                    self._db.execute(
                        f"INSERT INTO attestations ({_COLUMNS}, bundle) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant SQL; values bound
                        (*astuple(record), bundle),
                    )
                    self._db.execute("COMMIT")
                    return record, True
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot write the attestation store: {e}") from e

    def records(self, root_digest: str) -> list[tuple[StoredRecord, bytes]]:
        """Every stored bundle about `root_digest`, oldest first, with its record."""
        rows = self._query(
            f"SELECT {_COLUMNS}, bundle FROM attestations WHERE root_digest = ? AND {_CURRENT} "  # noqa: S608 - constant SQL; values bound
            "ORDER BY seq LIMIT ?",
            (root_digest, self.max_bundles_per_digest),
        )
        return [(StoredRecord(*r[:7]), bytes(r[7])) for r in rows]

    def get(self, digest: str, bundle_id: str) -> StoredBundle:
        """One stored bundle by record id.

        Raises:
            NotFoundError: No bundle with this id about `digest`.
            BackendUnavailableError: The database cannot be read.
        """
        rows = self._query(
            f"SELECT bundle FROM attestations WHERE id = ? AND root_digest = ? AND {_CURRENT}",  # noqa: S608 - constant SQL
            (bundle_id, digest),
        )
        if not rows:
            raise NotFoundError(f"{self.uri}: no bundle {bundle_id!r} about {digest!r}")
        return StoredBundle(bundle_id, digest, bytes(rows[0][0]), f"{self.uri}#{bundle_id}")

    def page(
        self, *, root_digest: str = "", page_size: int = 100, page_token: str = ""
    ) -> tuple[list[StoredRecord], str]:
        """Stored records newest first, `page_size` at a time; returns the page and the next page token.

        Raises:
            MalformedArtifactError: The page token is not one this store issued.
        """
        before = decode_page_token(page_token)
        where, args = f"WHERE seq < ? AND {_CURRENT}", list[object]([before])
        if root_digest:
            where += " AND root_digest = ?"
            args.append(root_digest)
        rows = self._query(
            f"SELECT seq, {_COLUMNS} FROM attestations {where} ORDER BY seq DESC LIMIT ?",  # noqa: S608 - constant SQL; values bound
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
        self._change("DELETE FROM attestations WHERE id = ? AND root_digest = ?", (bundle_id, digest))

    def supersede(self, digest: str, bundle_id: str) -> None:
        """Mark the record `bundle_id` about `digest` superseded: kept, no longer read, listed or counted.

        A superseded record does not count against the model's limit; a second put of the same record
        stays superseded (`delete` forgets it).

        Raises:
            NotFoundError: No such current record.
            BackendUnavailableError: The write failed.
        """
        now = utc_now()
        self._change(
            f"UPDATE attestations SET superseded_at = ? WHERE id = ? AND root_digest = ? AND {_CURRENT}",  # noqa: S608 - constant SQL
            (now, bundle_id, digest),
        )

    def _change(self, sql: str, args: tuple[str, ...]) -> None:
        bundle_id, digest = args[-2:]
        try:
            with self._lock:
                changed = self._db.execute(sql, args).rowcount
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot write the attestation store: {e}") from e
        if not changed:
            raise NotFoundError(f"{self.uri}: no bundle {bundle_id!r} about {digest!r}")

    def _query(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        try:
            with self._lock:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot read the attestation store: {e}") from e
