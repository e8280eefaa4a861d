"""`modelsec policy test`: the admission decisions a policy file makes, without a cluster.

As `kyverno apply` and `gator test` do for their policies: each object of the workload files goes through
the mutating webhook (`modelsec.webhook.mutate`: tags resolved in the registry, digests pinned) and then,
patched, through the validating webhook (`modelsec.webhook.review`), exactly as `modelsec webhook serve`
would answer the API server: same policies, same registry access (TLS and credentials from
`--registry-ca`, `$MODELSEC_OCI_CA`, `$MODELSEC_OCI_USERNAME`/`_PASSWORD`, `$DOCKER_CONFIG`). Only click is
imported at module level. No trust decision is taken here.

Exit codes: 0 every reviewed object admitted, 1 any denied, 2 usage (a bad option, or a policy or workload
file that cannot be read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelsec.cli.common import json_option, registry_options, registry_options_value, reply

if TYPE_CHECKING:
    from modelsec.webhook.mutate import Mutation
    from modelsec.webhook.review import Decision

__all__ = ["policy"]

_MAX_WORKLOAD_BYTES = 16 * 2**20


@click.group(name="policy")
def policy() -> None:
    """Policy files: try one on workloads before a cluster does."""


@policy.command(name="test")
@click.argument("policy_file", metavar="POLICY", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "-f",
    "--filename",
    "files",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Workload YAML or JSON (repeatable; multi-document, `kind: List` expanded).",
)
@click.option(
    "--store",
    metavar="DIR|URI",
    help="Attestation store the validating webhook also reads: a directory or a store URI (file://, "
    "sqlite://, postgresql://, oci://REGISTRY/REPOSITORY), as `modelsec webhook serve --store`; the evidence "
    "of a model in a registry is read from its referrers there, as the webhook does.",
)
@click.option(
    "--namespace",
    default="default",
    show_default=True,
    help="Namespace of the objects whose metadata names none.",
)
@registry_options
@json_option
def _test(
    policy_file: Path,
    files: tuple[Path, ...],
    store: str | None,
    namespace: str,
    registry_ca: Path | None,
    plain_http: bool,
    as_json: bool,
) -> None:
    """Print the decisions the webhooks would make for each object of the -f files under POLICY.

    For each Pod, workload, InferenceService or TrainedModel: the mutating webhook's answer (its JSON patch:
    tags pinned to digests, MODELSEC_MODEL_DIGEST and MODELSEC_POLICY injected), then the validating
    webhook's verdict on the patched object. Other kinds are listed as skipped (the webhooks are not
    called for them). Exit 0 when every object is admitted, 1 when any is denied.
    """
    from modelsec.distribution.push_pull import bound_root_digests
    from modelsec.errors import Error
    from modelsec.policy import Policy, PolicySet
    from modelsec.verifier.stores import StoreOptions, open_store
    from modelsec.webhook.mutate import Mutator, registry_resolver
    from modelsec.webhook.review import Reviewer, WebhookConfig

    try:
        policies = PolicySet.from_file(policy_file)
        objects = [obj for path in files for obj in _objects(path)]
        config = WebhookConfig()
        attestations = (
            None if store is None else open_store(store, StoreOptions(max_bundles=config.max_bundles))
        )
        options = registry_options_value(registry_ca, plain_http)
    except Error as e:
        raise click.UsageError(e.diagnostics()) from e

    def bindings(reference: str, matched: Policy) -> set[str]:
        return bound_root_digests(reference, matched, options=options)

    reviewer = Reviewer(policies, attestations, config, bindings=bindings, registry=options)
    mutator = Mutator(reviewer, registry_resolver(options))
    results = [_decide(reviewer, mutator, namespace, n, *obj) for n, obj in enumerate(objects, 1)]
    denied = sum(1 for r in results if r["admitted"] is False)
    admitted = sum(1 for r in results if r["admitted"] is True)
    skipped = len(results) - denied - admitted
    if as_json:
        reply({"results": results, "admitted": admitted, "denied": denied, "skipped": skipped}, ok=not denied)
    else:
        for result in results:
            _print(result)
        click.echo(f"{len(results)} objects: {admitted} admitted, {denied} denied, {skipped} skipped")
    if denied:
        raise SystemExit(1)


def _objects(path: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """The objects of a workload file: `(file, document number, object)`.

    Raises:
        PolicyError: Unreadable, not YAML, or a document that is not an object with apiVersion and kind.
    """
    import yaml

    from modelsec.errors import PolicyError
    from modelsec.safe_io import read_regular_file

    raw = read_regular_file(path, "workload file", max_bytes=_MAX_WORKLOAD_BYTES, error=PolicyError)
    try:
        docs = list(yaml.safe_load_all(raw))
    except yaml.YAMLError as e:
        raise PolicyError(f"{path}: not valid YAML/JSON: {' '.join(str(e).split())}") from e
    except RecursionError:
        raise PolicyError(f"{path}: not valid YAML/JSON: nested too deeply") from None
    out: list[tuple[str, int, dict[str, Any]]] = []
    for n, doc in enumerate(docs, 1):
        if doc is None:
            continue
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
        if not isinstance(items, list):
            raise PolicyError(f"{path}: document {n}: a List's items must be a list")
        for item in items:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("apiVersion"), str)
                and isinstance(item.get("kind"), str)
            ):
                raise PolicyError(f"{path}: document {n}: not a Kubernetes object with apiVersion and kind")
            # Through JSON, as the API server sends it (YAML timestamps become strings).
            out.append((str(path), n, json.loads(json.dumps(item, default=str))))
    return out


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _review(uid: str, group: str, version: str, kind: str, namespace: str, obj: dict[str, Any]) -> bytes:
    """The AdmissionReview v1 the API server sends for creating `obj`."""
    metadata = _metadata(obj)
    name = metadata.get("name") or metadata.get("generateName") or ""
    gvk = {"group": group, "version": version, "kind": kind}
    request = {
        "uid": uid,
        "kind": gvk,
        "requestKind": gvk,
        "name": name,
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "modelsec-policy-test"},
        "object": obj,
        "dryRun": False,
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode()


def _decide(
    reviewer: Any, mutator: Any, default_namespace: str, n: int, path: str, doc: int, obj: dict[str, Any]
) -> dict[str, Any]:
    """One object through both webhooks; `admitted` is None when they would not be called for it."""
    from modelsec.webhook.sources import covered

    group, _, version = obj["apiVersion"].rpartition("/")
    kind = obj["kind"]
    metadata = _metadata(obj)
    namespace = metadata.get("namespace") or default_namespace
    result: dict[str, Any] = {
        "file": path,
        "document": doc,
        "apiVersion": obj["apiVersion"],
        "kind": kind,
        "namespace": namespace,
        "name": metadata.get("name") or metadata.get("generateName") or "",
        "admitted": None,
        "mutation": None,
        "validation": None,
    }
    if not covered(group, kind):
        return result
    mutation: Mutation = mutator.review(_review(f"policy-test-{n}-m", group, version, kind, namespace, obj))
    result["mutation"] = _decision_fields(mutation.decision) | {
        "patch": list(mutation.patch),
        "pin": mutation.pin,
    }
    if not mutation.decision.allowed or mutation.patched is None:
        result["admitted"] = False
        return result
    patched = dict(mutation.patched)
    body = _review(f"policy-test-{n}-v", group, version, kind, namespace, patched)
    decision: Decision = reviewer.review(body)
    result["validation"] = _decision_fields(decision) | {"references": decision.audit_record()["references"]}
    result["admitted"] = decision.allowed
    return result


def _decision_fields(decision: Decision) -> dict[str, Any]:
    return {
        "allowed": decision.allowed,
        "reason": decision.reason,
        "messages": list(decision.messages),
        "warnings": list(decision.warnings),
    }


def _print(result: dict[str, Any]) -> None:
    where = f"{result['file']}, document {result['document']}"
    title = f"{result['kind']} {result['namespace']}/{result['name']} ({where})"
    if result["admitted"] is None:
        click.echo(f"{title}: skipped (the webhooks do not review this kind)")
        return
    click.echo(f"{title}: {'admitted' if result['admitted'] else 'DENIED'}")
    mutation = result["mutation"]
    verdict = "allow" if mutation["allowed"] else "deny"
    click.echo(f"  mutate: {verdict} ({mutation['reason']}), {len(mutation['patch'])} patch operations")
    for op in mutation["patch"]:
        click.echo(f"    {op['op']} {op['path']} {json.dumps(op['value'])}")
    for message in mutation["messages"] + mutation["warnings"]:
        click.echo(f"    {message}")
    validation = result["validation"]
    if validation is None:
        return
    verdict = "allow" if validation["allowed"] else "deny"
    click.echo(f"  validate: {verdict} ({validation['reason']})")
    for ref in validation["references"]:
        click.echo(f"    {'ok' if ref['allowed'] else 'refused'} {ref['reference']}: {ref['detail']}")
    for message in ([] if validation["references"] else validation["messages"]) + validation["warnings"]:
        click.echo(f"    {message}")
