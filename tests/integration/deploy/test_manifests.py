"""The kustomize manifests of `modelsec serve` (deploy/serve), and the custom kinds of every overlay.

Rendered with `kubectl kustomize`, core kinds validated strictly with `kubernetes-validate` (as
tests/integration/webhook/test_deploy.py does for the webhook). `kubernetes-validate` only warns on kinds it
has no schema for, so cert-manager's Certificate and Issuer and prometheus-operator's ServiceMonitor, in the
serve and the webhook overlays, are validated with the schemas of the npm packages
`@kubernetes-models/cert-manager` and `@kubernetes-models/prometheus-operator` (installed by the Makefile's
`.test` target into .venv/k8s-models; validated by validate_crds.mjs under node). Those CRD schemas check
types, enums and required fields; they do not refuse unknown fields (the CRDs do not, either: the API server
prunes them).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.webhook.test_deploy import by_kind, one, render, selected

ROOT = Path(__file__).resolve().parents[3]
SERVE = ROOT / "deploy" / "serve"
WEBHOOK = ROOT / "deploy" / "webhook"
OVERLAYS = ["cert-manager", "self-signed"]
CORE_API_VERSIONS = {"v1", "apps/v1", "policy/v1", "scheduling.k8s.io/v1", "networking.k8s.io/v1"}
CORE_API_VERSIONS |= {"admissionregistration.k8s.io/v1"}
CRD_API_VERSIONS = {"cert-manager.io/v1", "monitoring.coreos.com/v1"}
K8S_MODELS = ROOT / ".venv" / "k8s-models" / "node_modules"


def validate_crds(docs: list[dict[str, Any]]) -> list[str | None]:
    """Per document: None when it is valid under its npm schema, else why not."""
    node = shutil.which("node")
    if node is None or not (K8S_MODELS / "@kubernetes-models" / "cert-manager").is_dir():
        pytest.skip("node or the @kubernetes-models schemas (make .venv/.test installs them) are missing")
    out = subprocess.run(
        [node, str(Path(__file__).with_name("validate_crds.mjs")), str(K8S_MODELS)],
        input=json.dumps(docs),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    results: list[str | None] = json.loads(out.stdout)
    return results


def with_monitor(tmp_path: Path, tree: Path, overlay: str) -> Path:
    """An overlay of `tree` with its ServiceMonitor component (commented out in the shipped overlays)."""
    shutil.copytree(tree, tmp_path / tree.name)
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../{tree.name}/overlays/{overlay}]\n"
        f"components: [../{tree.name}/components/servicemonitor]\n"
    )
    return tmp_path / "overlay"


@pytest.mark.slow
@pytest.mark.parametrize("tree", [SERVE, WEBHOOK], ids=["serve", "webhook"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_document_validates_custom_kinds_included(tree: Path, overlay: str, tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(with_monitor(tmp_path, tree, overlay))
    assert {"Certificate", "ServiceMonitor"} <= {d["kind"] for d in docs}
    custom = [d for d in docs if d["apiVersion"] in CRD_API_VERSIONS]
    assert len(custom) + len([d for d in docs if d["apiVersion"] in CORE_API_VERSIONS]) == len(docs)
    for doc in docs:
        if doc["apiVersion"] in CORE_API_VERSIONS:
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
    assert validate_crds(custom) == [None] * len(custom)
    # The schemas do refuse what cert-manager and the operator would: wrong types, enums, missing fields.
    monitor = one(docs, "ServiceMonitor")
    cert = next(d for d in custom if d["kind"] == "Certificate" and "privateKey" in d["spec"])
    broken = [copy.deepcopy(cert), copy.deepcopy(cert), copy.deepcopy(monitor), copy.deepcopy(monitor)]
    broken[0]["spec"]["duration"] = 2160
    broken[1]["spec"]["privateKey"]["algorithm"] = "DSA"
    broken[2]["spec"]["endpoints"][0]["port"] = 9464
    del broken[3]["spec"]["selector"]
    assert None not in validate_crds(broken)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_serve_deployment_is_safe_and_consistent(overlay: str) -> None:
    docs = render(SERVE / "overlays" / overlay)
    kinds = by_kind(docs)
    deployment, pdb, service = one(docs, "Deployment"), one(docs, "PodDisruptionBudget"), one(docs, "Service")
    pod = deployment["spec"]["template"]
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    assert deployment["spec"]["replicas"] >= 2 and pdb["spec"]["minAvailable"] == 1
    assert selected(pdb["spec"]["selector"], labels) and service["spec"]["selector"].items() <= labels.items()
    assert spec["priorityClassName"] == one(docs, "PriorityClass")["metadata"]["name"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    # Writable places are volumes: the guard's snapshot directory, caches, /tmp (serve's state: PostgreSQL).
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    env = {e["name"]: e for e in container["env"]}
    for path in (env["MODELSEC_SNAPSHOT_DIR"]["value"], env["XDG_CACHE_HOME"]["value"], "/tmp"):
        mount = next(m for p, m in mounts.items() if path == p or path.startswith(p + "/"))
        assert not mount.get("readOnly") and "emptyDir" in volumes[mount["name"]]
    # The OCI store's credentials come from a Secret, never from the manifests.
    for name, key in (("MODELSEC_OCI_USERNAME", "username"), ("MODELSEC_OCI_PASSWORD", "password")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "modelsec-oci-credentials", "key": key}
    assert not [d for d in docs if d["kind"] == "Secret"]
    # Only the service's ports are open.
    netpol = one(docs, "NetworkPolicy")["spec"]
    assert selected(netpol["podSelector"], labels)
    open_ports = {p["port"] for rule in netpol["ingress"] for p in rule["ports"]}
    assert open_ports == {p["containerPort"] for p in container["ports"]}
    # TLS: the certificate's Secret is what the pod mounts, for the Service's DNS name.
    cert = kinds[("Certificate", "modelsec-serve")]
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]
    namespace = service["metadata"]["namespace"]
    assert f"{service['metadata']['name']}.{namespace}.svc" in cert["spec"]["dnsNames"]
    issuer = cert["spec"]["issuerRef"]
    if overlay == "self-signed":
        ca = kinds[("Issuer", issuer["name"])]["spec"]["ca"]["secretName"]
        ca_cert = next(d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == ca)
        assert ca_cert["spec"]["isCA"] is True
        assert "selfSigned" in kinds[("Issuer", ca_cert["spec"]["issuerRef"]["name"])]["spec"]
    else:
        assert issuer["kind"] == "ClusterIssuer"


def test_serve_args_and_config_map_load_with_the_cli() -> None:
    import yaml

    from modelsec.cli.service import serve
    from modelsec.config import validate
    from modelsec.service.config import ServerConfig

    docs = render(SERVE / "overlays" / "self-signed")
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][0] == "serve"
    # A copy: click caches the help option on the command it first makes a context for, and this context,
    # without the root group's `-h`, would leave `--help` alone in the man page test that follows.
    ctx = copy.copy(serve).make_context("serve", list(container["args"][1:]))
    config_path = ctx.params["config_path"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_map = volumes[mounts[str(config_path.parent)]]["configMap"]["name"]
    rendered = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == config_map)
    config = validate(ServerConfig, yaml.safe_load(rendered["data"][config_path.name]), "server.yaml")
    # Every file the configuration names is in a mounted volume; the TLS files are the certificate's.
    for path in (config.policy, config.tls.cert, config.tls.key, config.tls.client_ca):  # type: ignore[union-attr]
        assert str(Path(path).parent) in mounts, path
    assert mounts[str(Path(config.tls.cert).parent)] == "tls"  # type: ignore[union-attr]
    assert volumes[mounts[str(Path(config.policy).parent)]]["configMap"]["name"] == "modelsec-policy"
    # Replicas keep no state of their own: the record store is one PostgreSQL, its URL from a Secret.
    assert config.data_dir is None and config.store is not None and config.store.url_env
    (url_env,) = [e for e in container["env"] if e["name"] == config.store.url_env]
    db_secret = url_env["valueFrom"]["secretKeyRef"]["name"]
    assert volumes[mounts["/etc/modelsec/db"]]["secret"]["secretName"] == db_secret
    listen_port = int(config.listen.rsplit(":", 1)[1])
    metrics_port = int((config.metrics_listen or "").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": listen_port, "metrics": metrics_port}
    # Readiness follows the shared database (a replica whose store is down leaves the endpoints); liveness
    # does not (a restart would not bring the database back).
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert config.grace_period < spec["terminationGracePeriodSeconds"]


def test_serve_servicemonitor_scrapes_the_metrics_port(tmp_path: Path) -> None:
    docs = render(with_monitor(tmp_path, SERVE, "cert-manager"))
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert selected(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
