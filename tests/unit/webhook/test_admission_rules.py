"""Table tests of the admission rules that make the webhook fit a cluster (issue 17).

Every matching policy must pass and each has its own mode; a reference no policy matches follows its
namespace's `noMatch`; model images in every container kind and image volume are checked, by digest only;
every KServe model source counts as a model source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.policy import PolicySet
from modelsec.webhook.review import DirectoryStore, Mode, Reviewer, WebhookConfig
from tests.support.stores import signed_model_store
from tests.unit.webhook.test_review import REGISTRY, UNSIGNED, FakeClock, review_body

MODELS = "registry.internal/models"
POD_IN_CRONJOB = ("jobTemplate", "spec", "template", "spec")


@pytest.fixture(scope="module")
def signed(key_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return signed_model_store(tmp_path_factory.mktemp("admission-rules"), key_dir / "ecdsa-p256.key.pem")


def policy_set(key_dir: Path, *policies: dict[str, Any], **top: Any) -> PolicySet:
    doc = {"apiVersion": "modelsec.dev/v1alpha1", "kind": "ModelPolicy", "policies": list(policies), **top}
    return PolicySet.from_mapping(doc, base_dir=key_dir, source="rules-policy")


def internal(**kw: Any) -> dict[str, Any]:
    return {"name": "internal", "match": [f"{REGISTRY}/**"], "keys": ["ecdsa-p256.pub.pem"], **kw}


def decide(policies: PolicySet, store: Path, body: dict[str, Any], **config: Any) -> Any:
    reviewer = Reviewer(policies, DirectoryStore(store), WebhookConfig(**config), clock=FakeClock())
    return reviewer.review(json.dumps(body).encode())


def in_namespace(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    body["request"]["namespace"] = namespace
    return body


# --- every matching policy must pass; per-policy mode -----------------------------------------------------


def test_every_matching_policy_must_pass(key_dir: Path, signed: tuple[str, Path]) -> None:
    digest, store = signed
    body = review_body("Pod", f"{REGISTRY}/llama@sha256:{digest}")
    strict = {"name": "needs-sm2", "match": [f"{REGISTRY}/llama"], "keys": ["sm2.pub.pem"]}
    # First match wins would allow: `internal` is satisfied. Both match, so `needs-sm2` must pass too.
    decision = decide(policy_set(key_dir, internal(), strict), store, body)
    out = decision.response["response"]
    assert out["allowed"] is False and decision.reason == "attestation"
    assert "'needs-sm2'" in out["status"]["message"] and "'internal'" not in out["status"]["message"]
    # The same policy in warn mode: allowed, and the failure is returned as a warning.
    decision = decide(policy_set(key_dir, internal(), {**strict, "mode": "warn"}), store, body)
    out = decision.response["response"]
    assert out["allowed"] is True and "status" not in out
    assert (
        len(out["warnings"]) == 1 and "needs-sm2" in out["warnings"][0] and "mode: warn" in out["warnings"][0]
    )


def test_a_warn_policy_alone_never_denies(key_dir: Path, signed: tuple[str, Path]) -> None:
    body = review_body("Pod", f"{REGISTRY}/llama@sha256:{UNSIGNED}")
    out = decide(policy_set(key_dir, internal(mode="warn")), signed[1], body).response["response"]
    assert out["allowed"] is True and UNSIGNED in out["warnings"][0]
    # The global audit mode stays silent, the global enforce mode keeps the policy's own mode.
    audit = decide(policy_set(key_dir, internal(mode="warn")), signed[1], body, mode=Mode.AUDIT)
    assert "warnings" not in audit.response["response"]


def test_policies_apply_only_in_their_namespaces(key_dir: Path, signed: tuple[str, Path]) -> None:
    digest, store = signed
    prod_only = {
        "name": "prod",
        "match": [f"{REGISTRY}/**"],
        "keys": ["sm2.pub.pem"],
        "namespaces": ["prod-*"],
    }
    policies = policy_set(key_dir, internal(), prod_only)
    ref = f"{REGISTRY}/llama@sha256:{digest}"
    assert decide(policies, store, in_namespace(review_body("Pod", ref), "ml")).allowed is True
    denied = decide(policies, store, in_namespace(review_body("Pod", ref), "prod-eu"))
    assert denied.allowed is False and "'prod'" in denied.response["response"]["status"]["message"]


# --- noMatch per namespace; requireModel in the policy ----------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "allowed", "warned"),
    [("ml", False, False), ("scratch-1", True, False), ("team-a", True, True)],
)
def test_an_unmatched_inference_service_follows_its_namespaces_no_match(
    namespace: str, allowed: bool, warned: bool, key_dir: Path, signed: tuple[str, Path]
) -> None:
    rules = [
        {"namespaces": ["scratch-*"], "noMatch": "allow"},
        {"namespaces": ["team-*"], "noMatch": "warn"},
    ]
    policies = policy_set(key_dir, internal(), namespaceRules=rules)
    body = in_namespace(review_body("InferenceService", "s3://elsewhere/models/sklearn-iris"), namespace)
    out = decide(policies, signed[1], body).response["response"]
    assert out["allowed"] is allowed
    assert ("warnings" in out) is warned
    if not allowed:
        assert "no policy" in out["status"]["message"] and "noMatch: deny" in out["status"]["message"]


def test_require_model_comes_from_the_policy(key_dir: Path, signed: tuple[str, Path]) -> None:
    policies = policy_set(
        key_dir, internal(), namespaceRules=[{"namespaces": ["prod-*"], "requireModel": True}]
    )
    denied = decide(policies, signed[1], in_namespace(review_body("Deployment", None), "prod-eu"))
    assert denied.allowed is False and denied.reason == "missing-references"
    assert decide(policies, signed[1], in_namespace(review_body("Deployment", None), "ml")).allowed is True


def test_namespace_rules_are_validated(key_dir: Path) -> None:
    from modelsec.errors import PolicyError

    for rules in ([{"namespaces": [], "noMatch": "allow"}], [{"namespaces": ["a"], "noMatch": "maybe"}]):
        with pytest.raises(PolicyError, match="namespaceRules"):
            policy_set(key_dir, internal(), namespaceRules=rules)
    with pytest.raises(PolicyError, match="mode"):
        policy_set(key_dir, internal(mode="audit"))


# --- model images in every container kind ----------------------------------------------------------------


@pytest.mark.parametrize("field", ["containers", "initContainers", "ephemeralContainers"])
@pytest.mark.parametrize("kind", ["Pod", "Deployment", "CronJob"])
def test_model_images_in_every_container_kind_are_checked(
    field: str, kind: str, key_dir: Path, signed: tuple[str, Path]
) -> None:
    digest, store = signed
    policies = policy_set(key_dir, internal())
    for image, reason in [
        (f"{MODELS}/llama@sha256:{digest}", "verified"),
        (f"{MODELS}/llama:v1", "digest-required"),
        (f"{MODELS}/llama@sha256:{UNSIGNED}", "attestation"),
        (f"{MODELS}/llama@sha256:zz", "malformed-reference"),
        ("registry.internal/runtime/vllm:latest", "no-references"),  # no policy names it: not a model
    ]:
        body = review_body(kind, None)
        path = {"Pod": (), "Deployment": ("template", "spec"), "CronJob": POD_IN_CRONJOB}[kind]
        spec = body["request"]["object"]["spec"]
        for part in path:
            spec = spec[part]
        spec.setdefault(field, []).append({"name": "modelcar", "image": image})
        decision = decide(policies, store, body)
        assert decision.reason == reason, image
        assert decision.allowed is (reason in ("verified", "no-references")), image


def test_short_docker_hub_names_are_matched_as_the_runtime_reads_them(
    key_dir: Path, signed: tuple[str, Path]
) -> None:
    hub = {"name": "hub", "match": ["oci://docker.io/acme/**"], "keys": ["ecdsa-p256.pub.pem"]}
    body = review_body("Pod", None)
    body["request"]["object"]["spec"]["containers"].append({"name": "m", "image": "acme/model:v1"})
    decision = decide(policy_set(key_dir, hub), signed[1], body)
    assert decision.allowed is False and decision.reason == "digest-required"


# --- every KServe model source ---------------------------------------------------------------------------

KSERVE_SOURCES: list[tuple[str, dict[str, Any]]] = [
    ("predictor.storageUri", {"predictor": {"storageUri": "REF"}}),
    (
        "predictor.model.storageUri",
        {"predictor": {"model": {"modelFormat": {"name": "x"}, "storageUri": "REF"}}},
    ),
    ("predictor.sklearn.storageUri", {"predictor": {"sklearn": {"storageUri": "REF"}}}),
    ("predictor.annotations", {"predictor": {"annotations": {"modelsec.dev/models": "REF"}}}),
    (
        "predictor.containers.env",
        {
            "predictor": {
                "containers": [
                    {"name": "c", "image": "r/i:1", "env": [{"name": "STORAGE_URI", "value": "REF"}]}
                ]
            }
        },
    ),
    (
        "predictor.model.env",
        {
            "predictor": {
                "model": {"modelFormat": {"name": "x"}, "env": [{"name": "STORAGE_URI", "value": "REF"}]}
            }
        },
    ),
    ("explainer.storageUri", {"explainer": {"storageUri": "REF"}}),
    ("explainer.art.storageUri", {"explainer": {"art": {"type": "SquareAttack", "storageUri": "REF"}}}),
    ("transformer.storageUri", {"transformer": {"storageUri": "REF"}}),
    (
        "transformer.containers.env",
        {
            "transformer": {
                "containers": [
                    {"name": "t", "image": "r/t:1", "env": [{"name": "STORAGE_URI", "value": "REF"}]}
                ]
            }
        },
    ),
    ("predictor.modelcar", {"predictor": {"model": {"modelFormat": {"name": "x"}, "storageUri": "REF"}}}),
]


@pytest.mark.parametrize(("name", "spec"), KSERVE_SOURCES, ids=[n for n, _ in KSERVE_SOURCES])
def test_every_kserve_storage_field_is_a_model_source(
    name: str, spec: dict[str, Any], key_dir: Path, signed: tuple[str, Path]
) -> None:
    digest, store = signed
    policies = policy_set(key_dir, internal())
    for ref, allowed in ((f"{REGISTRY}/m@sha256:{digest}", True), (f"{REGISTRY}/m@sha256:{UNSIGNED}", False)):
        body = review_body("InferenceService", None)
        body["request"]["object"]["spec"] = json.loads(json.dumps(spec).replace("REF", ref))
        decision = decide(policies, store, body)
        assert decision.allowed is allowed, (name, ref)
        assert decision.reason == ("verified" if allowed else "attestation"), name


@pytest.mark.parametrize("component", ["predictor", "explainer", "transformer"])
def test_a_kserve_storage_spec_is_a_model_source_that_pins_nothing(
    component: str, key_dir: Path, signed: tuple[str, Path]
) -> None:
    body = review_body("InferenceService", None)
    storage = {"key": "localMinIO", "path": "sklearn/iris", "parameters": {"bucket": "models"}}
    body["request"]["object"]["spec"] = {
        component: {"model": {"modelFormat": {"name": "x"}, "storage": storage}}
    }
    decision = decide(policy_set(key_dir, internal()), signed[1], body)
    assert decision.allowed is False and decision.reason == "no-policy"
    assert "kserve-storage://localMinIO/sklearn/iris" in decision.response["response"]["status"]["message"]
    covered = {"name": "minio", "match": ["kserve-storage://**"], "keys": ["ecdsa-p256.pub.pem"]}
    decision = decide(policy_set(key_dir, internal(), covered), signed[1], body)
    assert decision.allowed is False and decision.reason == "digest-required"


def test_storage_uri_from_value_from_is_refused(key_dir: Path, signed: tuple[str, Path]) -> None:
    env = [{"name": "STORAGE_URI", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "uri"}}}]
    body = review_body("InferenceService", None)
    body["request"]["object"]["spec"] = {
        "predictor": {"containers": [{"name": "c", "image": "r/i:1", "env": env}]}
    }
    decision = decide(policy_set(key_dir, internal()), signed[1], body)
    assert decision.allowed is False and "valueFrom" in decision.response["response"]["status"]["message"]


def test_kserve_model_images_and_image_volumes_are_checked(key_dir: Path, signed: tuple[str, Path]) -> None:
    digest, store = signed
    policies = policy_set(key_dir, internal())
    for predictor, reason in [
        ({"containers": [{"name": "c", "image": f"{MODELS}/m:latest"}]}, "digest-required"),
        ({"volumes": [{"name": "w", "image": {"reference": f"{MODELS}/m:latest"}}]}, "digest-required"),
        ({"volumes": [{"name": "w", "image": {"reference": f"{MODELS}/m@sha256:{digest}"}}]}, "verified"),
        (
            {"volumes": [{"name": "w", "image": {"reference": "registry.internal/data/cfg:1"}}]},
            "no-references",
        ),
    ]:
        body = review_body("InferenceService", None)
        body["request"]["object"]["spec"] = {"predictor": predictor}
        assert decide(policies, store, body).reason == reason, predictor
