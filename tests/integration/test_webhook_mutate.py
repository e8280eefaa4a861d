"""The mutating webhook resolves tags in a real registry, pins the digest and hands it to the guard.

A model signed and pushed by tag (`push_model`, the real CNCF registry with TLS and htpasswd); a Pod naming
it by that tag is patched to the manifest digest the registry holds, `MODELSEC_MODEL_DIGEST` (the bound
model root digest) and `MODELSEC_POLICY` (the policy's `guardPolicy`) are injected into its containers, the
patch is applied with `jsonpatch` (as the API server applies it), and the validating review of the patched
Pod verifies exactly that digest. Refusals: an unknown tag, a registry outage, a conflicting variable.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.distribution.push_pull import PushResult, bound_root_digests
from modelsec.policy import Policy, PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.pinning import parse_digest_pins
from modelsec.verifier.stores import open_store
from modelsec.webhook.mutate import SERVING_CONTAINERS_ANNOTATION, Mutation, Mutator, registry_resolver
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.support.oci import Registry
from tests.support.oci_models import push_tiny_model, registry_options

jsonpatch = pytest.importorskip("jsonpatch")

pytestmark = pytest.mark.integration

GUARD_POLICY = "/etc/modelsec/guard/policy.yaml"


def _policies(registry: Registry, key_dir: Path, repo: str) -> PolicySet:
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "models",
                "match": [f"oci://{registry.address}/models/{repo}", "oci://127.0.0.1:9/**"],
                "keys": ["ecdsa-p256.pub.pem"],
                "guardPolicy": GUARD_POLICY,
            }
        ],
    }
    return PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy")


@pytest.fixture(scope="module")
def pushed(
    tmp_path_factory: pytest.TempPathFactory, key_dir: Path, registry: Registry
) -> tuple[str, Path, PushResult]:
    """A signed model pushed as `models/mutate:v1` (evidence and binding attached as referrers)."""
    repo = "mutate"
    model, result = push_tiny_model(tmp_path_factory.mktemp("mutate"), key_dir, registry, repo, seed=28)
    return repo, model, result


@pytest.fixture(autouse=True)
def _oci_env(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `oci://` store reads its registry's TLS and credentials from the environment, as in a Pod."""
    for name, value in registry.env().items():
        monkeypatch.setenv(name, value)


def _webhooks(registry: Registry, key_dir: Path, repo: str) -> tuple[Reviewer, Mutator]:
    options = registry_options(registry)

    def bindings(reference: str, policy: Policy) -> set[str]:
        return bound_root_digests(reference, policy, options=options)

    store = open_store(f"oci://{registry.address}/models/{repo}")  # evidence read from the registry
    reviewer = Reviewer(_policies(registry, key_dir, repo), store, WebhookConfig(), bindings=bindings)
    return reviewer, Mutator(reviewer, registry_resolver(options))


def _pod(image: str, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod whose `server` container is the model image, with a sidecar and an init container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llm", "namespace": "ml", "annotations": annotations or {}},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox:1.36"}],
            "containers": [
                {"name": "server", "image": image, "env": [{"name": "PORT", "value": "8080"}]},
                {"name": "metrics", "image": "prom/statsd-exporter:v0.26.0"},
            ],
        },
    }


