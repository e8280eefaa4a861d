"""A withdrawal made by another process after a cached decision is seen on the next decision (issue 32).

The webhook's cache reuses a positive result while the store's change token (`AttestationStore.revision`)
is unchanged, without reading the bundles. The process is what is under test here: the withdrawal is made
by a separate interpreter (`supersede` through the store's own class), so the token must come from the
store itself (the file system, the SQLite file, the PostgreSQL server), not from this process's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import modelsec.verifier.stores.directory as directory_module
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.stores import AttestationStore
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.verifier.stores.records import open_record_store
from modelsec.verifier.stores.sqlite import SqliteAttestationStore
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model

REGISTRY = "oci://registry.internal/models"
_SETTLE_NS = 50_000_000  # the directory store's settle time, shortened in this (the reading) process

_SUPERSEDE = """
import os
import sys
from pathlib import Path
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.verifier.stores.records import open_record_store
from modelsec.verifier.stores.records import open_record_store
from modelsec.verifier.stores.sqlite import SqliteAttestationStore
kind, path, digest, bundle_id = sys.argv[1:]
if kind == "directory":
    store = DirectoryStore(Path(path))
elif kind == "sqlite":
    store = SqliteAttestationStore(Path(path))
else:
    store = open_record_store(path, password=os.environ["STORE_PASSWORD"])
store.supersede(digest, bundle_id)
"""


def _body(digest: str) -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "annotations": {"modelsec.dev/models": f"{REGISTRY}/x@sha256:{digest}"},
        },
        "spec": {"containers": [{"name": "c", "image": "runtime:1"}]},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": pod,
        },
    }
    return json.dumps(review).encode()


@pytest.mark.parametrize("kind", ["directory", "sqlite", "postgresql"])
def test_another_process_withdrawal_is_seen_on_the_next_cached_decision(
    kind: str,
    tmp_path: Path,
    key_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    monkeypatch.setattr(directory_module, "_SETTLE_NS", _SETTLE_NS, raising=False)
    model = write_tiny_model(tmp_path / "model", shards=1)
    digest = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]).root_digest
    env = dict(os.environ)
    store: AttestationStore
    if kind == "postgresql":
        server = request.getfixturevalue("postgres")
        path = server.new_database()
        env["STORE_PASSWORD"] = server.password
        store = open_record_store(path, password=server.password)
    else:
        path = str(tmp_path / ("store" if kind == "directory" else "store.db"))
        store = DirectoryStore(Path(path)) if kind == "directory" else SqliteAttestationStore(Path(path))
    filed, _ = store.put((model / "model.sig").read_bytes())
    if kind == "directory":
        time.sleep(2 * _SETTLE_NS / 1e9)  # past the settle time: the token vouches for the listing
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [{"name": "internal", "match": [f"{REGISTRY}/**"], "keys": ["ecdsa-p256.pub.pem"]}],
        "noMatch": "deny",
    }
    reviewer = Reviewer(
        PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy"),
        store,
        WebhookConfig(cache_ttl_seconds=600),
    )
    body = _body(digest)
    assert reviewer.review(body).allowed
    queries: list[str] = []
    if kind == "postgresql":  # every read of the store goes through `_query`: count them, then run them
        query = store._query  # type: ignore[attr-defined]

        def counted(sql: str, args: tuple[object, ...]) -> object:
            queries.append(sql)
            return query(sql, args)

        monkeypatch.setattr(store, "_query", counted)
    cached = reviewer.review(body)
    assert cached.allowed and cached.references[0].cached
    if kind == "postgresql":
        assert queries == ["SELECT generation FROM modelsec_generation"]  # one query, no bundle read
    assert store.revision(digest) is not None  # the cached decision was served by the token

    subprocess.run([sys.executable, "-c", _SUPERSEDE, kind, path, digest, filed.id], env=env, check=True)
    if kind == "directory":
        time.sleep(2 * _SETTLE_NS / 1e9)  # seen by its token, not only because the listing is fresh
    decision = reviewer.review(body)
    assert not decision.allowed and decision.reason == "attestation"
    assert not decision.references[0].cached
