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

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from modelsec.errors import BackendUnavailableError
from modelsec.verifier.stores.records import Execute, RecordStoreBase, StoredRecord, StoreFullError

__all__ = ["SqliteAttestationStore", "StoreFullError", "StoredRecord"]

_BUSY_TIMEOUT = 10.0  # seconds a connection waits for another's lock (and the open for a replica's set-up)

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


class SqliteAttestationStore(RecordStoreBase):
    """A durable, concurrency-safe bundle store in one SQLite file.

    Raises (every method):
        BackendUnavailableError: The database cannot be opened or written (disk full, locked too long).
    """

    _table = "attestations"
    _placeholder = "?"

    def __init__(
        self, path: Path, *, max_bundles_per_digest: int = 256, max_bundle_bytes: int = 16 * 2**20
    ) -> None:
        self.path = path
        self.max_bundles_per_digest = max_bundles_per_digest
        self.max_bundle_bytes = max_bundle_bytes
        self._lock = threading.Lock()
        self._writes = 0  # changes committed through this connection (`PRAGMA data_version` omits them)
        deadline = time.monotonic() + _BUSY_TIMEOUT
        while True:
            try:
                self._db = sqlite3.connect(
                    path, timeout=_BUSY_TIMEOUT, check_same_thread=False, isolation_level=None
                )
            except sqlite3.Error as e:
                raise BackendUnavailableError(f"{path}: cannot open the attestation store: {e}") from e
            try:
                self._set_up()
                break
            except sqlite3.Error as e:
                self._db.close()
                # Switching a database to WAL while another connection (a replica starting at the same
                # time) holds its write lock answers SQLITE_BUSY at once, without the busy timeout: wait here.
                busy = isinstance(e, sqlite3.OperationalError) and "locked" in str(e)
                if not busy or time.monotonic() >= deadline:
                    raise BackendUnavailableError(f"{path}: cannot open the attestation store: {e}") from e
                time.sleep(0.02)

    def _set_up(self) -> None:
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

    @property
    def uri(self) -> str:
        """`sqlite://<path>`."""
        return f"sqlite://{self.path}"

    def revision(self, digest: str) -> str:
        """`PRAGMA data_version` and this connection's writes: a change token for the whole database.

        SQLite changes `data_version` when another connection (of this process or any other) commits, and
        never for this connection's own commits, which are counted here instead; so any committed put,
        delete or supersede changes the token (https://sqlite.org/pragma.html#pragma_data_version). One
        query, no bundle read.

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
            BackendUnavailableError: The database cannot be read.
        """
        super().revision(digest)
        try:
            with self._lock:
                (version,) = self._db.execute("PRAGMA data_version").fetchone()
                return f"{version}.{self._writes}"
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot read the attestation store: {e}") from e

    def check(self) -> None:
        """Raise `BackendUnavailableError` unless the database answers a query."""
        self._query("SELECT 1", ())

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _put_transaction(self, root_digest: str) -> Iterator[Execute]:
        # BEGIN IMMEDIATE takes the database's write lock: every put (of every process) is serialised.
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._writes += 1
                try:
                    yield self._db.execute
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot write the attestation store: {e}") from e

    def _insert(self, execute: Execute, insert: str, args: tuple[object, ...]) -> bool:
        execute(insert, args)  # under the write lock no other put can have stored the id meanwhile
        return True

    def _rowcount(self, sql: str, args: tuple[object, ...]) -> int:
        try:
            with self._lock:
                self._writes += 1
                return int(self._db.execute(sql, args).rowcount)
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot write the attestation store: {e}") from e

    def _query(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        try:
            with self._lock:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise BackendUnavailableError(f"{self.path}: cannot read the attestation store: {e}") from e