def _review(obj: dict[str, Any], uid: str = "uid-m") -> bytes:
    group, _, version = obj["apiVersion"].rpartition("/")
    gvk = {"group": group, "version": version, "kind": obj["kind"]}
    request = {
        "uid": uid,
        "kind": gvk,
        "requestKind": gvk,
        "name": obj["metadata"]["name"],
        "namespace": "ml",
        "operation": "CREATE",
        "object": obj,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _patched(mutation: Mutation, obj: dict[str, Any]) -> dict[str, Any]:
    """The object after the response's patch, applied as the API server applies it."""
    response = mutation.decision.response["response"]
    assert response["allowed"] is True, response
    if "patch" not in response:
        return copy.deepcopy(obj)
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    out: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return out


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.slow
def test_a_tag_is_pinned_to_the_registry_digest_and_handed_to_every_container(
    pushed: tuple[str, Path, PushResult], key_dir: Path, registry: Registry, tmp_path: Path, cli: Any
) -> None:
    repo, model, result = pushed
    reviewer, mutator = _webhooks(registry, key_dir, repo)
    tagged = f"{registry.address}/models/{repo}:v1"
    pod = _pod(tagged, annotations={"modelsec.dev/models": f"oci://{tagged}"})

    # Before the mutation, the validating webhook refuses the tag (it is mutable).
    assert reviewer.review(_review(pod)).allowed is False

    mutation = mutator.review(_review(pod))
    patched = _patched(mutation, pod)
    assert patched == mutation.patched
    pinned = f"{registry.address}/models/{repo}@{result.manifest_digest}"
    assert patched["spec"]["containers"][0]["image"] == pinned
    assert patched["metadata"]["annotations"]["modelsec.dev/models"] == f"oci://{pinned}"
    # Runtime images that no policy covers keep their tags.
    assert patched["spec"]["initContainers"][0]["image"] == "busybox:1.36"
    # The guard's pin is the model ROOT digest the signed binding names, in every (init) container.
    expected_pin = f"oci://{registry.address}/models/{repo}@sha256:{result.root_digest}"
    containers = patched["spec"]["initContainers"] + patched["spec"]["containers"]
    for container in containers:
        assert _env(container)["MODELSEC_MODEL_DIGEST"] == expected_pin
        assert _env(container)["MODELSEC_POLICY"] == GUARD_POLICY
    assert _env(patched["spec"]["containers"][0])["PORT"] == "8080"  # what was there is kept
    assert [p.digest for p in parse_digest_pins(expected_pin)] == [result.root_digest]

    # Reinvocation (reinvocationPolicy: IfNeeded) of the patched Pod changes nothing.
    again = mutator.review(_review(patched))
    assert again.decision.allowed and again.patch == ()
    assert "patch" not in again.decision.response["response"]

    # The validating review of the patched Pod verifies exactly that digest, through the signed binding.
    decision = reviewer.review(_review(patched))
    assert decision.allowed, decision.messages
    assert {r.reference for r in decision.references} == {f"oci://{pinned}"}
    for ref in decision.references:
        assert f"signed binding to model root digest {result.root_digest}" in ref.detail

    # The injected pin is what the loader and the guard read: this model passes, another signed one does not.
    env = {"MODELSEC_MODEL_DIGEST": _env(patched["spec"]["containers"][0])["MODELSEC_MODEL_DIGEST"]}
    trusted = str(key_dir / "ecdsa-p256.pub.pem")
    assert cli("verify", model, "--trusted-key", trusted, env=env).returncode == 0
    other = write_tiny_model(tmp_path / "other", shards=1, seed=29)
    sign_model(other, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    refused = cli("verify", other, "--trusted-key", trusted, env=env)
    assert refused.returncode == 1 and result.root_digest in refused.stderr


@pytest.mark.slow
def test_injection_is_limited_to_the_annotated_serving_containers(
    pushed: tuple[str, Path, PushResult], key_dir: Path, registry: Registry
) -> None:
    repo, _, result = pushed
    _, mutator = _webhooks(registry, key_dir, repo)
    tagged = f"{registry.address}/models/{repo}:v1"
    pod = _pod(tagged, annotations={SERVING_CONTAINERS_ANNOTATION: "server"})
    patched = _patched(mutator.review(_review(pod)), pod)
    server, metrics = patched["spec"]["containers"]
    assert _env(server)["MODELSEC_MODEL_DIGEST"].endswith(f"@sha256:{result.root_digest}")
    assert "MODELSEC_MODEL_DIGEST" not in _env(metrics)
    assert "env" not in patched["spec"]["initContainers"][0]

    # A name no container has would leave the real server unpinned: refused, nothing patched.
    typo = _pod(tagged, annotations={SERVING_CONTAINERS_ANNOTATION: "serverr"})
    mutation = mutator.review(_review(typo))
    assert mutation.decision.allowed is False and mutation.decision.reason == "serving-containers"
    assert "serverr" in mutation.decision.response["response"]["status"]["message"]
    assert "patch" not in mutation.decision.response["response"]


@pytest.mark.slow
@pytest.mark.parametrize("value", ["sha256:" + "ab" * 32, None], ids=["other-digest", "valueFrom"])
def test_a_variable_already_set_otherwise_is_refused_never_overwritten(
    pushed: tuple[str, Path, PushResult], key_dir: Path, registry: Registry, value: str | None
) -> None:
    repo, _, _ = pushed
    _, mutator = _webhooks(registry, key_dir, repo)
    pod = _pod(f"{registry.address}/models/{repo}:v1")
    entry: dict[str, Any] = {"name": "MODELSEC_MODEL_DIGEST"}
    entry.update({"value": value} if value else {"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    pod["spec"]["containers"][1]["env"] = [entry]
    mutation = mutator.review(_review(pod))
    response = mutation.decision.response["response"]
    assert response["allowed"] is False and mutation.decision.reason == "env-conflict"
    assert (
        "containers[1]" in response["status"]["message"]
        and "MODELSEC_MODEL_DIGEST" in response["status"]["message"]
    )
    assert "patch" not in response and mutation.patch == ()


@pytest.mark.slow
def test_an_unknown_tag_or_a_registry_outage_denies(
    pushed: tuple[str, Path, PushResult], key_dir: Path, registry: Registry
) -> None:
    repo, _, _ = pushed
    _, mutator = _webhooks(registry, key_dir, repo)
    unknown = mutator.review(_review(_pod(f"{registry.address}/models/{repo}:no-such-tag")))
    assert unknown.decision.allowed is False and unknown.decision.reason == "tag-unresolved"
    assert "no-such-tag" in unknown.decision.response["response"]["status"]["message"]
    # A covered registry where nothing listens (the discard port): fail closed, and the answer says why.
    down = mutator.review(_review(_pod("127.0.0.1:9/models/llm:v1")))
    assert down.decision.allowed is False and down.decision.reason == "registry-unavailable"
    assert "registry cannot be read" in down.decision.response["response"]["status"]["message"]
    assert down.patch == () and "patch" not in down.decision.response["response"]


def _policy_file(tmp_path: Path, registry: Registry, key_dir: Path, repo: str) -> Path:
    import shutil

    shutil.copy(key_dir / "ecdsa-p256.pub.pem", tmp_path / "ci.pub.pem")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: models\n    match: ['oci://{registry.address}/models/{repo}']\n"
        f"    keys: [ci.pub.pem]\n    guardPolicy: {GUARD_POLICY}\n"
    )
    return policy


@pytest.mark.slow
def test_policy_test_prints_each_objects_patch_and_verdict_without_a_cluster(
    pushed: tuple[str, Path, PushResult], key_dir: Path, registry: Registry, tmp_path: Path, cli: Any
) -> None:
    import yaml

    repo, _, result = pushed
    policy = _policy_file(tmp_path, registry, key_dir, repo)
    good = _pod(f"{registry.address}/models/{repo}:v1")
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "stale"},
        "spec": {
            "template": {"metadata": {}, "spec": _pod(f"{registry.address}/models/{repo}:gone")["spec"]}
        },
    }
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "b"}}
    workloads = tmp_path / "workloads.yaml"
    workloads.write_text(yaml.safe_dump_all([good, bad, other]))
    store = f"oci://{registry.address}/models/{repo}"
    args = ("policy", "test", policy, "-f", workloads, "--store", store, "--registry-ca", registry.ca)

    out = cli(*args, "--json")
    assert out.returncode == 1, out.stderr  # the Deployment is denied
    doc = json.loads(out.stdout)
    assert (doc["ok"], doc["admitted"], doc["denied"], doc["skipped"]) == (False, 1, 1, 1)
    pod, deployment, configmap = doc["results"]
    assert pod["admitted"] is True and pod["mutation"]["reason"] == "mutated"
    ops = {(op["op"], op["path"]): op["value"] for op in pod["mutation"]["patch"]}
    pinned = f"{registry.address}/models/{repo}@{result.manifest_digest}"
    assert ops[("replace", "/spec/containers/0/image")] == pinned
    assert pod["mutation"]["pin"] == f"oci://{registry.address}/models/{repo}@sha256:{result.root_digest}"
    assert pod["validation"]["allowed"] is True
    assert [r["reference"] for r in pod["validation"]["references"]] == [f"oci://{pinned}"]
    assert deployment["admitted"] is False and deployment["validation"] is None
    assert deployment["mutation"]["reason"] == "tag-unresolved" and deployment["namespace"] == "default"
    assert configmap["admitted"] is None

    # Text, and only admitted objects: exit 0.
    workloads.write_text(yaml.safe_dump_all([good]))
    text = cli(*args)
    assert text.returncode == 0, text.stderr
    assert "admitted" in text.stdout and f'replace /spec/containers/0/image "{pinned}"' in text.stdout

    # A workload file that is not YAML is a usage error (2), not a verdict.
    workloads.write_text("a: [\n")
    assert cli(*args).returncode == 2


