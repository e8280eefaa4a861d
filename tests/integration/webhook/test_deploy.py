"""The kustomize manifests in deploy/webhook: they render, validate, and are safe to install.

Rendered with `kubectl kustomize` (kustomize ships with kubectl; the test is skipped, saying so, where
kubectl is missing). The core kinds are validated strictly against the Kubernetes OpenAPI schemas of the
PyPI package `kubernetes-validate`; it only warns on kinds it has no schema for (cert-manager's Certificate
and Issuer, prometheus-operator's ServiceMonitor), so those are checked here field by field.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest

from modelsec.webhook.review import WebhookConfig
from tests.unit.webhook.test_review import RESOURCE_KINDS

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "webhook"
OVERLAYS = ["cert-manager", "self-signed"]
CORE_API_VERSIONS = {"v1", "apps/v1", "policy/v1", "admissionregistration.k8s.io/v1"}
CORE_API_VERSIONS |= {"scheduling.k8s.io/v1", "networking.k8s.io/v1"}
OPT_IN = ("modelsec.dev/admission", "enabled")


def render(path: Path) -> list[dict[str, Any]]:
    import yaml

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (which ships kustomize) is not installed: the manifests cannot be rendered")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def selected(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and the four matchExpressions operators)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_render_and_validate_against_kubernetes_schemas(overlay: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(DEPLOY / "overlays" / overlay)
    kinds = {d["kind"] for d in docs}
    assert kinds >= {
        "Namespace",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "NetworkPolicy",
        "PriorityClass",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "Certificate",
    }
    for doc in docs:
        if doc["apiVersion"] in CORE_API_VERSIONS:
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
    broken = copy.deepcopy(one(docs, "ValidatingWebhookConfiguration"))
    broken["webhooks"][0]["timeoutSecond"] = 10
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30.0", strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_webhook_never_sees_kube_system_its_own_namespace_or_unlabelled_ones(overlay: str) -> None:
    docs = render(DEPLOY / "overlays" / overlay)
    own = one(docs, "Deployment")["metadata"]["namespace"]
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    selector = hook["namespaceSelector"]
    for name, opted_in, reviewed in [
        ("kube-system", True, False),
        (own, True, False),
        ("ml", False, False),
        ("ml", True, True),
    ]:
        labels = {"kubernetes.io/metadata.name": name}
        if opted_in:
            labels[OPT_IN[0]] = OPT_IN[1]
        assert selected(selector, labels) is reviewed, (name, opted_in)
    assert OPT_IN[0] not in one(docs, "Namespace")["metadata"].get("labels", {})


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_serving_certificate_and_ca_injection_agree(overlay: str) -> None:
    docs = render(DEPLOY / "overlays" / overlay)
    kinds = by_kind(docs)
    cert = kinds[("Certificate", "modelsec-webhook")]
    service = one(docs, "Service")
    namespace = service["metadata"]["namespace"]
    webhook = one(docs, "ValidatingWebhookConfiguration")
    inject = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert inject == f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
    assert f"{service['metadata']['name']}.{namespace}.svc" in cert["spec"]["dnsNames"]
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]  # injected, never a placeholder
    issuer = cert["spec"]["issuerRef"]
    if overlay == "self-signed":
        assert ("Issuer", issuer["name"]) in kinds
        ca = kinds[("Issuer", issuer["name"])]["spec"]["ca"]["secretName"]
        ca_cert = next(d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == ca)
        assert ca_cert["spec"]["isCA"] is True
        assert "selfSigned" in kinds[("Issuer", ca_cert["spec"]["issuerRef"]["name"])]["spec"]
    else:
        assert issuer["kind"] == "ClusterIssuer"


def test_webhook_configuration_covers_every_kind_and_the_deployment_is_safe() -> None:
    docs = render(DEPLOY / "overlays" / "self-signed")
    deployment, pdb, service = one(docs, "Deployment"), one(docs, "PodDisruptionBudget"), one(docs, "Service")
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert WebhookConfig().deadline_seconds < hook["timeoutSeconds"] <= 10
    assert hook["clientConfig"]["service"] == {
        "namespace": deployment["metadata"]["namespace"],
        "name": service["metadata"]["name"],
        "path": "/validate",
        "port": service["spec"]["ports"][0]["port"],
    }
    covered = set()
    for rule in hook["rules"]:
        assert rule["operations"] == ["CREATE", "UPDATE"]
        covered |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "pods/ephemeralcontainers") in covered
    assert covered - {("", "pods/ephemeralcontainers")} == set(RESOURCE_KINDS)
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert pdb["spec"]["minAvailable"] == 1 and selected(pdb["spec"]["selector"], labels)
    assert service["spec"]["selector"].items() <= labels.items()
    assert pod["spec"]["priorityClassName"] == one(docs, "PriorityClass")["metadata"]["name"]
    policy = one(docs, "NetworkPolicy")["spec"]
    assert selected(policy["podSelector"], labels) and policy["ingress"] == [
        {"ports": [{"port": 8443, "protocol": "TCP"}]}
    ]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The policy ConfigMap is mounted whole (no subPath), so the kubelet's updates reach the running
    # webhook, which reloads the file.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert "subPath" not in mounts["policy"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "items" not in volumes["policy"]["configMap"]


def test_deployment_args_parse_with_the_cli() -> None:
    from modelsec.cli.webhook import webhook

    docs = render(DEPLOY / "overlays" / "cert-manager")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["webhook", "serve"]
    # A copy: click caches the help option on the command it first makes a context for, and this context,
    # without the root group's `-h`, would leave `--help` alone in the man page test that follows.
    serve = copy.copy(webhook.commands["serve"])
    ctx = serve.make_context("serve", list(args[2:]))
    assert ctx.params["mode"] == "enforce" and ctx.params["port"] == 8443
    assert ctx.params["deadline"] < 10 and ctx.params["require_models_in"] == ()
    volumes = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(ctx.params["policy"].parent) in volumes
    # The evidence comes from the registry, not a store of the deployment's own; its cache bound is stated.
    assert ctx.params["store"] is None
    assert ctx.get_parameter_source("evidence_ttl") is click.core.ParameterSource.COMMANDLINE


def _registry_wiring(spec: dict[str, Any], container: dict[str, Any]) -> None:
    """The registry's credentials and CA reach the webhook as `RegistryOptions.from_env` reads them."""
    from modelsec.registry.client import RegistryOptions

    env = {e["name"]: e["value"] for e in container["env"]}
    options = RegistryOptions.from_env(env)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}

    def source(path: Path | None) -> tuple[dict[str, Any], str]:
        assert path is not None
        mount = mounts[str(path.parent)]
        assert mount["readOnly"] is True
        return volumes[mount["name"]], path.name

    # The Docker config is a `kubernetes.io/dockerconfigjson` Secret's key, as config.json.
    volume, name = source(options.docker_config)
    assert {"key": ".dockerconfigjson", "path": name} in volume["secret"]["items"]
    volume, name = source(options.ca_file)
    assert "configMap" in volume and name == "ca.crt"
    assert options.username is None and options.password is None  # never in the manifests


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_share_no_volume_and_read_evidence_from_the_registry(overlay: str, cli: Any) -> None:
    """Issue 28.4: no PVC, no volume shared across replicas; env and args are options of the CLI."""
    docs = render(DEPLOY / "overlays" / overlay)
    assert "PersistentVolumeClaim" not in {d["kind"] for d in docs}
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    spec = deployment["spec"]["template"]["spec"]
    # Each replica gets its own copy of every volume: Secrets and ConfigMaps (projected by the kubelet), or
    # an emptyDir; no claim, host path or network file system is mounted by two replicas.
    per_pod = {"secret", "configMap", "emptyDir", "projected", "downwardAPI"}
    for volume in spec["volumes"]:
        assert set(volume) - {"name"} <= per_pod, volume
    (container,) = spec["containers"]
    _registry_wiring(spec, container)
    # Every variable and option the manifest sets is one `modelsec webhook serve --help` documents.
    help_text = cli("webhook", "serve", "--help").stdout
    for name in (e["name"] for e in container["env"]):
        assert f"${name}" in help_text, name
    for arg in container["args"][2:]:
        assert arg.split("=", 1)[0] in help_text, arg


