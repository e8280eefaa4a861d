"""The positive cache never outlives what the store says: re-confirmed on every decision, outages deny.

Before: a cached positive result was reused for its whole TTL without reading the store, so a store outage
or a withdrawn bundle went unseen for up to `cache_ttl_seconds`, although the docs say an outage denies.
Now the store is read on every decision; a cached result is reused only for the same bundles; an outage
denies unless the operator chose `cache_on_outage: serve`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.attestations import store_bundle
from modelsec.webhook.review import CacheOnOutage, DirectoryStore, Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.unit.webhook.test_review import REGISTRY, FakeClock, review_body


@pytest.fixture(scope="module")
def signed_model(key_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    root = tmp_path_factory.mktemp("cache-outage")
    model = write_tiny_model(root / "model", shards=1)
    result = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return result.root_digest, (model / "model.sig").read_bytes()


@pytest.fixture(scope="module")
def policies(key_dir: Path) -> PolicySet:
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [{"name": "internal", "match": [f"{REGISTRY}/**"], "keys": ["ecdsa-p256.pub.pem"]}],
        "noMatch": "deny",
    }
    return PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy")


def _setup(
    tmp_path: Path, policies: PolicySet, signed_model: tuple[str, bytes], **config: object
) -> tuple[Reviewer, Path, FakeClock, bytes]:
    digest, bundle = signed_model
    store = tmp_path / "store"
    store_bundle(store, bundle)
    clock = FakeClock()
    reviewer = Reviewer(
        policies,
        DirectoryStore(store),
        WebhookConfig(cache_ttl_seconds=60, **config),
        clock=clock,  # type: ignore[arg-type]
    )
    body = json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{digest}")).encode()
    first = reviewer.review(body)
    assert first.response["response"]["allowed"] is True and first.references[0].cached is False
    second = reviewer.review(body)
    assert second.response["response"]["allowed"] is True and second.references[0].cached is True
    return reviewer, store, clock, body


def _outage(store: Path) -> None:
    shutil.rmtree(store)
    store.write_text("the volume is gone")  # neither a directory nor missing-and-empty: an outage


def test_an_outage_denies_a_cached_model_by_default(
    tmp_path: Path, policies: PolicySet, signed_model: tuple[str, bytes]
) -> None:
    reviewer, store, clock, body = _setup(tmp_path, policies, signed_model)
    assert reviewer.config.cache_on_outage is CacheOnOutage.DENY
    _outage(store)
    clock.now += 1  # well inside the TTL
    decision = reviewer.review(body)
    assert decision.response["response"]["allowed"] is False and decision.reason == "store-unavailable"


def test_a_withdrawn_bundle_denies_inside_the_ttl(
    tmp_path: Path, policies: PolicySet, signed_model: tuple[str, bytes]
) -> None:
    reviewer, store, clock, body = _setup(tmp_path, policies, signed_model)
    for sig in store.rglob("*.sig"):
        sig.unlink()  # the operator withdraws the model's bundle
    clock.now += 1
    decision = reviewer.review(body)
    assert decision.response["response"]["allowed"] is False and decision.reason == "attestation"
    assert len(reviewer.cache) == 0  # and the stale positive is forgotten, for `serve` as well


def test_serve_reuses_an_unexpired_result_during_an_outage_and_says_so(
    tmp_path: Path, policies: PolicySet, signed_model: tuple[str, bytes]
) -> None:
    reviewer, store, clock, body = _setup(
        tmp_path, policies, signed_model, cache_on_outage=CacheOnOutage.SERVE
    )
    _outage(store)
    clock.now += 30
    decision = reviewer.review(body)
    assert decision.response["response"]["allowed"] is True and decision.references[0].cached is True
    assert "store is unavailable" in decision.references[0].detail
    clock.now += 31  # the TTL ran out: the outage denies again
    decision = reviewer.review(body)
    assert decision.response["response"]["allowed"] is False and decision.reason == "store-unavailable"


def test_serve_does_not_resurrect_a_withdrawal_seen_before_the_outage(
    tmp_path: Path, policies: PolicySet, signed_model: tuple[str, bytes]
) -> None:
    reviewer, store, _, body = _setup(tmp_path, policies, signed_model, cache_on_outage=CacheOnOutage.SERVE)
    for sig in store.rglob("*.sig"):
        sig.unlink()
    assert reviewer.review(body).response["response"]["allowed"] is False
    _outage(store)
    assert reviewer.review(body).response["response"]["allowed"] is False


def test_a_changed_bundle_set_means_a_full_verification(
    tmp_path: Path, policies: PolicySet, signed_model: tuple[str, bytes]
) -> None:
    reviewer, store, _, body = _setup(tmp_path, policies, signed_model)
    digest_dir = next(p for p in store.rglob("*") if p.is_dir() and p.name == signed_model[0])
    shutil.copy(next(digest_dir.glob("*.sig")), digest_dir / "copy.sig")
    decision = reviewer.review(body)
    assert decision.response["response"]["allowed"] is True and decision.references[0].cached is False
