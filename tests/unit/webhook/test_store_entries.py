"""The webhook reads the store's entries: why a bundle was not read reaches the deny message."""

from __future__ import annotations

import os
from pathlib import Path

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file
from modelsec.verifier.attestations import GATE_PREDICATE_TYPE, store_bundle
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.unit.verifier.test_joint_verification import gate_predicate
from tests.unit.webhook.test_review import REGISTRY, FakeClock, answer, policies, review_body, signed

__all__ = ["policies", "signed"]  # module fixtures shared with test_review


def test_bundles_the_store_did_not_read_are_named_in_the_deny(
    policies: PolicySet, signed: tuple[str, Path], key_dir: Path, tmp_path: Path
) -> None:
    digest, source = signed
    store = tmp_path / "store"
    (weights,) = [store_bundle(store, b.read_bytes()) for b in source.rglob("*.sig")]
    os.utime(weights, (1_000_000, 1_000_000))  # the oldest: a store reading the newest two skips it
    stranger = load_private_key_file(key_dir / "other.key.pem")
    for seed in (1, 2):
        statement = Statement(
            (Subject("m", {"sha256": digest}),),
            GATE_PREDICATE_TYPE,
            gate_predicate(**{"parameters.seed": seed}),
        )
        store_bundle(store, sign_statement(statement, stranger))
    body = review_body("Pod", f"{REGISTRY}/x@sha256:{digest}")

    capped = Reviewer(policies, DirectoryStore(store, max_bundles=2), WebhookConfig(), clock=FakeClock())
    denied = answer(capped, body)
    assert denied["allowed"] is False
    message = denied["status"]["message"]
    assert "no weights signature" in message
    assert f"{weights}: not read: the store holds more bundles for {digest} than it reads" in message

    whole = Reviewer(policies, DirectoryStore(store), WebhookConfig(), clock=FakeClock())
    assert answer(whole, body)["allowed"] is True
