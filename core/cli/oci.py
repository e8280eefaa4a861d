"""`modelsec push` / `modelsec pull`: models as OCI artifacts (CNCF ModelPack) with evidence as referrers.

Only click is imported at module level; `modelsec.distribution.push_pull` (and `requests`, the `oci` extra)
loads inside the commands. No trust decision is taken here: the commands convert options and call
`push_model` / `pull_model`. Registry credentials come from `$MODELSEC_OCI_USERNAME` /
`$MODELSEC_OCI_PASSWORD` or a Docker `config.json` (`$DOCKER_CONFIG`), never from the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from modelsec.cli.common import (
    digest_str,
    fail,
    json_option,
    key_password_option,
    key_password_sources,
    open_signing_key,
    reply,
    trusted_keys_option,
)
from modelsec.cli.values import oci_reference_value
from modelsec.errors import Error

__all__ = ["pull", "push", "registry_options"]


def registry_options(f: Any) -> Any:
    """`--registry-ca` and `--plain-http` (credentials come from the environment, never from options)."""
    f = click.option(
        "--registry-ca",
        type=click.Path(path_type=Path, dir_okay=False),
        help="CA bundle of the registry's TLS certificate (default: the system roots; or $MODELSEC_OCI_CA).",
    )(f)
    return click.option(
        "--plain-http", is_flag=True, help="Speak HTTP to the registry (development registries only)."
    )(f)


def _policy_options(f: Any) -> Any:
    f = trusted_keys_option(
        "Trusted public key PEM (repeatable; weights signatures and the manifest binding). Without it, "
        "--policy or $MODELSEC_POLICY decides."
    )(f)
    return click.option(
        "--policy",
        "policy_file",
        type=click.Path(path_type=Path, dir_okay=False),
        help="Policy file; the artifact is matched as oci://REGISTRY/REPOSITORY.",
    )(f)


def _policy(keys: tuple[Path, ...], policy_file: Path | None, reference: str) -> Any:
    from modelsec.policy import Policy, PolicySet
    from modelsec.registry.client import parse_reference
    from modelsec.verifier.admission import admit

    if keys and policy_file:
        raise click.UsageError("give --trusted-key or --policy, not both")
    if keys:
        return Policy.from_key_files(keys)
    policy_set = PolicySet.from_file(policy_file) if policy_file else PolicySet.from_env()
    return admit(policy_set, parse_reference(reference).repository_uri)


def _options(registry_ca: Path | None, plain_http: bool) -> Any:
    from modelsec.registry.client import RegistryOptions

    return RegistryOptions.from_env(ca_file=registry_ca, plain_http=plain_http or None)


@click.command(name="push")
@click.argument("model_dir", type=click.Path(path_type=Path, file_okay=False))
@click.argument("reference", metavar="oci://REGISTRY/REPOSITORY[:TAG]", callback=oci_reference_value)
@click.option(
    "--signing-key",
    "signing_key",
    type=click.Path(path_type=Path),
    required=True,
    help="Private key that signs the binding of the OCI manifest digest to the model root digest "
    "(readers need its public key with the weights role).",
)
@key_password_option
@_policy_options
@registry_options
@json_option
def push(
    model_dir: Path,
    reference: str,
    signing_key: Path,
    key_passwords: tuple[str, ...],
    keys: tuple[Path, ...],
    policy_file: Path | None,
    registry_ca: Path | None,
    plain_http: bool,
    as_json: bool,
) -> None:
    """Verify MODEL_DIR and push it as a ModelPack artifact, its bundles attached as referrers."""
    from modelsec.distribution.push_pull import push_model

    try:
        policy = _policy(keys, policy_file, reference)
        key = open_signing_key(signing_key, key_password_sources(key_passwords, [signing_key]))
        result = push_model(model_dir, reference, policy, key, options=_options(registry_ca, plain_http))
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply(
            {
                "reference": result.reference,
                "manifestDigest": result.manifest_digest,
                "rootDigest": digest_str(result.root_digest),
                "layers": result.layers,
                "referrers": list(result.referrers),
            }
        )
        return
    click.echo(
        f"pushed {result.reference} ({result.layers} layers, model sha256:{result.root_digest}, "
        f"{len(result.referrers)} referrers)"
    )


@click.command(name="pull")
@click.argument("reference", metavar="oci://REGISTRY/REPOSITORY@sha256:HEX", callback=oci_reference_value)
@click.argument("destination", type=click.Path(path_type=Path))
@_policy_options
@registry_options
@json_option
def pull(
    reference: str,
    destination: Path,
    keys: tuple[Path, ...],
    policy_file: Path | None,
    registry_ca: Path | None,
    plain_http: bool,
    as_json: bool,
) -> None:
    """Pull a ModelPack artifact into DESTINATION (created) only after it and its evidence verify."""
    from modelsec.distribution.push_pull import pull_model

    try:
        policy = _policy(keys, policy_file, reference)
        result = pull_model(reference, destination, policy, options=_options(registry_ca, plain_http))
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply(
            {
                "path": str(result.path),
                "manifestDigest": result.manifest_digest,
                "rootDigest": digest_str(result.root_digest),
                "files": result.files,
                "ignored": list(result.ignored),
            }
        )
        return
    click.echo(
        f"OK {result.path}: {result.files} files, model sha256:{result.root_digest} "
        f"({result.manifest_digest})"
    )
    for reason in result.ignored:
        click.echo(f"  note: ignored {reason}", err=True)
