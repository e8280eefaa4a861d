"""Evidence lives with the model: the webhook and `pull` read it from the artifact's own registry.

A model that `modelsec push` signed and pushed to the real registry (Debian `docker-registry` 2.8, TLS and
htpasswd: the tag-schema fallback of the referrers API) is admitted by a webhook whose own store is empty;
what the registry does not vouch for is denied; a registry that cannot be reached is a deny that says so; the
registry-evidence cache serves within its TTL and sees a withdrawn referrer after it; and a policy's
`attestationStore` is read by `pull` as by every other front door.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.distribution.push_pull import bound_root_digests, pull_model, push_model
from modelsec.errors import AttestationError
from modelsec.policy import Policy, PolicySet
from modelsec.registry.client import RegistryOptions
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.attestations import GATE_PREDICATE_TYPE, store_bundle
from modelsec.verifier.stores import evidence_stores
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.verifier.stores.oci import OciAttestationStore
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.support.oci import Registry
from tests.support.oci_models import models_policies, push_tiny_model, registry_options
from tests.support.pki import TestCA
from tests.unit.verifier.test_joint_verification import gate_predicate
from tests.unit.webhook.test_review import FakeClock, answer, review_body

pytestmark = pytest.mark.integration


def _reviewer(
    policies: PolicySet,
    options: RegistryOptions,
    store: Any = None,
    clock: FakeClock | None = None,
    **config: Any,
) -> Reviewer:
    """A reviewer as `modelsec webhook serve` builds it: evidence and bindings read with `options`."""
    return Reviewer(
        policies,
        store,
        WebhookConfig(**config),
        clock=clock or FakeClock(),
        bindings=lambda reference, policy: bound_root_digests(reference, policy, options=options),
        registry=options,
    )


def _image_pod(image: str) -> dict[str, Any]:
    """A Pod whose container image is the model (a modelcar), with no annotation."""
    body = copy.deepcopy(review_body("Pod"))
    body["request"]["object"]["spec"]["containers"][0]["image"] = image
    return body


def test_an_empty_store_admits_a_pushed_model_from_its_referrers(
    tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    pushed = push_tiny_model(tmp_path, key_dir, registry, "evidence-admitted")[1]
    empty = tmp_path / "empty-store"
    empty.mkdir()
    policies = models_policies(registry, key_dir)
    image = f"{registry.address}/models/evidence-admitted@{pushed.manifest_digest}"
    by_root = f"oci://{registry.address}/models/evidence-admitted@sha256:{pushed.root_digest}"
    for store in (DirectoryStore(empty), None):  # an empty --store, and none at all
        reviewer = _reviewer(policies, registry_options(registry), store)
        # By the manifest digest (a model image, and the annotation), and by the model root digest.
        for body in (_image_pod(image), review_body("Pod", f"oci://{image}"), review_body("Pod", by_root)):
            decision = reviewer.review(json.dumps(body).encode())
            assert decision.allowed and decision.reason == "verified", decision.messages
    # The resolution every front door shares: the artifact's own repository, unless a policy names a store.
    own = f"oci://{registry.address}/models/evidence-admitted"
    assert evidence_stores(by_root, policies.policies[0]) == (own,)


def test_a_model_no_trusted_key_signed_is_denied(tmp_path: Path, key_dir: Path, registry: Registry) -> None:
    pushed = push_tiny_model(tmp_path, key_dir, registry, "evidence-untrusted")[1]
    stranger = _reviewer(models_policies(registry, key_dir, "other.pub.pem"), registry_options(registry))
    image = f"{registry.address}/models/evidence-untrusted@{pushed.manifest_digest}"
    by_root = f"oci://{registry.address}/models/evidence-untrusted@sha256:{pushed.root_digest}"
    for body in (_image_pod(image), review_body("Pod", by_root)):
        decision = stranger.review(json.dumps(body).encode())
        assert not decision.allowed and decision.reason == "attestation", decision.messages
        assert decision.response["response"]["allowed"] is False


def test_an_unreachable_registry_denies_and_says_so(
    tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    pushed = push_tiny_model(tmp_path, key_dir, registry, "evidence-outage")[1]
    policies = models_policies(registry, key_dir)
    by_root = f"oci://{registry.address}/models/evidence-outage@sha256:{pushed.root_digest}"
    # A webhook configured with another CA than the one that issued the registry's certificate.
    wrong_ca = TestCA.create(tmp_path / "wrong-ca").path
    decision = _reviewer(policies, registry_options(registry, ca=wrong_ca)).review(
        json.dumps(review_body("Pod", by_root)).encode()
    )
    assert not decision.allowed and decision.reason == "registry-unavailable", decision.messages
    (message,) = decision.messages
    assert f"registry {registry.address} could not be reached" in message
    assert decision.response["response"]["status"]["message"].startswith("modelsec: model oci://")

    # A model in a registry where nothing listens (the discard port, closed on loopback).
    closed = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [{"name": "m", "match": ["oci://127.0.0.1:9/**"], "keys": ["ecdsa-p256.pub.pem"]}],
        },
        base_dir=key_dir,
        source="test-policy",
    )
    reviewer = _reviewer(closed, registry_options(registry))
    reference = f"oci://127.0.0.1:9/models/m@sha256:{pushed.root_digest}"
    decision = reviewer.review(json.dumps(review_body("Pod", reference)).encode())
    assert not decision.allowed and decision.reason == "registry-unavailable", decision.messages
    assert "registry 127.0.0.1:9 could not be reached" in decision.messages[0]
    # An outage is never cached: the next decision asks the registry again, and is denied again.
    again = reviewer.review(json.dumps(review_body("Pod", reference)).encode())
    assert not again.allowed and again.reason == "registry-unavailable"


def test_the_cache_serves_within_its_ttl_and_sees_a_withdrawal_after_it(
    tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    pushed = push_tiny_model(tmp_path, key_dir, registry, "evidence-withdrawn")[1]
    options = registry_options(registry)
    clock = FakeClock()
    reviewer = _reviewer(
        models_policies(registry, key_dir),
        options,
        clock=clock,
        evidence_ttl_seconds=30,
        cache_ttl_seconds=600,
    )
    image = f"{registry.address}/models/evidence-withdrawn@{pushed.manifest_digest}"
    assert answer(reviewer, _image_pod(image))["allowed"] is True
    assert reviewer.review(json.dumps(_image_pod(image)).encode()).references[0].cached

    # The weights signature is withdrawn from the registry (its referrer deleted).
    store = OciAttestationStore.open(  # the test registry's CA and credentials, not the environment's
        f"{registry.address}/models/evidence-withdrawn",
        max_bundle_bytes=2**24,
        max_bundles=64,
        options=options,
    )
    (signature,) = store.entries(pushed.root_digest)
    store.delete(pushed.root_digest, signature.id)

    clock.now += 29  # inside the TTL: what the registry answered is still served (the stated bound)
    assert answer(reviewer, _image_pod(image))["allowed"] is True
    clock.now += 2  # past it: the registry is read again, and the withdrawal is seen
    decision = reviewer.review(json.dumps(_image_pod(image)).encode())
    assert not decision.allowed and decision.reason == "attestation", decision.messages
    assert "no weights signature" in decision.messages[0]


def test_a_miss_is_cached_for_the_shorter_negative_ttl(
    tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    model = write_tiny_model(tmp_path / "late", shards=1)
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    root = sign_model(model, [signer]).root_digest
    clock = FakeClock()
    reviewer = _reviewer(
        models_policies(registry, key_dir),
        registry_options(registry),
        clock=clock,
        evidence_ttl_seconds=300,
        evidence_negative_ttl_seconds=5,
    )
    body = review_body("Pod", f"oci://{registry.address}/models/evidence-late@sha256:{root}")
    assert answer(reviewer, body)["allowed"] is False  # not pushed yet: a miss
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    push_model(
        model,
        f"oci://{registry.address}/models/evidence-late:v1",
        policy,
        signer,
        options=registry_options(registry),
    )
    clock.now += 4
    assert answer(reviewer, body)["allowed"] is False  # the miss is still cached
    clock.now += 2
    assert answer(reviewer, body)["allowed"] is True  # past the negative TTL, far inside the positive one


def test_pull_honours_the_policy_attestation_store(tmp_path: Path, key_dir: Path, registry: Registry) -> None:
    """The gate attestation the policy requires is in the policy's store, not among the referrers."""
    pushed = push_tiny_model(tmp_path, key_dir, registry, "evidence-policy-store")[1]
    store_dir = tmp_path / "policy-store"
    statement = Statement(
        (Subject("model", {"sha256": pushed.root_digest}),), GATE_PREDICATE_TYPE, gate_predicate()
    )
    store_bundle(store_dir, sign_statement(statement, load_private_key_file(key_dir / "ecdsa-p256.key.pem")))
    gate = {"robustness": {"minEps": 0.03, "minRobustAccuracy": 0.85}}
    reference = f"oci://{registry.address}/models/evidence-policy-store@{pushed.manifest_digest}"

    without = models_policies(registry, key_dir, attestations=gate)
    with pytest.raises(AttestationError):
        pull_model(reference, tmp_path / "refused", without.policies[0], options=registry_options(registry))
    assert not (tmp_path / "refused").exists()

    policies = models_policies(registry, key_dir, attestations=gate, attestationStore=str(store_dir))
    pulled = pull_model(
        reference, tmp_path / "pulled", policies.policies[0], options=registry_options(registry)
    )
    assert pulled.root_digest == pushed.root_digest and (tmp_path / "pulled" / "model.sig").is_file()
    # The webhook reads the same store for the same policy: admitted by the root digest with its gate.
    by_root = f"oci://{registry.address}/models/evidence-policy-store@sha256:{pushed.root_digest}"
    own = f"oci://{registry.address}/models/evidence-policy-store"
    assert evidence_stores(by_root, policies.policies[0]) == (str(store_dir), own)
    # The webhook reads the same stores under the same policy: the gate from the policy's store, the
    # signature from the registry; without the policy's store, the gate is missing.
    image = f"{registry.address}/models/evidence-policy-store@{pushed.manifest_digest}"
    for body in (_image_pod(image), review_body("Pod", by_root)):
        decision = _reviewer(policies, registry_options(registry)).review(json.dumps(body).encode())
        assert decision.allowed, decision.messages
        refused = _reviewer(without, registry_options(registry)).review(json.dumps(body).encode())
        assert not refused.allowed and "robustness" in refused.messages[0], refused.messages
