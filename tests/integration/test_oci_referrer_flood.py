"""A writer of the repository cannot veto a model by flooding its referrers (issue 27, item 7; DESIGN 13).

Someone with push rights only attaches 300 referrers of another artifact type and 300 valid-looking
sigstore bundles signed by an untrusted key to a signed model's manifest (the fallback index of a real
distribution 2.8 registry). `pull`, the `oci://` store and the webhook still admit the model: what is not
evidence is skipped unread, and past the budget referrers are listed unread, never refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from modelsec.distribution.push_pull import bound_root_digests, pull_model, push_model
from modelsec.policy import Policy, PolicySet
from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    RegistryOptions,
)
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_attestations
from modelsec.verifier.stores import StoreOptions, open_store
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry, flood_referrers
from tests.unit.webhook.test_review import FakeClock, answer, review_body

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JUNK = 300  # referrers of a foreign type: more than the 256 that pull and the webhook used to refuse past
UNTRUSTED = 40  # valid-looking bundles signed by an untrusted key (each is read: 2 requests)
STORE_BUDGET = 16  # the oci:// store's max_bundles here, so that the untrusted bundles overflow it


def test_junk_and_untrusted_referrers_cannot_veto_a_signed_model(
    tmp_path: Path, key_dir: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    model = write_tiny_model(tmp_path / "flood", shards=1, seed=27)
    sign_model(model, [signer])
    pushed = push_model(model, f"oci://{registry.address}/models/flood:v1", policy, signer, options=options)
    # The same model signed by a key no policy trusts: a valid-looking bundle about it.
    untrusted = shutil.copytree(model, tmp_path / "untrusted")
    sign_model(untrusted, [load_private_key_file(key_dir / "other.key.pem")], force=True)
    client = RegistryClient(registry.address, options)
    subject = {"mediaType": MANIFEST_MEDIA_TYPE, "digest": pushed.manifest_digest}
    subject["size"] = len(client.get_manifest("models/flood", pushed.manifest_digest)[0])
    junk = b'{"junk": true}'
    flood_referrers(client, "models/flood", subject, "application/vnd.example.junk.v1+json", junk, JUNK)
    bundle = (untrusted / "model.sig").read_bytes()
    flood_referrers(client, "models/flood", subject, BUNDLE_ARTIFACT_TYPE, bundle, UNTRUSTED)
    listed = client.referrers("models/flood", pushed.manifest_digest)
    assert len(listed) == JUNK + UNTRUSTED + len(pushed.referrers)

    # pull: the junk is skipped unread, the untrusted bundles are ignored, the model lands verified.
    reference = f"oci://{registry.address}/models/flood@{pushed.manifest_digest}"
    pulled = pull_model(reference, tmp_path / "pulled", policy, options=options)
    assert pulled.root_digest == pushed.root_digest and (tmp_path / "pulled" / "model.sig").is_file()
    assert any(f"{JUNK} referrers that are not evidence" in i for i in pulled.ignored)
    assert sum("no trusted key" in i or "untrusted" in i.lower() for i in pulled.ignored) >= UNTRUSTED

    # The oci:// store, past its budget: the rest is listed unread, and the trusted signature (attached
    # first) is still read and selected.
    for name, value in registry.env().items():
        monkeypatch.setenv(name, value)
    store = open_store(f"oci://{registry.address}/models/flood", StoreOptions(max_bundles=STORE_BUDGET))
    entries = store.entries(pushed.root_digest)
    unread = [e for e in entries if e.note]
    # every sigstore-bundle referrer counts: the binding is one too (sigstore's OCI layout)
    assert len(unread) == UNTRUSTED + len(pushed.referrers) - STORE_BUDGET
    assert all(f"not read: over the budget of {STORE_BUDGET} referrers" in e.note for e in unread)
    verdict = verify_attestations(pushed.root_digest, entries, policy, require_signatures=True)
    assert verdict.ok, verdict.reasons()

    # The webhook: the image by its manifest digest, through the binding and the store, is admitted.
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {"name": "m", "match": [f"oci://{registry.address}/models/**"], "keys": ["ecdsa-p256.pub.pem"]}
        ],
    }
    policies = PolicySet.from_mapping(doc, base_dir=key_dir, source="flood-policy")
    resolver = lambda ref, p: bound_root_digests(ref, p, options=options)  # noqa: E731
    reviewer = Reviewer(policies, store, WebhookConfig(), clock=FakeClock(), bindings=resolver)
    body = review_body("Pod")
    body["request"]["object"]["spec"]["containers"][0]["image"] = (
        f"{registry.address}/models/flood@{pushed.manifest_digest}"
    )
    out = answer(reviewer, body)
    assert out["allowed"] is True, out.get("status")
