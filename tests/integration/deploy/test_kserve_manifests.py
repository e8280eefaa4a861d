"""deploy/kserve: the ClusterStorageContainer of the storage initializer and the sample InferenceService.

Rendered with `kubectl kustomize`. `kubernetes-validate` has no schema for KServe's kinds, so their fields are
checked against the models of the `kserve` 0.21.0 SDK wheel (fixtures/kserve-storage-container-schema.json,
made by fixtures/make_kserve_storage_schema.py; the InferenceService with the webhook's
tests/unit/webhook/fixtures/kserve-schema.json from the same wheel): every field known, typed as the model
types it, required fields present. The Kubernetes types inside them (the storage initializer's container,
the predictor's volumes) are validated strictly with `kubernetes-validate` in the Pod KServe makes of them.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from modelsec.distribution.initializer import SCHEME, oci_reference
from tests.integration.webhook.test_deploy import one, render

ROOT = Path(__file__).resolve().parents[3]
KSERVE = ROOT / "deploy" / "kserve"
STORAGE_SCHEMA = json.loads(
    (Path(__file__).parent / "fixtures" / "kserve-storage-container-schema.json").read_text()
)
ISVC_SCHEMA = json.loads((ROOT / "tests/unit/webhook/fixtures/kserve-schema.json").read_text())
_PRIMITIVES = {"str": str, "bool": bool, "int": int, "object": object}


def check_fields(
    value: Any, type_name: str, models: dict[str, Any], where: str
) -> list[tuple[str, str, Any]]:
    """Assert `value` fits `type_name`; return the `(where, type, value)` leaves of Kubernetes types."""
    inner = re.fullmatch(r"list\[(.*)\]", type_name)
    if inner:
        assert isinstance(value, list), f"{where}: {type_name} expected"
        return [
            leaf for i, v in enumerate(value) for leaf in check_fields(v, inner[1], models, f"{where}[{i}]")
        ]
    if type_name in _PRIMITIVES:
        assert isinstance(value, _PRIMITIVES[type_name]), f"{where}: {type_name} expected, got {value!r}"
        return []
    if type_name not in models:
        return [(where, type_name, value)]  # a Kubernetes type (V1Container, V1Volume, V1ObjectMeta)
    model = models[type_name]
    fields = model.get("fields", model)
    assert isinstance(value, dict), f"{where}: object expected"
    unknown = sorted(set(value) - set(fields))
    assert not unknown, f"{where}: {unknown} are not fields of {type_name}"
    missing = sorted(set(model.get("required", ())) - set(value))
    assert not missing, f"{where}: required {missing} missing"
    return [leaf for k, v in value.items() for leaf in check_fields(v, fields[k], models, f"{where}.{k}")]


def _docs() -> tuple[dict[str, Any], dict[str, Any]]:
    return one(render(KSERVE / "base"), "ClusterStorageContainer"), one(
        render(KSERVE / "example"), "InferenceService"
    )


def _pod(storage: dict[str, Any], isvc: dict[str, Any]) -> dict[str, Any]:
    """The Pod KServe makes: the initializer with `SRC DEST` appended, the emptyDir, the ISVC's volumes."""
    predictor = isvc["spec"]["predictor"]
    init = copy.deepcopy(storage["spec"]["container"])
    init["args"] = [predictor["model"]["storageUri"], "/mnt/models"]
    init["volumeMounts"] = [
        *init["volumeMounts"],
        {"name": "kserve-provision-location", "mountPath": "/mnt/models"},
    ]
    server = {"name": "kserve-container", "image": "kserve/huggingfaceserver:v0.15.0"}
    for key in ("env", "volumeMounts"):
        server[key] = predictor["model"].get(key, [])
    server["volumeMounts"] = [
        *server["volumeMounts"],
        {"name": "kserve-provision-location", "mountPath": "/mnt/models", "readOnly": True},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llm-predictor", "namespace": isvc["metadata"]["namespace"]},
        "spec": {
            "initContainers": [init],
            "containers": [server],
            "volumes": [*predictor["volumes"], {"name": "kserve-provision-location", "emptyDir": {}}],
        },
    }


def test_storage_container_and_inference_service_validate() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    storage, isvc = _docs()
    assert storage["apiVersion"] == "serving.kserve.io/v1alpha1" and "namespace" not in storage["metadata"]
    leaves = check_fields(storage, "V1alpha1ClusterStorageContainer", STORAGE_SCHEMA["models"], "csc")
    assert sorted(t for _, t, _ in leaves) == ["V1Container", "V1ObjectMeta"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    leaves = check_fields(isvc["spec"], "V1beta1InferenceServiceSpec", ISVC_SCHEMA["models"], "isvc.spec")
    assert {t for _, t, _ in leaves} <= {"V1Volume", "V1EnvVar", "V1VolumeMount"}
    pod = _pod(storage, isvc)
    kubernetes_validate.validate(pod, "1.30.0", strict=True)
    # the volumes the initializer mounts are those the InferenceService declares (a Pod naming a volume it
    # lacks is refused by the API server, which the schema cannot see)
    declared = {v["name"] for v in pod["spec"]["volumes"]}
    for container in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
        assert {m["name"] for m in container["volumeMounts"]} <= declared, container["name"]
    # the schemas do refuse what KServe would: an unknown field, a wrong type, a missing required field
    for mutate in (
        lambda d: d["spec"].update(supportedUriFormat=[{"prefix": SCHEME}]),
        lambda d: d["spec"].update(supportsMultiModelDownload="yes"),
        lambda d: d["spec"].pop("supportedUriFormats"),
    ):
        bad = copy.deepcopy(storage)
        mutate(bad)
        with pytest.raises(AssertionError):
            check_fields(bad, "V1alpha1ClusterStorageContainer", STORAGE_SCHEMA["models"], "csc")


def test_storage_container_claims_only_our_prefix_and_runs_locked_down(cli) -> None:
    storage, isvc = _docs()
    spec = storage["spec"]
    container = spec["container"]
    assert spec["supportedUriFormats"] == [{"prefix": SCHEME}]  # never oci:// (KServe's modelcars)
    assert container["name"] == "storage-initializer"  # the name KServe finds its init container by
    assert "args" not in container  # KServe's SRC DEST are appended to the command, not replaced
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "memory" in container["resources"]["limits"] and container["resources"]["requests"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    for name in ("MODELSEC_POLICY", "MODELSEC_OCI_CA", "DOCKER_CONFIG"):
        assert any(env[name].startswith(m) for m in mounts), name  # every configured path is mounted
    assert all(m["readOnly"] for m in container["volumeMounts"])
    # the sample routes to this container, and its URI is one the initializer parses
    uri = isvc["spec"]["predictor"]["model"]["storageUri"]
    assert uri.startswith(SCHEME) and "@sha256:" in uri
    assert oci_reference(uri) == "oci://" + uri.removeprefix(SCHEME)
    # the container's command parses KServe's arguments: an oci:// SRC is a usage error naming our prefix
    assert container["command"][0] == "modelsec"
    result = cli(*container["command"][1:], "oci://" + uri.removeprefix(SCHEME), "/mnt/models")
    assert result.returncode == 2 and SCHEME in result.stderr
