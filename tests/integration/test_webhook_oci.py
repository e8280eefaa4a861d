"""The webhook admits an OCI model image by its manifest digest through a signed binding (real registry).

`modelsec push` attaches a binding, signed with a `weights` key, from the model root digest to the OCI
manifest digest; a workload naming the image by that manifest digest is verified through it. What the
binding does not vouch for, and a registry or store that cannot be read, is denied.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.distribution.push_pull import bound_root_digests
from modelsec.policy import Policy
from modelsec.verifier.stores import open_store
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.support.oci import Registry
from tests.support.oci_models import models_policies, push_tiny_model, registry_options
from tests.unit.webhook.test_review import FakeClock, answer, review_body

pytestmark = pytest.mark.integration


def _image_pod(image: str) -> dict[str, Any]:
    """A Pod whose container image is the model (a modelcar), with no annotation."""
    body = review_body("Pod")
    body = copy.deepcopy(body)
    body["request"]["object"]["spec"]["containers"][0]["image"] = image
    return body


def _resolver(registry: Registry) -> Any:
    options = registry_options(registry)
    return lambda reference, policy: bound_root_digests(reference, policy, options=options)


def test_oci_image_admitted_by_manifest_digest_through_a_signed_binding(
    tmp_path: Path, key_dir: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pushed = push_tiny_model(tmp_path, key_dir, registry, "admitted")
    for name, value in registry.env().items():
        monkeypatch.setenv(name, value)
    store = open_store(f"oci://{registry.address}/models/admitted")  # the evidence lives in the registry
    image = f"{registry.address}/models/admitted@{pushed.manifest_digest}"
    policies = models_policies(registry, key_dir)

    # Without the binding lookup the manifest digest is not a model root digest: nothing is filed for it.
    plain = Reviewer(policies, store, WebhookConfig(), clock=FakeClock())
    denied = answer(plain, _image_pod(image))
    assert denied["allowed"] is False and "no weights signature" in denied["status"]["message"]

    reviewer = Reviewer(
        policies, store, WebhookConfig(cache_ttl_seconds=60), clock=FakeClock(), bindings=_resolver(registry)
    )
    decision = reviewer.review(json.dumps(_image_pod(image)).encode())
    assert decision.allowed, decision.messages
    (result,) = decision.references
    assert f"signed binding to model root digest {pushed.root_digest}" in result.detail
    again = reviewer.review(json.dumps(_image_pod(image)).encode())
    assert again.allowed and again.references[0].cached  # the registry still confirms the binding
    # The same digest through the annotation, and the root digest itself, are admitted as well.
    assert answer(reviewer, review_body("Pod", f"oci://{image}"))["allowed"] is True
    by_root = f"oci://{registry.address}/models/admitted@sha256:{pushed.root_digest}"
    assert answer(reviewer, review_body("Pod", by_root))["allowed"] is True

    # A policy whose keys did not sign the binding: no trusted binding, denied (and so says the message).
    stranger = Reviewer(
        models_policies(registry, key_dir, "other.pub.pem"),
        store,
        WebhookConfig(),
        bindings=_resolver(registry),
    )
    refused = answer(stranger, _image_pod(image))
    assert refused["allowed"] is False
    assert "no binding signed by a trusted key names this OCI manifest" in refused["status"]["message"]
    # A digest the registry does not hold (another, unbound manifest): denied, naming why.
    unknown = answer(reviewer, _image_pod(f"{registry.address}/models/admitted@sha256:{'ab' * 32}"))
    assert unknown["allowed"] is False and "no signed binding read" in unknown["status"]["message"]


def test_registry_or_store_outage_denies_even_a_cached_model(
    tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    """Fail closed: the evidence in a directory store, the binding in a registry that goes away."""
    model, pushed = push_tiny_model(tmp_path, key_dir, registry, "outage")
    store_dir = tmp_path / "store"
    from modelsec.verifier.attestations import store_bundle

    store_bundle(store_dir, (model / "model.sig").read_bytes())
    policies = models_policies(registry, key_dir)
    image = f"{registry.address}/models/outage@{pushed.manifest_digest}"
    clock = FakeClock()
    up = {"registry": True}

    def resolver(reference: str, policy: Policy) -> set[str]:
        options = registry_options(registry)
        if not up["registry"]:  # the same client, pointed where nothing listens (discard port)
            reference = reference.replace(registry.address, "127.0.0.1:9")
        return bound_root_digests(reference, policy, options=options)

    reviewer = Reviewer(
        policies,
        DirectoryStore(store_dir),
        # Registry answers are not reused (evidence TTL 0), so every decision reaches the registry.
        WebhookConfig(cache_ttl_seconds=600, evidence_ttl_seconds=0, evidence_negative_ttl_seconds=0),
        clock=clock,
        bindings=resolver,
    )
    assert answer(reviewer, _image_pod(image))["allowed"] is True
    assert reviewer.review(json.dumps(_image_pod(image)).encode()).references[0].cached

    up["registry"] = False
    clock.now += 1  # well inside the TTL
    decision = reviewer.review(json.dumps(_image_pod(image)).encode())
    assert not decision.allowed and decision.reason == "registry-unavailable", decision.messages

    up["registry"] = True
    assert answer(reviewer, _image_pod(image))["allowed"] is True
    reviewer.store = DirectoryStore(tmp_path / "gone")  # the store volume is gone
    decision = reviewer.review(json.dumps(_image_pod(image)).encode())
    assert not decision.allowed and decision.reason == "store-unavailable", decision.messages
