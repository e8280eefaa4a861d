"""The SQLite attestation store: idempotent, durable across reopen, safe with concurrent writers."""

from __future__ import annotations

import hashlib
import multiprocessing
import threading
from pathlib import Path

import pytest

from modelsec.errors import BackendUnavailableError, MalformedArtifactError
from modelsec.service.store import SqliteAttestationStore, StoreFullError

D1, D2 = "a" * 64, "b" * 64


def _put(store: SqliteAttestationStore, bundle: bytes, digest: str = D1, who: str = "ci") -> bool:
    return store.put_record(
        bundle, root_digest=digest, predicate_type="p", signer="k", algorithm="ecdsa-p256", stored_by=who
    )[1]


def test_put_is_idempotent_and_keyed_by_bundle_hash(tmp_path: Path) -> None:
    store = SqliteAttestationStore(tmp_path / "s.db")
    assert _put(store, b"one") is True
    assert _put(store, b"one", who="someone else") is False
    ((record, data),) = store.records(D1)
    assert data == b"one" and record.id == hashlib.sha256(b"one").hexdigest() and record.stored_by == "ci"
    assert store.bundles(D2) == []


def test_records_survive_reopening(tmp_path: Path) -> None:
    store = SqliteAttestationStore(tmp_path / "s.db")
    _put(store, b"one")
    _put(store, b"two", D2)
    store.close()
    again = SqliteAttestationStore(tmp_path / "s.db")
    assert again.bundles(D1) == [b"one"] and again.bundles(D2) == [b"two"]


def test_pages_newest_first_with_tokens(tmp_path: Path) -> None:
    store = SqliteAttestationStore(tmp_path / "s.db")
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
        SqliteAttestationStore(tmp_path / "s.db").page(page_token=token)


def test_per_model_limit(tmp_path: Path) -> None:
    store = SqliteAttestationStore(tmp_path / "s.db", max_bundles_per_digest=2)
    _put(store, b"1")
    _put(store, b"2")
    with pytest.raises(StoreFullError, match="already has 2 stored bundles"):
        _put(store, b"3")
    assert _put(store, b"1") is False  # an existing bundle is still found


def test_concurrent_threads(tmp_path: Path) -> None:
    store = SqliteAttestationStore(tmp_path / "s.db", max_bundles_per_digest=1000)
    threads = [
        threading.Thread(target=lambda t=t: [_put(store, f"{t}-{i}".encode()) for i in range(50)])
        for t in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.bundles(D1)) == 400


def _writer(path: str, tag: int) -> None:
    store = SqliteAttestationStore(Path(path), max_bundles_per_digest=1000)
    for i in range(40):
        _put(store, f"{tag}-{i}".encode())
        _put(store, b"shared")


def test_concurrent_processes_share_one_database(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path / "s.db"), t)) for t in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    bundles = SqliteAttestationStore(tmp_path / "s.db").bundles(D1)
    assert len(bundles) == 121 and bundles.count(b"shared") == 1


def test_unopenable_database_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(BackendUnavailableError, match="cannot open the attestation store"):
        SqliteAttestationStore(tmp_path / "dir.db")
