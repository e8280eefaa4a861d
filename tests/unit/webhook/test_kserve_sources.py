"""Every KServe field that names a model is read, by the `kserve` SDK's own schema (issue 27, item 5).

Before, `predictor.storageUris` (KServe 0.15+), the predictors of `canary[]`, a `workerSpec`'s containers and
the KServe `TrainedModel` kind were not read: such an object was admitted as "no-references". The field list
is not written here by hand: it is walked from the models of the `kserve` 0.21.0 wheel
(fixtures/kserve-schema.json, made by fixtures/make_kserve_schema.py, which records the wheel's sha256). Every
field that can name a model, a container image or an image volume gets its own case that sets only that field
and asserts that `modelsec.webhook.sources.collect` reports it; a field whose name looks like a source but is
neither classified here nor listed in `NOT_SOURCES` fails `test_every_source_like_field_is_classified`. So a
new KServe release's new source field fails a test once its schema is extracted.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelsec.webhook.sources import collect
from tests.unit.webhook.test_admission_rules import decide, internal, policy_set, signed  # noqa: F401
from tests.unit.webhook.test_review import REGISTRY, UNSIGNED, review_body

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "kserve-schema.json").read_text())
GROUP = "serving.kserve.io"
REF = "s3://models-bucket/llm"
IMAGE = "registry.internal/models/llm:latest"

# Fields whose name looks like a model source (SOURCE_LIKE) but which are not one, each with the reason.
NOT_SOURCES = {
    "logger": "where request and response logs are written: an output, not a model",
    "storageContainerName": "names the ClusterStorageContainer that downloads, not what it downloads",
    "imagePullPolicy": "when to pull an image, not which",
    "imagePullSecrets": "credentials for pulls, not an image",
    "terminationMessagePath": "a file the container writes",
    "volumeMounts": "where a volume (read from `volumes`) is mounted",
    "volumeDevices": "where a volume (read from `volumes`) is attached",
    "modelFormat": "the format's name and version, not where the model is",
    "exporterEndpoint": "where traces are sent",
    "protocolVersion": "the inference protocol",
    "runtimeVersion": "the serving runtime's version, not a model",
    "name": "an object name",
    "resourceId": "the KBS id of the key that decrypts a confidential model, not the model",
}
# Words of a camelCase field name that suggest it names where something comes from.
SOURCE_WORDS = {
    "uri",
    "uris",
    "url",
    "storage",
    "source",
    "bucket",
    "repo",
    "repository",
    "model",
    "models",
    "image",
    "volume",
    "volumes",
    "path",
    "endpoint",
    "location",
    "artifact",
    "weights",
}
_K8S_CONTAINERS = ("V1Container", "V1EphemeralContainer")


def _inner(openapi_type: str) -> str:
    match = re.fullmatch(r"list\[(.*)\]|dict\(str, (.*)\)", openapi_type)
    return _inner(match.group(1) or match.group(2)) if match else openapi_type


@dataclass(frozen=True)
class Case:
    """One field set alone: `steps` from the root (name, is-list), the value, what `collect` must report."""

    kind: str
    steps: tuple[tuple[str, bool], ...]
    value: Any
    where: str
    raw: str | None = None  # an expected model reference, or
    image: str | None = None  # an expected image

    @property
    def id(self) -> str:
        return f"{self.kind}:" + ".".join(name + ("[]" if is_list else "") for name, is_list in self.steps)

    def object(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"apiVersion": f"{GROUP}/v1", "kind": self.kind, "metadata": {"name": "m"}}
        node: Any = obj
        for i, (name, is_list) in enumerate(self.steps):
            last = i == len(self.steps) - 1
            child: Any = copy.deepcopy(self.value) if last else {}
            if is_list and not last:
                node[name] = [child]
            else:
                node[name] = child
            node = child
        return obj


def _walk(
    kind: str, model: str, steps: tuple[tuple[str, bool], ...], seen: frozenset[str]
) -> Iterator[Case | str]:
    """The cases under `model`, and (as strings) source-like fields nothing classifies."""
    for name, openapi_type in SCHEMA["models"][model].items():
        inner, is_list = _inner(openapi_type), openapi_type.startswith("list[")
        here = (*steps, (name, is_list))
        where = ".".join(n + ("[0]" if lst else "") for n, lst in here)
        if name in NOT_SOURCES:
            continue
        if name == "storageUri" and inner == "str":
            yield Case(kind, here, REF, where, raw=REF)
        elif inner == "V1beta1StorageUri" and is_list:
            yield Case(kind, here, [{"uri": REF, "mountPath": "/mnt/models/a"}], f"{where}.uri", raw=REF)
        elif inner in ("V1beta1StorageSpec", "V1beta1ModelStorageSpec"):
            yield Case(kind, here, {"key": "minio", "path": "llm"}, where, raw="kserve-storage://minio/llm")
        elif inner in _K8S_CONTAINERS and is_list:
            yield Case(kind, here, [{"name": "c", "image": IMAGE}], f"{where}.image", image=IMAGE)
        elif inner == "V1Volume" and is_list:
            volumes = [{"name": "w", "image": {"reference": IMAGE}}]
            yield Case(kind, here, volumes, f"{where}.image.reference", image=IMAGE)
        elif name == "image" and inner == "str":
            yield Case(kind, here, IMAGE, where, image=IMAGE)
        elif name == "env" and inner == "V1EnvVar":
            env = [{"name": "STORAGE_URI", "value": REF}]
            yield Case(kind, here, env, f"{where}(STORAGE_URI)", raw=REF)
        elif inner in SCHEMA["models"]:
            if inner not in seen:
                yield from _walk(kind, inner, here, seen | {inner})
        elif SOURCE_WORDS & {w.lower() for w in re.findall(r"[a-z]+|[A-Z]+[a-z]*", name)}:
            yield f"{kind}: {where} ({openapi_type})"


def _everything() -> list[Case | str]:
    return [
        item
        for kind, root in SCHEMA["roots"].items()
        for item in _walk(kind, root, (("spec", False),), frozenset({root}))
    ]


CASES = [c for c in _everything() if isinstance(c, Case)]


def test_the_schema_is_the_recorded_kserve_release() -> None:
    source = SCHEMA["source"]
    assert source["wheel"] == "kserve-0.21.0-py3-none-any.whl"
    assert re.fullmatch(r"[0-9a-f]{64}", source["sha256"])
    # The fields the issue names are in it, so the walk below reaches them.
    ids = {c.id for c in CASES}
    assert "InferenceService:spec.predictor.storageUris[]" in ids
    assert "InferenceService:spec.predictor.model.storageUri" in ids
    assert "TrainedModel:spec.model.storageUri" in ids


def test_every_source_like_field_is_classified() -> None:
    unclassified = [item for item in _everything() if isinstance(item, str)]
    assert not unclassified, "new KServe fields: read them in modelsec.webhook.sources or add to NOT_SOURCES"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_kserve_model_source_is_read(case: Case) -> None:
    refs, images = collect(GROUP, case.kind, case.object())
    if case.raw is not None:
        assert [(r.raw, r.where) for r in refs] == [(case.raw, case.where)]
    else:
        assert [(i.image, i.where) for i in images] == [(case.image, case.where)]


# --- the decisions: unsigned or mutable refused, signed and pinned admitted -------------------------------


def _trained_model(storage_uri: str) -> dict[str, Any]:
    body = review_body("InferenceService", None)
    gvk = {"group": GROUP, "version": "v1alpha1", "kind": "TrainedModel"}
    body["request"].update(
        kind=gvk,
        requestKind=gvk,
        resource={"group": GROUP, "version": "v1alpha1", "resource": "trainedmodels"},
        requestResource={"group": GROUP, "version": "v1alpha1", "resource": "trainedmodels"},
        object={
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "TrainedModel",
            "metadata": {"name": "m", "namespace": "ml"},
            "spec": {
                "inferenceService": "isvc",
                "model": {"framework": "pytorch", "memory": "1Gi", "storageUri": storage_uri},
            },
        },
    )
    return body


def _inference_service(spec: dict[str, Any]) -> dict[str, Any]:
    body = review_body("InferenceService", None)
    body["request"]["object"]["spec"] = spec
    return body


def _storage_uris(ref: str) -> list[dict[str, str]]:
    return [{"uri": ref, "mountPath": "/mnt/models/llm"}]


BODIES = {
    "predictor.storageUris": lambda ref: _inference_service(
        {"predictor": {"storageUris": _storage_uris(ref)}}
    ),
    "predictor.model.storageUris": lambda ref: _inference_service(
        {"predictor": {"model": {"modelFormat": {"name": "huggingface"}, "storageUris": _storage_uris(ref)}}}
    ),
    "canary[].predictor.storageUri": lambda ref: _inference_service(
        {"predictor": {}, "canary": [{"trafficPercent": 10, "predictor": {"storageUri": ref}}]}
    ),
    "TrainedModel spec.model.storageUri": _trained_model,
}


@pytest.mark.parametrize("name", list(BODIES))
def test_storage_uris_canaries_and_trained_models_are_verified(
    name: str,
    key_dir: Path,
    signed: tuple[str, Path],  # noqa: F811 - the imported fixture
) -> None:
    digest, store = signed
    policies = policy_set(key_dir, internal())
    for ref, reason in (
        (f"{REGISTRY}/m:latest", "digest-required"),  # a mutable tag
        (f"{REGISTRY}/m@sha256:{UNSIGNED}", "attestation"),  # pinned, never signed
        (f"{REGISTRY}/m@sha256:{digest}", "verified"),
    ):
        decision = decide(policies, store, BODIES[name](ref))
        assert decision.reason == reason, (name, ref)
        assert decision.allowed is (reason == "verified"), (name, ref)
        assert ref in json.dumps(decision.response) or reason == "verified"