def _inference_service(storage_uri: str) -> dict[str, Any]:
    """An InferenceService whose predictor reads `storage_uri` (`modelsec+oci://` routes to modelsec)."""
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {
            "predictor": {
                "model": {"modelFormat": {"name": "huggingface"}, "storageUri": storage_uri},
            }
        },
    }


@pytest.mark.slow
def test_the_storage_initializer_scheme_is_pinned_and_verified_as_an_oci_reference(
    pushed: tuple[str, Path, PushResult], key_dir: Path, registry: Registry
) -> None:
    """Issue 28.2/28.3: `modelsec+oci://repo:tag` is pinned in its own scheme, verified from the registry."""
    repo, _, result = pushed
    options = registry_options(registry)
    policies = _policies(registry, key_dir, repo)

    def bindings(reference: str, policy: Policy) -> set[str]:
        return bound_root_digests(reference, policy, options=options)

    # As `modelsec webhook serve` builds it: no store of its own, the evidence read from the registry.
    reviewer = Reviewer(policies, None, WebhookConfig(), bindings=bindings, registry=options)
    mutator = Mutator(reviewer, registry_resolver(options))
    name = f"{registry.address}/models/{repo}"
    isvc = _inference_service(f"modelsec+oci://{name}:v1")
    assert reviewer.review(_review(isvc)).allowed is False  # a tag is mutable: refused until pinned

    mutation = mutator.review(_review(isvc))
    patched = _patched(mutation, isvc)
    model = patched["spec"]["predictor"]["model"]
    # The scheme is kept, so KServe still hands the URI to modelsec's storage initializer.
    assert model["storageUri"] == f"modelsec+oci://{name}@{result.manifest_digest}"
    assert _env(model)["MODELSEC_MODEL_DIGEST"] == f"oci://{name}@sha256:{result.root_digest}"
    assert mutator.review(_review(patched)).patch == ()  # reinvocation: nothing more

    decision = reviewer.review(_review(patched))
    assert decision.allowed, decision.messages
    (ref,) = decision.references
    assert ref.reference == model["storageUri"] and ref.policy == "models"
    assert f"signed binding to model root digest {result.root_digest}" in ref.detail

    # Verified, not waved through: under a key that signed nothing here, the same object is refused.
    untrusted = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [{"name": "models", "match": [f"oci://{name}"], "keys": ["other.pub.pem"]}],
        },
        base_dir=key_dir,
        source="untrusted-policy",
    )
    refused = Reviewer(untrusted, None, WebhookConfig(), bindings=bindings, registry=options)
    decision = refused.review(_review(patched))
    assert decision.allowed is False and decision.reason == "attestation", decision.messages
