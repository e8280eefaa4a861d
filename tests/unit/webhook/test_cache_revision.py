"""A cached decision checks the stores' change tokens, not their bundles, and still sees every withdrawal.

Issue 32 item 2: since 3ea507c every cached decision re-read every bundle from the store (so that a
withdrawn or superseded attestation is never served from the cache), which doubled its cost. Now the cache
keeps the stores' revision (`AttestationStore.revision`, the registry evidence cache's serials) and a cached
decision reads only that: no bundle file is opened, no bundle row selected. A write made by another writer
(another `DirectoryStore`, another SQLite connection) after the cached decision changes the revision, and
the next decision reads the store and denies.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import modelsec.verifier.stores.directory as directory_module
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.attestations import store_bundle
from modelsec.verifier.stores.sqlite import SqliteAttestationStore
from modelsec.webhook.review import DirectoryStore, Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.support.asgi import asgi_post
from tests.unit.webhook.test_review import REGISTRY, FakeClock, review_body

_SETTLE_NS = 50_000_000  # the directory store's settle time, shortened so that the tests need not wait 1 s
_OPENS: list[str] | None = None


def _count_opens(event: str, args: tuple[object, ...]) -> None:
    if _OPENS is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _OPENS.append(os.fsdecode(args[0]))


sys.addaudithook(_count_opens)


@pytest.fixture
def opens() -> Iterator[list[str]]:
    """The paths this process opens while the fixture is in use (a `sys.addaudithook` "open" hook)."""
    global _OPENS
    _OPENS = []
    try:
        yield _OPENS
    finally:
        _OPENS = None


@pytest.fixture(autouse=True)
def short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(directory_module, "_SETTLE_NS", _SETTLE_NS, raising=False)


def _settle() -> None:
    time.sleep(2 * _SETTLE_NS / 1e9)


@pytest.fixture(scope="module")
def signed_model(key_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    root = tmp_path_factory.mktemp("cache-revision")
    model = write_tiny_model(root / "model", shards=1)
    result = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return result.root_digest, (model / "model.sig").read_bytes()


def _policies(key_dir: Path, store: Path | None = None) -> PolicySet:
    policy: dict[str, object] = {
        "name": "internal",
        "match": [f"{REGISTRY}/**"],
        "keys": ["ecdsa-p256.pub.pem"],
    }
    if store is not None:
        policy["attestationStore"] = str(store)
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [policy],
        "noMatch": "deny",
    }
    return PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy")


def _body(digest: str) -> bytes:
    return json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{digest}")).encode()


def _filed_and_reviewed(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes]
) -> tuple[Path, Any, Reviewer, bytes]:
    """The signed model's bundle filed in a directory store, a caching reviewer over it, its review body."""
    digest, bundle = signed_model
    store = tmp_path / "store"
    filed, _ = DirectoryStore(store).put(bundle)
    _settle()
    reviewer = Reviewer(_policies(key_dir), DirectoryStore(store), WebhookConfig(cache_ttl_seconds=60))
    return store, filed, reviewer, _body(digest)


def _allowed(reviewer: Reviewer, body: bytes) -> tuple[bool, bool, str]:
    decision = reviewer.review(body)
    cached = bool(decision.references) and decision.references[0].cached
    return decision.response["response"]["allowed"], cached, decision.reason


def test_a_cached_decision_opens_no_bundle_and_sees_another_writers_withdrawal(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes], opens: list[str]
) -> None:
    digest, _bundle = signed_model
    store, filed, reviewer, body = _filed_and_reviewed(tmp_path, key_dir, signed_model)
    assert _allowed(reviewer, body)[:2] == (True, False)
    opens.clear()
    assert _allowed(reviewer, body)[:2] == (True, True)
    under_store = [p for p in opens if p.startswith(str(store))]
    # One open: the digest's directory, to list it; no bundle is read.
    assert under_store == [str(store / "sha256" / digest)]

    DirectoryStore(store).supersede(digest, filed.id)  # another writer withdraws the bundle
    _settle()  # seen by its token, not only because the listing is fresh
    assert _allowed(reviewer, body) == (False, False, "attestation")
    assert len(reviewer.cache) == 0


