"""The mutating webhook hands the pin to the containers that serve an InferenceService's model, and no others.

KServe runs a predictor (and the predictors of `canary[]`) with the model, and a transformer and an explainer
beside it that never load it; the pin (`MODELSEC_MODEL_DIGEST`) and the guard's policy (`MODELSEC_POLICY`) go
to every container of the former only: the framework spec's container (`kserve-container`), the predictor's
own containers and init containers, and its `workerSpec` (multi-node serving). The annotation
`modelsec.dev/serving-containers` narrows that to the containers it names. In-process: tags are resolved by
an in-memory resolver (`Mutator` takes any `Resolver`), so no registry is involved.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import NotFoundError
from modelsec.policy import PolicySet
from modelsec.registry.reference import OciReference
from modelsec.webhook.mutate import SERVING_CONTAINERS_ANNOTATION, Mutation, Mutator, pointer
from modelsec.webhook.review import Reviewer, WebhookConfig

REPOSITORY = "registry.internal/models/llm"
MANIFEST = "sha256:" + "5e" * 32
GUARD = "/etc/modelsec/guard/policy.yaml"


def _resolve(ref: OciReference) -> str:
    """The registry, simulated: one tag of one repository."""
    if (ref.name, ref.tag) == (REPOSITORY, "v1"):
        return MANIFEST
    raise NotFoundError(f"{ref}: no such tag")


@pytest.fixture(scope="module")
def mutator(key_dir: Path) -> Mutator:
    policies = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [
                {
                    "name": "models",
                    "match": ["oci://registry.internal/models/**"],
                    "keys": ["ecdsa-p256.pub.pem"],
                    "guardPolicy": GUARD,
                }
            ],
        },
        base_dir=key_dir,
        source="test-policy",
    )
    return Mutator(Reviewer(policies, None, WebhookConfig()), _resolve)


def _container(name: str) -> dict[str, Any]:
    return {"name": name, "image": f"registry.internal/runtime/{name}:1"}


def _inference_service(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Every place KServe runs a container: predictor (spec, containers, init, workers), canary, the rest."""
    model = {"modelFormat": {"name": "huggingface"}, "storageUri": f"oci://{REPOSITORY}:v1"}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "ml", "annotations": annotations or {}},
        "spec": {
            "predictor": {
                "model": dict(model),
                "containers": [_container("sidecar")],
                "initContainers": [_container("warmup")],
                "workerSpec": {"containers": [_container("worker")]},
            },
            "canary": [{"predictor": {"model": dict(model)}}],
            "transformer": {"containers": [_container("tokenizer")]},
            "explainer": {"containers": [_container("explainer")], "initContainers": [_container("prep")]},
        },
    }


def _mutate(mutator: Mutator, obj: dict[str, Any]) -> Mutation:
    gvk = {"group": "serving.kserve.io", "version": "v1beta1", "kind": "InferenceService"}
    request = {"uid": "u", "kind": gvk, "namespace": "ml", "operation": "CREATE", "object": obj}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return mutator.review(json.dumps(body).encode())


def _env_targets(mutation: Mutation) -> dict[str, dict[str, str]]:
    """Per container (its JSON pointer), the variables the patch gives it."""
    response = mutation.decision.response["response"]
    assert response["allowed"] is True, response
    targets: dict[str, dict[str, str]] = {}
    for op in json.loads(base64.b64decode(response["patch"])):
        container, sep, _ = op["path"].rpartition("/env")
        if sep and op["op"] == "add":
            entries = op["value"] if isinstance(op["value"], list) else [op["value"]]
            targets.setdefault(container, {}).update({e["name"]: e["value"] for e in entries})
    return targets


PREDICTOR = {
    pointer(("spec", "predictor", "model")),
    pointer(("spec", "predictor", "containers", 0)),
    pointer(("spec", "predictor", "initContainers", 0)),
    pointer(("spec", "predictor", "workerSpec", "containers", 0)),
    pointer(("spec", "canary", 0, "predictor", "model")),
}


def test_only_the_predictor_canary_and_worker_containers_get_the_pin(mutator: Mutator) -> None:
    mutation = _mutate(mutator, _inference_service())
    targets = _env_targets(mutation)
    assert set(targets) == PREDICTOR  # never the transformer's or the explainer's containers
    expected = {"MODELSEC_MODEL_DIGEST": f"oci://{REPOSITORY}@{MANIFEST}", "MODELSEC_POLICY": GUARD}
    assert all(env == expected for env in targets.values())
    patched = mutation.patched
    assert patched is not None
    for component in (patched["spec"]["predictor"], patched["spec"]["canary"][0]["predictor"]):
        assert component["model"]["storageUri"] == f"oci://{REPOSITORY}@{MANIFEST}"
    for name in ("transformer", "explainer"):
        for container in patched["spec"][name].get("containers", []) + patched["spec"][name].get(
            "initContainers", []
        ):
            assert "env" not in container, (name, container["name"])


def test_the_serving_containers_annotation_restricts_the_injection(mutator: Mutator) -> None:
    obj = _inference_service({SERVING_CONTAINERS_ANNOTATION: "kserve-container, worker"})
    targets = _env_targets(_mutate(mutator, obj))
    assert set(targets) == {
        pointer(("spec", "predictor", "model")),
        pointer(("spec", "canary", 0, "predictor", "model")),
        pointer(("spec", "predictor", "workerSpec", "containers", 0)),
    }
    # A transformer's container is no serving container, even when the annotation names it: it would run
    # unpinned beside a pinned predictor, so the name is refused as one the workload does not serve with.
    for names in ("tokenizer", "kserve-container,no-such-container"):
        mutation = _mutate(mutator, _inference_service({SERVING_CONTAINERS_ANNOTATION: names}))
        response = mutation.decision.response["response"]
        assert response["allowed"] is False and mutation.decision.reason == "serving-containers"
        assert "patch" not in response and mutation.patch == ()
