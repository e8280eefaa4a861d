"""`modelsec webhook serve`: the Kubernetes validating admission webhook over HTTPS.

Only click is imported here at module level; the server (starlette, uvicorn, prometheus-client: the
`webhook` extra) loads inside the command so that `modelsec --help` stays fast. The command converts
options, builds a `Reviewer` and serves; no trust decision is taken here. Exit 1 with a diagnostic when the
policy, store, certificate or key cannot be loaded; 2 on usage errors.

The mode (`enforce | warn | audit`) is a property of the deployment, set with `--mode` (or
`$MODELSEC_WEBHOOK_MODE`): the same policy file can be rolled out in `audit`, then `warn`, then `enforce`.

Evidence lives with the model (DESIGN.md decision 18): the evidence of an `oci://` reference or a model image
is read from the referrers of that artifact in its own registry, and a policy's `attestationStore` is read
wherever it names one; `--store` (a directory or the gRPC service) is optional and read besides them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelsec.cli.common import json_option, registry_options, registry_options_value
from modelsec.cli.values import FiniteFloatRange

if TYPE_CHECKING:
    from modelsec.policy import Policy
    from modelsec.verifier.stores import AttestationStore
    from modelsec.webhook.review import WebhookConfig

__all__ = ["webhook"]


@click.group(name="webhook")
def webhook() -> None:
    """Kubernetes admission webhooks, validating and mutating (AdmissionReview v1 over HTTPS)."""


@webhook.command(name="serve")
@click.option(
    "--policy",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    envvar="MODELSEC_POLICY",
    help="Policy file (ModelPolicy, YAML or JSON); also $MODELSEC_POLICY.",
)
@click.option(
    "--store",
    metavar="DIR|grpcs://HOST:PORT",
    help="Optional attestation store read besides the model's own: a directory "
    "(<store>/sha256/<digest>/*.sig, see `modelsec attest put`) or the modelsec gRPC service's "
    "AttestationService (grpcs:// with TLS, grpc:// plaintext for development; bearer token from "
    "$MODELSEC_TOKEN). Without it, the evidence of an oci:// reference or model image is read from the "
    "referrers of that artifact in its own registry, and a policy's attestationStore wherever it names one.",
)
@click.option(
    "--store-tls-ca",
    "store_ca",
    type=click.Path(path_type=Path, dir_okay=False),
    help="CA bundle of the gRPC store's server certificate.",
)
@click.option(
    "--store-tls-cert",
    "store_client_cert",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Client certificate (PEM) for mutual TLS to the gRPC store.",
)
@click.option(
    "--store-tls-key",
    "store_client_key",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Client private key (PEM) for mutual TLS to the gRPC store, with --store-tls-cert.",
)
@click.option(
    "--tls-cert",
    "cert",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The webhook's TLS certificate (PEM).",
)
@click.option(
    "--tls-key",
    "key",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The webhook's TLS private key (PEM).",
)
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")  # noqa: S104
@click.option("--port", type=click.IntRange(0, 65535), default=8443, show_default=True, help="HTTPS port.")
@click.option(
    "--mode",
    type=click.Choice(["enforce", "warn", "audit"]),
    default="enforce",
    show_default=True,
    envvar="MODELSEC_WEBHOOK_MODE",
    help="enforce: deny; warn: allow with warnings; audit: allow, record only.",
)
@click.option(
    "--deadline",
    type=FiniteFloatRange(0.1, 30.0),
    default=8.0,
    show_default=True,
    help="Internal deadline per decision in seconds; keep it below the webhook's timeoutSeconds.",
)
@click.option(
    "--cache-ttl",
    type=FiniteFloatRange(0.0, 3600.0),
    default=60.0,
    show_default=True,
    help="Positive-cache TTL (s).",
)
@click.option(
    "--cache-on-outage",
    type=click.Choice(["deny", "serve"]),
    default="deny",
    show_default=True,
    help="When the store cannot be read: deny (even a cached model), or serve an unexpired cached allow.",
)
@click.option(
    "--evidence-ttl",
    type=FiniteFloatRange(0.0, 3600.0),
    default=30.0,
    show_default=True,
    help="Seconds what a registry (or a policy's store) answered is reused: the bound on how long an "
    "attestation withdrawn from the registry can still be served (0: read it for every decision).",
)
@click.option(
    "--evidence-negative-ttl",
    type=FiniteFloatRange(0.0, 3600.0),
    default=5.0,
    show_default=True,
    help="Seconds a registry miss (no manifest, referrer or binding) is reused; an outage is never cached.",
)
@registry_options
@click.option(
    "--require-models-in",
    "require_models_in",
    multiple=True,
    metavar="NAMESPACE_GLOB",
    help="Deprecated: use namespaceRules[].requireModel in the policy file (reloaded with it). Namespaces "
    "whose workloads must name a model (repeatable glob).",
)
@json_option
def _serve(
    policy: Path,
    store: str | None,
    store_ca: Path | None,
    store_client_cert: Path | None,
    store_client_key: Path | None,
    cert: Path,
    key: Path,
    host: str,
    port: int,
    mode: str,
    deadline: float,
    cache_ttl: float,
    cache_on_outage: str,
    evidence_ttl: float,
    evidence_negative_ttl: float,
    registry_ca: Path | None,
    plain_http: bool,
    require_models_in: tuple[str, ...],
    as_json: bool,
) -> None:
    """Serve POST /validate and /mutate, /healthz, /readyz and /metrics over HTTPS until SIGTERM.

    /mutate resolves the tags of covered model references in their registries and pins the digests
    (registry TLS and credentials: $MODELSEC_OCI_CA, $MODELSEC_OCI_USERNAME/_PASSWORD, $DOCKER_CONFIG).

    The evidence of a model in a registry is read from its referrers there (registry credentials from
    $MODELSEC_OCI_USERNAME / $MODELSEC_OCI_PASSWORD or a Docker config.json under $DOCKER_CONFIG) and kept
    for --evidence-ttl seconds: an attestation withdrawn from the registry can still be served that long.
    A registry that cannot be reached denies what it holds (fail closed), and the answer says so.

    With --json, a startup failure is the JSON reply with `error` (the server logs JSON lines on stderr).
    """
    from modelsec.cli.common import fail
    from modelsec.errors import BackendUnavailableError, Error
    from modelsec.observability import configure_json_logging, configure_tracing
    from modelsec.policy import PolicySet

    # Without the webhook extra this raises ModuleNotFoundError; the root command names the extra.
    from modelsec.webhook.mutate import Mutator, registry_resolver
    from modelsec.webhook.review import CacheOnOutage, Mode, Reviewer, WebhookConfig
    from modelsec.webhook.server import serve

    configure_json_logging(logging.INFO)
    configure_tracing("webhook")  # only with $MODELSEC_OTEL=1 (the otel extra)
    if require_models_in:
        logging.getLogger("modelsec.webhook").warning(
            "--require-models-in is deprecated: use namespaceRules[].requireModel in the policy file"
        )
    try:
        policies = PolicySet.from_file(policy)
        config = WebhookConfig(
            mode=Mode(mode),
            deadline_seconds=deadline,
            cache_ttl_seconds=cache_ttl,
            cache_on_outage=CacheOnOutage(cache_on_outage),
            require_models_in=require_models_in,
            evidence_ttl_seconds=evidence_ttl,
            evidence_negative_ttl_seconds=evidence_negative_ttl,
        )
        registry = registry_options_value(registry_ca, plain_http)
        reviewer = Reviewer(
            policies,
            None if store is None else _store(store, config, store_ca, store_client_cert, store_client_key),
            config,
            bindings=_oci_bindings(registry),
            registry=registry,
        )
        mutator = Mutator(reviewer, registry_resolver(registry))
        serve(reviewer, cert, key, host=host, port=port, policy_file=policy, mutator=mutator)
    except Error as e:
        fail(e, as_json)
    except OSError as e:  # the address cannot be bound, a TLS file cannot be read
        fail(BackendUnavailableError(f"{e.filename or f'{host}:{port}'}: {e.strerror or e}"), as_json)


def _oci_bindings(registry: Any) -> Callable[[str, Policy], set[str]]:
    """Root digests trusted bindings attach to an OCI manifest, read with `registry` (RegistryOptions)."""

    def bindings(reference: str, policy: Policy) -> set[str]:
        from modelsec.distribution.push_pull import bound_root_digests

        return bound_root_digests(reference, policy, options=registry)

    return bindings


def _store(
    spec: str, config: WebhookConfig, ca: Path | None, client_cert: Path | None, client_key: Path | None
) -> AttestationStore:
    """The store `--store` names (`modelsec.verifier.stores.open_store`: a directory or a store URI)."""
    import os

    from modelsec.errors import PolicyError
    from modelsec.verifier.stores import StoreOptions, open_store

    channel = None
    if spec.startswith(("grpc://", "grpcs://")):
        if (client_cert is None) != (client_key is None):
            raise click.UsageError("give both --store-tls-cert and --store-tls-key, or neither")
        from modelsec.cli.common import TOKEN_ENV
        from modelsec.service.client import ChannelOptions

        channel = ChannelOptions(
            ca=ca,
            cert=client_cert,
            key=client_key,
            token=os.environ.get(TOKEN_ENV) or None,
            timeout=config.deadline_seconds,
        )
    try:
        return open_store(spec, StoreOptions(max_bundles=config.max_bundles, channel=channel))
    except PolicyError as e:
        raise click.UsageError(
            f"--store {spec!r}: use a directory, grpcs://HOST:PORT or grpc://HOST:PORT "
            f"(or file://DIR, sqlite://FILE, postgresql://USER@HOST/DATABASE): {e.diagnostics()}"
        ) from e