def test_a_bundle_rewritten_in_place_is_seen(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes], opens: list[str]
) -> None:
    _digest, bundle = signed_model
    _store, filed, reviewer, body = _filed_and_reviewed(tmp_path, key_dir, signed_model)
    assert _allowed(reviewer, body)[:2] == (True, False)
    opens.clear()
    assert _allowed(reviewer, body)[:2] == (True, True)
    assert not [p for p in opens if p.endswith(".sig")]
    # Same name, same size, same inode: only the file's times change.
    with open(filed.source, "r+b") as f:
        f.write(b"{" + b" " * (len(bundle) - 1))
    _settle()
    assert _allowed(reviewer, body)[0] is False


def test_a_fresh_listing_is_not_vouched_for_by_its_times(
    tmp_path: Path, signed_model: tuple[str, bytes]
) -> None:
    digest, bundle = signed_model
    (tmp_path / "store").mkdir()
    store = DirectoryStore(tmp_path / "store")
    assert store.revision(digest) == "none"
    store.put(bundle)
    assert store.revision(digest) is None  # written within the settle time: a same-tick rewrite could hide
    _settle()
    settled = store.revision(digest)
    assert settled is not None and settled == store.revision(digest)


def test_a_cached_decision_makes_one_sqlite_query_and_sees_another_connections_supersede(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes]
) -> None:
    digest, bundle = signed_model
    path = tmp_path / "store.db"
    writer = SqliteAttestationStore(path)
    filed, _ = writer.put(bundle)
    store = SqliteAttestationStore(path)
    reviewer = Reviewer(_policies(key_dir), store, WebhookConfig(cache_ttl_seconds=60))
    body = _body(digest)
    assert _allowed(reviewer, body)[:2] == (True, False)
    queries: list[str] = []
    store._db.set_trace_callback(queries.append)
    assert _allowed(reviewer, body)[:2] == (True, True)
    assert queries == ["PRAGMA data_version"]

    writer.supersede(digest, filed.id)  # another connection withdraws it
    assert _allowed(reviewer, body) == (False, False, "attestation")


def test_the_reviewers_own_sqlite_writes_change_the_revision(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes]
) -> None:
    digest, bundle = signed_model
    store = SqliteAttestationStore(tmp_path / "store.db")
    filed, _ = store.put(bundle)
    reviewer = Reviewer(_policies(key_dir), store, WebhookConfig(cache_ttl_seconds=60))
    body = _body(digest)
    assert _allowed(reviewer, body)[:2] == (True, False)
    assert _allowed(reviewer, body)[:2] == (True, True)
    store.supersede(digest, filed.id)  # the same connection: SQLite's data_version does not change
    assert _allowed(reviewer, body)[0] is False


def test_sqlite_revision_of_a_closed_database_is_an_outage(
    tmp_path: Path, signed_model: tuple[str, bytes]
) -> None:
    from modelsec.errors import BackendUnavailableError

    store = SqliteAttestationStore(tmp_path / "store.db")
    store.close()
    with pytest.raises(BackendUnavailableError):
        store.revision(signed_model[0])


def test_a_policy_store_is_read_once_per_evidence_ttl_and_a_withdrawal_seen_after_it(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes], opens: list[str]
) -> None:
    digest, bundle = signed_model
    store = tmp_path / "policy-store"
    store_bundle(store, bundle)
    clock = FakeClock()
    config = WebhookConfig(cache_ttl_seconds=600, evidence_ttl_seconds=30)
    reviewer = Reviewer(_policies(key_dir, store), None, config, clock=clock)  # type: ignore[arg-type]
    body = _body(digest)
    assert _allowed(reviewer, body)[:2] == (True, False)
    opens.clear()
    for _ in range(3):
        clock.now += 5
        assert _allowed(reviewer, body)[:2] == (True, True)
    assert not [p for p in opens if p.startswith(str(store))]  # inside the evidence TTL: nothing read

    for sig in store.rglob("*.sig"):
        sig.unlink()
    clock.now += 30  # the evidence TTL (the stated bound on serving a withdrawn attestation) has run out
    assert _allowed(reviewer, body)[0] is False


def test_a_dry_run_does_not_record_a_revision(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes], opens: list[str]
) -> None:
    digest, bundle = signed_model
    _store, filed, reviewer, body = _filed_and_reviewed(tmp_path, key_dir, signed_model)
    assert _allowed(reviewer, body)[:2] == (True, False)
    Path(filed.source).write_bytes(bundle)  # the same bytes rewritten: a new token, the same bundles
    _settle()
    dry = json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{digest}", dry_run=True)).encode()
    assert _allowed(reviewer, dry)[:2] == (True, True)  # reused by the bundles' fingerprint
    opens.clear()
    assert _allowed(reviewer, body)[:2] == (True, True)
    assert [p for p in opens if p.endswith(".sig")]  # the dry run recorded nothing: the bundles are read
    opens.clear()
    assert _allowed(reviewer, body)[:2] == (True, True)
    assert not [p for p in opens if p.endswith(".sig")]  # this decision recorded the new token


