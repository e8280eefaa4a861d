"""Table tests of the admission decision logic over real-shaped AdmissionReview v1 JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import BackendUnavailableError
from modelsec.policy import PolicySet
from modelsec.verifier.stores import StoredBundle
from modelsec.webhook.review import (
    BadRequestError,
    DirectoryStore,
    Mode,
    Reviewer,
    WebhookConfig,
    parse_reference,
)
from tests.support.stores import signed_model_store

UNSIGNED = "ab" * 32
REGISTRY = "oci://registry.internal/models"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def signed(key_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A tiny model signed with the trusted P-256 key, its bundle filed in a directory store."""
    return signed_model_store(tmp_path_factory.mktemp("webhook-unit"), key_dir / "ecdsa-p256.key.pem")


@pytest.fixture(scope="module")
def policies(key_dir: Path) -> PolicySet:
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {"name": "internal", "match": [f"{REGISTRY}/**"], "keys": ["ecdsa-p256.pub.pem"]},
            {
                "name": "scratch",
                "match": ["s3://scratch/**"],
                "keys": ["ecdsa-p256.pub.pem"],
                "requireDigest": False,
            },
        ],
        "noMatch": "deny",
    }
    return PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy")


def reviewer(
    policies: PolicySet, store: Path, mode: Mode = Mode.ENFORCE, clock: FakeClock | None = None, **kw: Any
) -> Reviewer:
    config = WebhookConfig(mode=mode, **kw)
    return Reviewer(policies, DirectoryStore(store), config, generation="g1", clock=clock or FakeClock())


def _annotated(models: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "x", "namespace": "ml", "annotations": {}}
    if models is not None:
        meta["annotations"]["modelsec.dev/models"] = models
    return meta


def _pod_spec() -> dict[str, Any]:
    return {
        "initContainers": [{"name": "fetch", "image": "registry.internal/tools/fetch:1"}],
        "containers": [{"name": "server", "image": "registry.internal/runtime/vllm:1"}],
    }


def _template(models: str | None) -> dict[str, Any]:
    return {"metadata": _annotated(models), "spec": _pod_spec()}


def workload(kind: str, models: str | None) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """(kind GVK, resource GVR, object) of a real-shaped object of `kind` naming `models`."""
    plain = {"name": "x", "namespace": "ml"}
    if kind == "Pod":
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _annotated(models),
            "spec": _pod_spec(),
        }
        return (
            {"group": "", "version": "v1", "kind": "Pod"},
            {"group": "", "version": "v1", "resource": "pods"},
            obj,
        )
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        spec = {"selector": {"matchLabels": {"app": "x"}}, "template": _template(models)}
        obj = {"apiVersion": "apps/v1", "kind": kind, "metadata": plain, "spec": spec}
        res = kind.lower() + "s"
        return (
            {"group": "apps", "version": "v1", "kind": kind},
            {"group": "apps", "version": "v1", "resource": res},
            obj,
        )
    if kind == "Job":
        obj = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": plain,
            "spec": {"template": _template(models)},
        }
        return (
            {"group": "batch", "version": "v1", "kind": "Job"},
            {"group": "batch", "version": "v1", "resource": "jobs"},
            obj,
        )
    if kind == "CronJob":
        spec = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": _template(models)}}}
        obj = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": plain, "spec": spec}
        gvk = {"group": "batch", "version": "v1", "kind": "CronJob"}
        return gvk, {"group": "batch", "version": "v1", "resource": "cronjobs"}, obj
    if kind == "InferenceService":
        predictor: dict[str, Any] = {"model": {"modelFormat": {"name": "huggingface"}}}
        if models is not None:
            predictor["model"]["storageUri"] = models
        obj = {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": kind,
            "metadata": plain,
            "spec": {"predictor": predictor},
        }
        gvk = {"group": "serving.kserve.io", "version": "v1beta1", "kind": kind}
        return gvk, {"group": "serving.kserve.io", "version": "v1beta1", "resource": "inferenceservices"}, obj
    if kind == "TrainedModel":
        model: dict[str, Any] = {"framework": "pytorch", "memory": "1Gi"}
        if models is not None:
            model["storageUri"] = models
        obj = {
            "apiVersion": "serving.kserve.io/v1alpha1",
            "kind": kind,
            "metadata": plain,
            "spec": {"inferenceService": "isvc", "model": model},
        }
        gvk = {"group": "serving.kserve.io", "version": "v1alpha1", "kind": kind}
        return gvk, {"group": "serving.kserve.io", "version": "v1alpha1", "resource": "trainedmodels"}, obj
    raise AssertionError(kind)


