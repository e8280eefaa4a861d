"""The PostgreSQL attestation store (`postgresql://`): one database that every replica of the service shares.

Same semantics as the SQLite store (`modelsec.verifier.stores.records`), across processes and hosts:

- **Atomic changes.** A put, a supersede and a delete are each one transaction; a committed one is durable
  (PostgreSQL's WAL, `synchronous_commit` as the server sets it) and seen by every replica's next read.
- **Idempotent puts, also when replicas race.** A put takes a transaction-scoped advisory lock on its model
  root digest before it looks the record id up, counts the model's current records and inserts, so puts
  about one model are serialised and the limit holds exactly. The id is also `UNIQUE` and inserted with
  `ON CONFLICT (id) DO NOTHING`: a racing put of the same id finds the committed row and returns it as not
  new, never a second record or an error.
- **Schema.** Created and migrated when a store opens, in one transaction under an advisory lock, so
  replicas that start together apply each migration once; `modelsec_schema` holds the version. Migrations
  only add, so a replica of an older release keeps working on a newer schema during a rolling update.
- **Change token.** `revision` reads `modelsec_generation`, which a statement trigger on the records table
  bumps in every writing transaction (so writes are serialised on that row, which puts are rare enough
  to afford); the webhook's cache checks it instead of reading the bundles again.
- **Connections.** One connection per store, serialised by a lock (the service's RPCs are short); a
  connection that breaks (a server restart, a failover) fails the call in progress with
  `BackendUnavailableError`, the retryable error, and is opened again by the next call.
- **Credentials and TLS.** The URI is libpq's (`postgresql://USER@HOST:PORT/DB?sslmode=verify-full&…`);
  the password comes from the `password` argument (the service reads it from a file or the environment),
  else from libpq (`PGPASSWORD`, `PGPASSFILE`). It never appears in `uri` or in any message.

Nothing here trusts a bundle: the service verifies before `put_record`, and every reader verifies again.
Source: PostgreSQL 15 documentation, "Advisory Locks" (13.3.5), "INSERT … ON CONFLICT", "CREATE TRIGGER",
"libpq Connection Strings" (34.1.1) and "SSL Support" (34.19).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from modelsec.errors import BackendUnavailableError
from modelsec.verifier.stores.records import Execute, RecordStoreBase

__all__ = ["PostgresAttestationStore", "connect_store"]

_TABLE = "modelsec_attestations"
_GENERATION = "modelsec_generation"
# Each migration is applied once, in order, under the schema lock; append only.
_MIGRATIONS: tuple[str, ...] = (
    f"""
    CREATE TABLE {_TABLE} (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        root_digest TEXT NOT NULL,
        predicate_type TEXT NOT NULL,
        signer TEXT NOT NULL,
        algorithm TEXT NOT NULL,
        stored_at TEXT NOT NULL,
        stored_by TEXT NOT NULL,
        bundle BYTEA NOT NULL,
        superseded_at TEXT
    );
    CREATE INDEX {_TABLE}_by_digest ON {_TABLE} (root_digest, seq);
    """,
    # The store's change token (`revision`): bumped by a trigger in the writing transaction, so every
    # writer, of any release or by hand, changes it when it commits.
    f"""
    CREATE TABLE {_GENERATION} (generation BIGINT NOT NULL);
    INSERT INTO {_GENERATION} (generation) VALUES (0);
    CREATE FUNCTION {_GENERATION}_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE {_GENERATION} SET generation = generation + 1;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER {_TABLE}_generation AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {_TABLE}
        FOR EACH STATEMENT EXECUTE FUNCTION {_GENERATION}_bump();
    """,  # noqa: S608 - constant SQL
)
# Advisory lock keys: one bigint for the schema, (class, digest prefix) pairs for the models; PostgreSQL
# keeps the one-key and two-key forms apart.
_SCHEMA_LOCK = int.from_bytes(hashlib.sha256(b"modelsec schema").digest()[:8], "big", signed=True)
_DIGEST_LOCK_CLASS = int.from_bytes(hashlib.sha256(b"modelsec digest").digest()[:4], "big", signed=True)
_CONNECT_TIMEOUT_S = 10


def connect_store(
    uri: str,
    *,
    password: str | None = None,
    max_bundles_per_digest: int = 256,
    max_bundle_bytes: int = 16 * 2**20,
) -> PostgresAttestationStore:
    """Open a `PostgresAttestationStore` (`modelsec.verifier.stores.records.open_record_store`'s arguments).

    Raises:
        BackendUnavailableError: The URI does not parse, or the database cannot be reached, authenticates
            us not, refuses TLS, or the schema cannot be created.
    """
    return PostgresAttestationStore(
        uri,
        password=password,
        max_bundles_per_digest=max_bundles_per_digest,
        max_bundle_bytes=max_bundle_bytes,
    )


class PostgresAttestationStore(RecordStoreBase):
    """A bundle store in a PostgreSQL database shared by several processes (see the module docstring).

    Raises (every method):
        BackendUnavailableError: The database cannot be reached, read or written (retryable).
    """

    _table = _TABLE
    _placeholder = "%s"

    def __init__(
        self,
        uri: str,
        *,
        password: str | None = None,
        max_bundles_per_digest: int = 256,
        max_bundle_bytes: int = 16 * 2**20,
    ) -> None:
        self.max_bundles_per_digest = max_bundles_per_digest
        self.max_bundle_bytes = max_bundle_bytes
        self._conninfo = uri
        self._password = password
        self._lock = threading.Lock()
        self._db: psycopg.Connection[Any] | None = None
        try:
            params = conninfo_to_dict(uri)
        except psycopg.Error as e:
            raise BackendUnavailableError(
                f"attestation store: not a PostgreSQL connection URI: {e}"
            ) from None
        self._uri = _display_uri(params)
        with self._transaction("create the schema of") as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS modelsec_schema (version INTEGER NOT NULL)")
            row = cur.execute("SELECT max(version) FROM modelsec_schema").fetchone()
            version = row[0] if row and row[0] is not None else 0
            for number, sql in enumerate(_MIGRATIONS[version:], start=version + 1):
                cur.execute(sql)
                cur.execute("INSERT INTO modelsec_schema (version) VALUES (%s)", (number,))

    @property
    def uri(self) -> str:
        """`postgresql://USER@HOST:PORT/DATABASE`, without password or options (for diagnostics)."""
        return self._uri

    def revision(self, digest: str) -> str:
        """The store's generation: a counter that a trigger bumps in every transaction that changes a record.

        One query, no bundle read. It counts writes to the whole store (any model), so it changes more
        often than `entries(digest)` does, never less: a put, supersede or delete from any replica,
        connection or SQL session commits its bump with its change.

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
            BackendUnavailableError: The database cannot be read.
        """
        super().revision(digest)
        rows = self._query(f"SELECT generation FROM {_GENERATION}", ())  # noqa: S608 - constant SQL
        return str(rows[0][0])

    def check(self) -> None:
        """Raise `BackendUnavailableError` unless the database answers a query (re-connecting if needed)."""
        with self._transaction("read") as cur:
            cur.execute("SELECT 1")

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    @contextlib.contextmanager
    def _put_transaction(self, root_digest: str) -> Iterator[Execute]:
        with self._transaction("write") as cur:
            cur.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", (_DIGEST_LOCK_CLASS, _digest_lock(root_digest))
            )
            yield cur.execute

    def _insert(self, execute: Execute, insert: str, args: tuple[object, ...]) -> bool:
        # A put of the same id about another digest holds another advisory lock: UNIQUE decides.
        return execute(f"{insert} ON CONFLICT (id) DO NOTHING RETURNING seq", args).fetchone() is not None

    def _rowcount(self, sql: str, args: tuple[object, ...]) -> int:
        with self._transaction("write") as cur:
            return cur.execute(sql, args).rowcount

    def _query(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        with self._transaction("read") as cur:
            return cur.execute(sql, args).fetchall()

    @contextlib.contextmanager
    def _transaction(self, verb: str) -> Iterator[psycopg.Cursor[Any]]:
        """One transaction on the store's connection (opened first if there is none or it broke)."""
        with self._lock:
            try:
                if self._db is None or self._db.closed:
                    params = _connect_defaults(self._conninfo)
                    if self._password is not None:
                        params["password"] = self._password
                    self._db = psycopg.connect(self._conninfo, autocommit=True, **params)
                with self._db.transaction(), self._db.cursor() as cur:
                    yield cur
            except psycopg.Error as e:
                if self._db is not None and (self._db.broken or self._db.closed):
                    self._db.close()
                    self._db = None
                raise BackendUnavailableError(
                    f"{self.uri}: cannot {verb} the attestation store: {_reason(e)}"
                ) from None


def _connect_defaults(conninfo: str) -> dict[str, Any]:
    """Libpq parameters the URI may set itself: a bounded connect, and our name in `pg_stat_activity`."""
    given = conninfo_to_dict(conninfo)
    defaults: dict[str, Any] = {"connect_timeout": _CONNECT_TIMEOUT_S, "application_name": "modelsec"}
    return {k: v for k, v in defaults.items() if k not in given}


def _display_uri(params: dict[str, Any]) -> str:
    user = f"{params['user']}@" if params.get("user") else ""
    host = str(params.get("host") or "")
    host = f"[{host}]" if ":" in host and not host.startswith("/") else host
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{user}{host}{port}/{params.get('dbname') or ''}"


def _digest_lock(root_digest: str) -> int:
    # The first 32 bits of the digest, as a signed int4: unrelated digests that share them only wait.
    return int.from_bytes(hashlib.sha256(root_digest.encode()).digest()[:4], "big", signed=True)


def _reason(e: psycopg.Error) -> str:
    # libpq's message names the host, the user and the failure, never the password; keep its first line.
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
