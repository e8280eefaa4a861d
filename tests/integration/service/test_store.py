"""The record stores, SQLite and PostgreSQL, under one contract: idempotent, durable, safe when writers race.

Every test runs against both (`backend`): the embedded SQLite file and a PostgreSQL database of its own on
the session's server (`postgres` fixture), opened through `open_record_store` as the service opens them.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import BackendUnavailableError, MalformedArtifactError, NotFoundError
from modelsec.service.store import RecordStore, StoreFullError
from modelsec.verifier.stores import open_store
from modelsec.verifier.stores.records import open_record_store
from tests.support.postgres import Postgres

pytestmark = pytest.mark.integration

D1, D2 = "a" * 64, "b" * 64

Opener = Callable[..., RecordStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(store URI, password) of an empty store of this test's own."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 's.db'}", None
    server = request.getfixturevalue("postgres")
    return server.new_database(), server.password


@pytest.fixture
def make_store(backend: tuple[str, str | None]) -> Opener:
    """Open (again) this test's store, as the service does."""
    uri, password = backend
    return lambda **limits: open_record_store(uri, password=password, **limits)


def _put(store: RecordStore, bundle: bytes, digest: str = D1, who: str = "ci") -> bool:
    return store.put_record(
        bundle, root_digest=digest, predicate_type="p", signer="k", algorithm="ecdsa-p256", stored_by=who
    )[1]


def test_put_is_idempotent_and_keyed_by_bundle_hash(make_store: Opener) -> None:
    store = make_store()
    assert _put(store, b"one") is True
    assert _put(store, b"one", who="someone else") is False
    ((record, data),) = store.records(D1)
    assert data == b"one" and record.id == hashlib.sha256(b"one").hexdigest() and record.stored_by == "ci"
    assert store.bundles(D2) == []


def test_records_survive_reopening(make_store: Opener) -> None:
    store = make_store()
    _put(store, b"one")
    _put(store, b"two", D2)
    store.close()
    again = make_store()
    assert again.bundles(D1) == [b"one"] and again.bundles(D2) == [b"two"]


def test_pages_newest_first_with_tokens(make_store: Opener) -> None:
    store = make_store()
    for i in range(5):
        _put(store, f"b{i}".encode(), D1 if i % 2 else D2)
    page, token = store.page(page_size=2)
    seen = [r.id for r in page]
    while token:
        page, token = store.page(page_size=2, page_token=token)
        seen += [r.id for r in page]
    assert seen == [hashlib.sha256(f"b{i}".encode()).hexdigest() for i in reversed(range(5))]
    only, token = store.page(root_digest=D1, page_size=10)
    assert len(only) == 2 and token == ""


@pytest.mark.parametrize(
    "token",
    [
        "garbage",
        "c2VxOi0x",
        "c2VxOmFiYw==",
        "c2VxOjk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5",
        "c2VxOu-8kQ==",
        "x" * 10_000,
    ],
)
def test_foreign_page_tokens_are_refused(tmp_path: Path, token: str) -> None:
    with pytest.raises(MalformedArtifactError, match="page_token"):
        open_record_store(f"sqlite://{tmp_path / 's.db'}").page(page_token=token)


def test_per_model_limit(make_store: Opener) -> None:
    store = make_store(max_bundles_per_digest=2)
    _put(store, b"1")
    _put(store, b"2")
    with pytest.raises(StoreFullError, match="already has 2 stored bundles"):
        _put(store, b"3")
    assert _put(store, b"1") is False  # an existing bundle is still found


def test_supersede_withdraws_keeps_and_frees_the_slot(make_store: Opener) -> None:
    store = make_store(max_bundles_per_digest=1)
    _put(store, b"old")
    old = hashlib.sha256(b"old").hexdigest()
    store.supersede(D1, old)
    assert store.bundles(D1) == [] and store.page()[0] == []
    with pytest.raises(NotFoundError):
        store.get(D1, old)
    with pytest.raises(NotFoundError):
        store.supersede(D1, old)  # only a current record can be superseded
    assert _put(store, b"old") is False and store.bundles(D1) == []  # a second put stays superseded
    assert _put(store, b"new") is True and store.bundles(D1) == [b"new"]  # the slot is free again
    store.delete(D1, old)  # delete forgets a superseded record too
    with pytest.raises(NotFoundError):
        store.delete(D1, old)
    with pytest.raises(StoreFullError):
        _put(store, b"old")  # forgotten: a new put again, which the current record's slot refuses