def test_the_event_loops_cached_answer_sees_another_writers_withdrawal(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes], opens: list[str]
) -> None:
    # `decide_cached` is what the server answers on its event loop: the same revision check, never stale.
    digest, _bundle = signed_model
    store, filed, reviewer, body = _filed_and_reviewed(tmp_path, key_dir, signed_model)
    assert reviewer.decide_cached(reviewer.parse(body)) is None  # nothing cached yet: read by `decide`
    assert len(reviewer.cache) == 0
    assert _allowed(reviewer, body)[:2] == (True, False)
    opens.clear()
    decision = reviewer.decide_cached(reviewer.parse(body))
    assert decision is not None and decision.response["response"]["allowed"] is True
    assert decision.references[0].cached
    assert [p for p in opens if p.startswith(str(store))] == [str(store / "sha256" / digest)]

    DirectoryStore(store).supersede(digest, filed.id)  # another writer withdraws the bundle
    _settle()
    opens.clear()
    assert reviewer.decide_cached(reviewer.parse(body)) is None
    assert not [p for p in opens if p.endswith(".sig")]  # no bundle read on the event loop
    assert _allowed(reviewer, body) == (False, False, "attestation")


def test_the_event_loop_asks_no_sqlite_store(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes]
) -> None:
    digest, bundle = signed_model
    store = SqliteAttestationStore(tmp_path / "store.db")
    store.put(bundle)
    reviewer = Reviewer(_policies(key_dir), store, WebhookConfig(cache_ttl_seconds=60))
    body = _body(digest)
    assert _allowed(reviewer, body)[:2] == (True, False)
    queries: list[str] = []
    store._db.set_trace_callback(queries.append)
    assert reviewer.decide_cached(reviewer.parse(body)) is None  # a query waits: a worker's job
    assert queries == []


async def _post(app: Any, body: bytes) -> dict[str, Any]:
    """One POST /validate through the ASGI application, as uvicorn hands it over; the AdmissionReview."""
    _, raw = await asgi_post(app, "/validate", body)
    answer: dict[str, Any] = json.loads(raw)
    return answer


def test_a_cached_decision_is_not_queued_behind_a_busy_worker(
    tmp_path: Path, key_dir: Path, signed_model: tuple[str, bytes]
) -> None:
    # The server answers a cached decision itself: an uncached one that holds the only worker (here, a
    # registry that does not answer) does not delay it, and the slow one still gets its own verdict.
    pytest.importorskip("starlette")
    from modelsec.webhook.server import create_app

    digest, bundle = signed_model
    DirectoryStore(tmp_path / "store").put(bundle)
    _settle()
    in_worker, release = threading.Event(), threading.Event()

    def bindings(raw: str, policy: object) -> set[str]:  # the registry, slow to answer
        in_worker.set()
        release.wait(10)
        return set()

    config = WebhookConfig(cache_ttl_seconds=60, deadline_seconds=5)
    reviewer = Reviewer(_policies(key_dir), DirectoryStore(tmp_path / "store"), config, bindings=bindings)
    assert _allowed(reviewer, _body(digest))[:2] == (True, False)
    app = create_app(reviewer, workers=1)
    unsigned = json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{'e' * 64}", uid="slow")).encode()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], float]:
        slow = asyncio.ensure_future(_post(app, unsigned))
        for _ in range(500):
            if in_worker.is_set():
                break
            await asyncio.sleep(0.01)
        assert in_worker.is_set(), "the uncached decision never asked the registry"
        started = time.monotonic()
        cached = await _post(app, _body(digest))
        took = time.monotonic() - started
        release.set()
        return cached, await slow, took

    cached, slow, took = asyncio.run(scenario())
    assert cached["response"]["allowed"] is True
    assert cached["response"]["auditAnnotations"]["reason"] == "verified"
    assert took < 2  # not after the worker (released only now) and not at the 5 s deadline
    assert slow["response"]["allowed"] is False
    assert slow["response"]["uid"] == "slow"