def review_body(
    kind: str = "Pod",
    models: str | None = None,
    *,
    operation: str = "CREATE",
    uid: str = "uid-1",
    dry_run: bool = False,
    sub_resource: str | None = None,
) -> dict[str, Any]:
    gvk, gvr, obj = workload(kind, models)
    request: dict[str, Any] = {
        "uid": uid,
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": "x",
        "namespace": "ml",
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:ml:deployer"},
        "object": obj,
        "oldObject": copy.deepcopy(obj) if operation == "UPDATE" else None,
        "dryRun": dry_run,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions",
        },
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answer(r: Reviewer, body: dict[str, Any] | bytes) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = r.review(raw).response
    assert response["apiVersion"] in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
    assert response["kind"] == "AdmissionReview"
    return response["response"]


KINDS = ["Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "InferenceService"]


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_allows_signed_and_denies_unsigned(
    kind: str, operation: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    digest, store = signed
    r = reviewer(policies, store)
    good = f"{REGISTRY}/llama@sha256:{digest}"
    ok = answer(r, review_body(kind, good, operation=operation, uid=f"u-{kind}-{operation}"))
    assert ok["uid"] == f"u-{kind}-{operation}"
    assert ok["allowed"] is True and "status" not in ok
    bad = f"{REGISTRY}/other@sha256:{UNSIGNED}"
    no = answer(r, review_body(kind, bad, operation=operation))
    assert no["allowed"] is False
    assert no["status"]["code"] == 403
    assert bad in no["status"]["message"] and "no weights signature" in no["status"]["message"]


@pytest.mark.parametrize("kind", KINDS)
def test_workload_without_models_is_allowed(kind: str, policies: PolicySet, signed: tuple[str, Path]) -> None:
    r = reviewer(policies, signed[1])
    decision = r.review(json.dumps(review_body(kind, None)).encode())
    assert decision.response["response"]["allowed"] is True
    assert decision.reason == "no-references"


def test_image_volumes_are_bound_to_the_verified_digest(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    digest, store = signed
    r = reviewer(policies, store)
    ref = f"oci://registry.internal/models/x@sha256:{digest}"
    evil = f"oci://registry.internal/models/evil@sha256:{digest}"  # an attested digest, another name
    for models, image, reason in [
        (ref, f"registry.internal/models/x@sha256:{digest}", "verified"),
        (None, f"registry.internal/models/x@sha256:{digest}", "verified"),  # a model image is verified itself
        (None, "registry.internal/runtime/assets:v1", "no-references"),  # not a model: not reviewed
        (ref, "registry.internal/models/x:v1", "digest-required"),
        (ref, "registry.internal/models/x@sha256:" + "ab" * 32, "image-digest-mismatch"),
        (ref, "registry.internal/models/other:v1", "digest-required"),
        (None, "registry.internal/models/x:v1", "digest-required"),
        (evil, "registry.internal/models/evil:latest", "digest-required"),
        (evil, "registry.internal/models/evil@sha256:" + "ab" * 32, "image-digest-mismatch"),
    ]:
        body = review_body("Pod", models)
        body["request"]["object"].setdefault("spec", {})["volumes"] = [
            {"name": "weights", "image": {"reference": image, "pullPolicy": "IfNotPresent"}}
        ]
        decision = r.review(json.dumps(body).encode())
        allowed = reason in ("verified", "no-references")
        assert decision.response["response"]["allowed"] is allowed, (models, image)
        assert decision.reason == reason, (models, image)
        if not allowed:
            assert image in decision.response["response"]["status"]["message"]


def test_namespace_that_requires_models_denies_workloads_without_one(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    body = review_body("Pod", None)
    namespace = body["request"]["namespace"]
    strict = reviewer(policies, signed[1], require_models_in=(namespace[:2] + "*",))
    decision = strict.review(json.dumps(body).encode())
    assert decision.response["response"]["allowed"] is False
    assert decision.reason == "missing-references"
    assert (
        f"namespace {namespace!r} requires a model reference"
        in decision.response["response"]["status"]["message"]
    )
    other = reviewer(policies, signed[1], require_models_in=("prod-*",))
    assert other.review(json.dumps(body).encode()).response["response"]["allowed"] is True


def test_ephemeral_containers_update_checks_pod_annotation(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    body = review_body(
        "Pod", f"{REGISTRY}/x@sha256:{UNSIGNED}", operation="UPDATE", sub_resource="ephemeralcontainers"
    )
    body["request"]["object"]["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    out = answer(r, body)
    assert out["allowed"] is False and UNSIGNED in out["status"]["message"]
    body = review_body(
        "Pod", f"{REGISTRY}/x@sha256:{signed[0]}", operation="UPDATE", sub_resource="ephemeralcontainers"
    )
    assert answer(r, body)["allowed"] is True


def test_one_bad_reference_among_good_ones_denies(policies: PolicySet, signed: tuple[str, Path]) -> None:
    r = reviewer(policies, signed[1])
    models = f"{REGISTRY}/a@sha256:{signed[0]}, oci://mirror.internal/models/x@sha256:{signed[0]}"
    out = answer(r, review_body("Deployment", models))
    assert out["allowed"] is False
    assert "oci://mirror.internal/models/x" in out["status"]["message"]
    assert "no policy" in out["status"]["message"]


def test_workload_and_template_annotations_are_both_checked(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    body = review_body("Deployment", f"{REGISTRY}/a@sha256:{signed[0]}")
    body["request"]["object"]["metadata"]["annotations"] = {
        "modelsec.dev/models": f"{REGISTRY}/b@sha256:{UNSIGNED}"
    }
    out = answer(r, body)
    assert out["allowed"] is False and UNSIGNED in out["status"]["message"]


@pytest.mark.parametrize(
    "predictor",
    [
        {"storageUri": "REF"},
        {"sklearn": {"storageUri": "REF"}},
        {"annotations": {"modelsec.dev/models": "REF"}, "model": {"modelFormat": {"name": "sklearn"}}},
    ],
)
def test_kserve_reference_sources(
    predictor: dict[str, Any], policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    for digest, allowed in ((signed[0], True), (UNSIGNED, False)):
        body = review_body("InferenceService", None)
        text = json.dumps(predictor).replace("REF", f"{REGISTRY}/m@sha256:{digest}")
        body["request"]["object"]["spec"]["predictor"] = json.loads(text)
        assert answer(r, body)["allowed"] is allowed


@pytest.mark.parametrize(
    ("models", "reason", "words"),
    [
        ("oci://mirror.internal/models/llama@sha256:" + UNSIGNED, "no-policy", "no policy"),
        ("hf://attacker-org/llama", "no-policy", "no policy"),
        (f"{REGISTRY}/llama:latest", "digest-required", "requires a pinned"),
        (f"{REGISTRY}/llama@sha256:zz", "malformed-reference", "malformed digest"),
        (f"{REGISTRY}/llama@sha256:{'AB' * 32}", "malformed-reference", "malformed digest"),
        (f"{REGISTRY}/llama@sha512:{UNSIGNED}", "malformed-reference", "malformed digest"),
        (f"registry.internal/models/llama@sha256:{UNSIGNED}", "malformed-reference", "malformed model URI"),
        ("s3://scratch/model", "digest-required", "no model root digest"),
    ],
)
def test_refused_references(
    models: str, reason: str, words: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    decision = r.review(json.dumps(review_body("Pod", models)).encode())
    out = decision.response["response"]
    assert out["allowed"] is False and out["status"]["code"] == 403
    assert models in out["status"]["message"] and words in out["status"]["message"]
    assert decision.reason == reason


def test_warn_mode_allows_with_warnings(policies: PolicySet, signed: tuple[str, Path]) -> None:
    r = reviewer(policies, signed[1], Mode.WARN)
    ref = f"{REGISTRY}/x@sha256:{UNSIGNED}"
    decision = r.review(json.dumps(review_body("Deployment", ref, operation="UPDATE")).encode())
    out = decision.response["response"]
    assert out["allowed"] is True and "status" not in out
    assert len(out["warnings"]) == 1 and ref in out["warnings"][0]
    assert decision.verdict == "deny" and out["auditAnnotations"]["decision"] == "deny"
    assert decision.audit_record()["references"][0]["reason"] == "attestation"


def test_audit_mode_allows_and_only_records(policies: PolicySet, signed: tuple[str, Path]) -> None:
    r = reviewer(policies, signed[1], Mode.AUDIT)
    decision = r.review(json.dumps(review_body("CronJob", f"{REGISTRY}/x@sha256:{UNSIGNED}")).encode())
    out = decision.response["response"]
    assert out["allowed"] is True and "warnings" not in out and "status" not in out
    assert decision.verdict == "deny" and decision.audit_record()["verdict"] == "deny"
    assert out["auditAnnotations"] == {"decision": "deny", "reason": "attestation", "mode": "audit"}


@pytest.mark.parametrize("mode", [Mode.WARN, Mode.AUDIT])
def test_invalid_reviews_are_denied_in_every_mode(
    mode: Mode, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1], mode)
    body = review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}")
    del body["request"]["object"]
    assert answer(r, body)["allowed"] is False


def test_dry_run_is_evaluated_the_same_without_cache_write(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    bad = answer(r, review_body("Pod", f"{REGISTRY}/x@sha256:{UNSIGNED}", dry_run=True))
    assert bad["allowed"] is False
    good = review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}", dry_run=True)
    assert answer(r, good)["allowed"] is True
    assert len(r.cache) == 0
    good["request"]["dryRun"] = False
    assert answer(r, good)["allowed"] is True
    assert len(r.cache) == 1


def test_store_outage_denies(policies: PolicySet, signed: tuple[str, Path], tmp_path: Path) -> None:
    for store in (tmp_path / "missing", tmp_path / "a-file"):
        if store.name == "a-file":
            store.write_text("not a directory")
        decision = reviewer(policies, store).review(
            json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}")).encode()
        )
        assert decision.response["response"]["allowed"] is False
        assert decision.reason == "store-unavailable"
        assert "attestation store" in decision.response["response"]["status"]["message"]


class ExplodingStore:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def revision(self, digest: str) -> None:
        return None

    def entries(self, digest: str) -> list[bytes]:
        raise self.error


@pytest.mark.parametrize("error", [BackendUnavailableError("store down"), RuntimeError("bug"), KeyError("k")])
def test_any_store_exception_denies(
    error: BaseException, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = Reviewer(policies, ExplodingStore(error), WebhookConfig(), clock=FakeClock())
    out = answer(r, review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}"))
    assert out["allowed"] is False and out["status"]["code"] == 403


def test_positive_results_cached_with_ttl_and_keyed_by_generation(
    policies: PolicySet, signed: tuple[str, Path], tmp_path: Path
) -> None:
    clock = FakeClock()
    r = reviewer(policies, signed[1], clock=clock, cache_ttl_seconds=60)
    good = json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}")).encode()
    assert r.review(good).references[0].cached is False
    assert r.review(good).references[0].cached is True
    # Negative results are never cached.
    bad = json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{UNSIGNED}")).encode()
    r.review(bad)
    assert len(r.cache) == 1
    # A cached positive does not outlive a store outage (cacheOnOutage: deny, the default).
    r.store = DirectoryStore(tmp_path / "gone")
    assert r.review(good).response["response"]["allowed"] is False
    clock.now += 61
    # Another policy generation does not see the first one's entries.
    r2 = Reviewer(policies, DirectoryStore(signed[1]), WebhookConfig(), generation="g2", clock=clock)
    r2.cache = r.cache
    r.store = DirectoryStore(signed[1])
    r.review(good)
    assert r2.review(good).references[0].cached is False


def test_deadline_overrun_denies(policies: PolicySet, signed: tuple[str, Path]) -> None:
    clock = FakeClock()

    class SlowStore:
        def revision(self, digest: str) -> None:
            return None

        def entries(self, digest: str) -> list[StoredBundle]:
            clock.now += 9
            return DirectoryStore(signed[1]).entries(digest)

    r = Reviewer(policies, SlowStore(), WebhookConfig(deadline_seconds=8), clock=clock)
    decision = r.review(json.dumps(review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}")).encode())
    assert decision.response["response"]["allowed"] is False and decision.reason == "deadline"
    assert len(r.cache) == 0


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda b: b.update(apiVersion="admission.k8s.io/v1beta1"), "only admission.k8s.io/v1"),
        (lambda b: b["request"].pop("object"), "request.object"),
        (lambda b: b["request"].update(operation="DELETE"), "DELETE"),
        (
            lambda b: b["request"].update(kind={"group": "", "version": "v1", "kind": "ConfigMap"}),
            "not covered",
        ),
        (lambda b: b["request"]["object"]["metadata"].update(annotations=["x"]), "not an object"),
        (
            lambda b: b["request"]["object"]["metadata"]["annotations"].update({"modelsec.dev/models": 5}),
            "not a string",
        ),
        (
            lambda b: b["request"]["object"]["metadata"]["annotations"].update(
                {"modelsec.dev/models": "a,,b"}
            ),
            "empty",
        ),
        (
            lambda b: b["request"]["object"]["metadata"]["annotations"].update(
                {"modelsec.dev/models": ",".join(f"{REGISTRY}/m{i}@sha256:{UNSIGNED}" for i in range(40))}
            ),
            "more than the limit",
        ),
    ],
)
def test_malformed_reviews_deny_with_uid(
    mutate: Any, words: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    body = review_body("Pod", f"{REGISTRY}/x@sha256:{signed[0]}", uid="uid-malformed")
    mutate(body)
    decision = reviewer(policies, signed[1]).review(json.dumps(body).encode())
    out = decision.response["response"]
    assert decision.response["apiVersion"] == body["apiVersion"]
    assert out["uid"] == "uid-malformed" and out["allowed"] is False
    assert words in out["status"]["message"]
    assert decision.reason == "malformed-request"


@pytest.mark.parametrize(
    "raw",
    [
        b"this is not an AdmissionReview",
        b"[]",
        b"{}",
        b'{"request": null}',
        b'{"request": {"uid": 5}}',
        b'{"request": {"uid": ""}}',
        b'{"request": {"uid": "a\\u0000b"}}',
        b'{"request": {"uid": "a", "uid": "b"}}',
        b'{"request": {"uid": "' + b"u" * 300 + b'"}}',
        b"\xff\xfe",
        b" " * (5 * 2**20),
    ],
)
def test_no_readable_uid_is_a_bad_request(raw: bytes, policies: PolicySet, signed: tuple[str, Path]) -> None:
    with pytest.raises(BadRequestError):
        reviewer(policies, signed[1]).review(raw)


def test_parse_reference() -> None:
    ref = parse_reference(f"{REGISTRY}/m@sha256:{UNSIGNED}", "here")
    assert (ref.uri, ref.digest, ref.source) == (f"{REGISTRY}/m", UNSIGNED, "here")
    assert parse_reference("s3://b/m", "here").digest is None


# Every resource the webhook configuration sends (tests/integration/webhook/test_deploy.py) is reviewed.

RESOURCE_KINDS = {
    ("", "pods"): "Pod",
    ("apps", "deployments"): "Deployment",
    ("apps", "statefulsets"): "StatefulSet",
    ("apps", "daemonsets"): "DaemonSet",
    ("apps", "replicasets"): "ReplicaSet",
    ("batch", "jobs"): "Job",
    ("batch", "cronjobs"): "CronJob",
    ("serving.kserve.io", "inferenceservices"): "InferenceService",
    ("serving.kserve.io", "trainedmodels"): "TrainedModel",
}


@pytest.mark.parametrize(("resource", "kind"), list(RESOURCE_KINDS.items()))
def test_every_rule_resource_is_reviewed(
    resource: tuple[str, str], kind: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    gvk, gvr, _ = workload(kind, None)
    assert (gvr["group"], gvr["resource"]) == resource and gvk["group"] == resource[0]
    out = answer(reviewer(policies, signed[1]), review_body(kind, f"{REGISTRY}/x@sha256:{UNSIGNED}"))
    assert out["allowed"] is False and "not covered" not in out["status"]["message"]


def test_audit_record_names_the_request_even_when_denied_early(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    body = review_body("Deployment", f"{REGISTRY}/x@sha256:{signed[0]}", uid="uid-early", dry_run=True)
    del body["request"]["object"]
    record = r.review(json.dumps(body).encode()).audit_record()
    assert (
        record["uid"] == "uid-early" and record["namespace"] == "ml" and record["kind"] == "apps/Deployment"
    )
    assert record["dryRun"] is False  # dryRun is read only from a request that passed validation
    late = r.deny_deadline(r.parse(json.dumps(review_body("Pod", None, dry_run=True)).encode()))
    assert late.response["response"]["allowed"] is False and late.reason == "deadline"
    assert late.audit_record()["operation"] == "CREATE" and late.dry_run is True
    body = review_body("Pod", None)
    body["request"]["kind"] = "Pod"
    assert r.review(json.dumps(body).encode()).response["response"]["allowed"] is False


def test_directory_store_skips_a_fifo_instead_of_hanging(signed: tuple[str, Path], tmp_path: Path) -> None:
    """A FIFO planted next to the bundles (anyone who can write the store could) is not read: no hang."""
    import os
    import shutil

    digest, store = signed
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    os.mkfifo(copy / "sha256" / digest / "planted.sig")
    bundles = DirectoryStore(copy).bundles(digest)
    assert bundles == DirectoryStore(store).bundles(digest) and len(bundles) == 1


def test_the_cache_generation_is_the_digest_of_the_parsed_policy_file(tmp_path: Path, key_dir: Path) -> None:
    import hashlib

    from tests.support.policies import write_policy

    path = write_policy(tmp_path, key_dir)
    policies = PolicySet.from_file(path)
    assert policies.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert Reviewer(policies, DirectoryStore(tmp_path), WebhookConfig()).generation == policies.digest