def test_concurrent_threads(make_store: Opener) -> None:
    store = make_store(max_bundles_per_digest=1000)
    threads = [
        threading.Thread(target=lambda t=t: [_put(store, f"{t}-{i}".encode()) for i in range(50)])
        for t in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.bundles(D1)) == 400


def test_racing_puts_of_one_record_through_separate_connections_store_it_once(make_store: Opener) -> None:
    """Replicas racing one idempotency key: exactly one put is new, one record, and the limit holds."""
    stores = [make_store(max_bundles_per_digest=3) for _ in range(4)]
    _put(stores[0], b"first")
    barrier = threading.Barrier(len(stores))

    def race(store: RecordStore) -> list[Any]:
        barrier.wait()
        out: list[Any] = []
        for i in range(10):
            try:
                out.append(_put(store, b"shared"))
                out.append(_put(store, f"other-{i}".encode()))
            except StoreFullError:
                out.append("full")
        return out

    with ThreadPoolExecutor(len(stores)) as pool:
        results = [r for rs in pool.map(race, stores) for r in rs]
    assert results.count(True) == 2  # "shared" once, one "other-*" in the last slot
    assert len(stores[1].bundles(D1)) == 3 and stores[2].bundles(D1).count(b"shared") == 1


def _writer(uri: str, password: str | None, tag: int) -> None:
    store = open_record_store(uri, password=password, max_bundles_per_digest=1000)
    for i in range(40):
        _put(store, f"{tag}-{i}".encode())
        _put(store, b"shared")


def test_concurrent_writers_share_one_database(backend: tuple[str, str | None], make_store: Opener) -> None:
    # Three stores, each with its own database connection, as three replicas have: the database's locking is
    # what is under test (two real `modelsec serve` processes share one in test_serve_replicas.py).
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda t: _writer(*backend, t), range(3)))
    bundles = make_store(max_bundles_per_digest=1000).bundles(D1)
    assert len(bundles) == 121 and bundles.count(b"shared") == 1


def test_a_replica_opening_while_another_holds_the_write_lock_waits_for_it(tmp_path: Path) -> None:
    """Replicas start at once: switching a fresh database to WAL while another connection holds its write lock
    answers SQLITE_BUSY at once (no busy timeout for that), which refused the open; now it waits for it."""
    import sqlite3

    path = tmp_path / "s.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE other_writer(a)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO other_writer VALUES (1)")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    try:
        store = open_record_store(f"sqlite://{path}")
    finally:
        release.join()
        other.close()
    assert _put(store, b"after the other writer") is True and store.bundles(D1) == [b"after the other writer"]


def test_unopenable_database_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(BackendUnavailableError, match="cannot open the attestation store"):
        open_record_store(f"sqlite://{tmp_path / 'dir.db'}")


def test_open_store_reaches_postgresql_with_libpq_credentials_and_never_shows_the_password(
    postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelsec.verifier.stores.postgres import PostgresAttestationStore  # needs psycopg, as `postgres`

    url = postgres.new_database()
    with pytest.raises(BackendUnavailableError, match="cannot create the schema of") as refused:
        open_record_store(url, password="not-the-password")
    assert "not-the-password" not in str(refused.value) and postgres.password not in str(refused.value)
    monkeypatch.setenv("PGPASSWORD", postgres.password)  # what `verify --store postgresql://…` relies on
    store = open_store(url)
    assert isinstance(store, PostgresAttestationStore) and postgres.password not in store.uri
    assert _put(store, b"one") is True and store.bundles(D1) == [b"one"]


def test_attest_put_and_list_through_a_postgresql_store_uri(
    postgres: Postgres, tmp_path: Path, key_dir: Path, cli: Any
) -> None:
    """The `attest` commands take `postgresql://` as their help says (password from libpq, never argv)."""
    import json

    from modelsec.signer import load_private_key_file, sign_model
    from tests.conftest import write_tiny_model

    model = write_tiny_model(tmp_path / "model", shards=1, seed=41)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    url, env = postgres.new_database(), {"PGPASSWORD": postgres.password}
    put = cli("attest", "put", "--store", url, model / "model.sig", env=env)
    assert put.returncode == 0, put.stderr
    listed = cli("attest", "list", model, "--store", url, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    paths = [b["path"] for b in json.loads(listed.stdout)["bundles"]]
    assert len([p for p in paths if p.startswith("postgresql://")]) == 1, paths
    assert postgres.password not in put.stdout + put.stderr + listed.stdout + listed.stderr