@pytest.mark.parametrize(
    ("component", "store"),
    [("directory-store", "/var/lib/modelsec/attestations"), ("grpc-store", "grpcs://")],
)
def test_store_components_add_a_store_that_the_cli_accepts(
    component: str, store: str, tmp_path: Path
) -> None:
    """The documented way back to a store of the deployment's own (deploy/README.md, "Upgrading")."""
    from modelsec.cli.webhook import webhook

    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    shutil.copytree(DEPLOY, tmp_path / "webhook")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../webhook/overlays/self-signed]\ncomponents: [../webhook/components/{component}]\n"
    )
    docs = render(overlay)
    for doc in docs:
        if doc["apiVersion"] in CORE_API_VERSIONS:
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ctx = copy.copy(webhook.commands["serve"]).make_context("serve", list(container["args"][2:]))
    assert ctx.params["store"].startswith(store)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for path in (ctx.params["store_ca"], ctx.params["store_client_cert"], ctx.params["store_client_key"]):
        if path is not None:
            assert mounts[str(path.parent)]["readOnly"] is True
    _registry_wiring(spec, container)  # the registry is still read
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    if component == "directory-store":
        (claim,) = claims
        mount = mounts[ctx.params["store"]]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    else:
        assert claims == []


def test_servicemonitor_component_scrapes_the_metrics_port(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copytree(DEPLOY, tmp_path / "webhook")
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../webhook/overlays/self-signed]\ncomponents: [../webhook/components/servicemonitor]\n"
    )
    docs = render(overlay)
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert selected(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (
        endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    )


def test_apiserver_only_component_admits_only_the_control_plane(tmp_path: Path) -> None:
    """The documented overlay (deploy/README.md, "Only the API server") renders and validates strictly."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copytree(DEPLOY, tmp_path / "webhook")
    readme = (DEPLOY.parent / "README.md").read_text()
    documented = readme.split("# my-overlay/kustomization.yaml\n", 1)[1].split("```", 1)[0]
    (overlay / "kustomization.yaml").write_text(documented.replace("../deploy/webhook/", "../webhook/"))
    docs = render(overlay)
    policy = one(docs, "NetworkPolicy")
    kubernetes_validate.validate(policy, "1.30.0", strict=True)
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selected(policy["spec"]["podSelector"], labels)
    assert policy["spec"]["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}], "ports": [{"port": 8443, "protocol": "TCP"}]}
    ]
    # The component alone keeps its placeholder, a documentation range (RFC 5737) that admits no one.
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../webhook/overlays/self-signed]\ncomponents: [../webhook/components/apiserver-only]\n"
    )
    (rule,) = one(render(overlay), "NetworkPolicy")["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "192.0.2.0/24"}}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_mutating_webhook_pins_before_validation_with_the_same_scope(overlay: str) -> None:
    """Same namespaces, kinds and failure policy as the validating webhook; reinvoked; CA injected."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(DEPLOY / "overlays" / overlay)
    mutating = one(docs, "MutatingWebhookConfiguration")
    kubernetes_validate.validate(mutating, "1.30.0", strict=True)
    (hook,) = mutating["webhooks"]
    (validating,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["sideEffects"] == "None" and hook["failurePolicy"] == validating["failurePolicy"] == "Fail"
    assert hook["namespaceSelector"] == validating["namespaceSelector"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert WebhookConfig().deadline_seconds < hook["timeoutSeconds"] <= 10
    assert hook["clientConfig"]["service"] == {**validating["clientConfig"]["service"], "path": "/mutate"}
    rules = list(validating["rules"])
    rules[0] = {**rules[0], "resources": ["pods"]}  # nothing is pinned through pods/ephemeralcontainers
    assert hook["rules"] == rules
    inject = mutating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert (
        inject
        == one(docs, "ValidatingWebhookConfiguration")["metadata"]["annotations"][
            "cert-manager.io/inject-ca-from"
        ]
    )
    assert "caBundle" not in hook["clientConfig"]
