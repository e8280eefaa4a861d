"""`modelsec push` / `pull` / `copy` / `storage-initializer`: models as OCI artifacts, evidence as referrers.

Only click is imported at module level; `modelsec.distribution.push_pull` (and `requests`, the `oci` extra)
loads inside the commands. No trust decision is taken here: the commands convert options and call
`push_model` / `pull_model` / `copy_model`. Registry credentials come from `$MODELSEC_OCI_USERNAME` /
`$MODELSEC_OCI_PASSWORD` or a Docker `config.json` (`$DOCKER_CONFIG`), never from the command line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelsec.cli.common import (
    digest_str,
    fail,
    json_option,
    key_password_option,
    key_password_sources,
    open_signing_key,
    progress_status,
    registry_options,
    registry_options_value,
    reply,
    trusted_keys_option,
)
from modelsec.cli.values import oci_reference_value
from modelsec.errors import Error

if TYPE_CHECKING:
    from modelsec.distribution.push_pull import SkippedReferrer

__all__ = ["copy", "pull", "push", "storage_initializer"]


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
        with progress_status(f"push: {reference}", not as_json):
            result = push_model(
                model_dir, reference, policy, key, options=registry_options_value(registry_ca, plain_http)
            )
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
        with progress_status(f"pull: {reference}", not as_json):
            result = pull_model(
                reference, destination, policy, options=registry_options_value(registry_ca, plain_http)
            )
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
                "skipped": [
                    {"referrer": s.referrer, "kind": s.kind, "reason": s.reason, "detail": s.detail}
                    for s in result.skipped
                ],
                "notes": list(result.notes),
            }
        )
        return
    click.echo(
        f"OK {result.path}: {result.files} files, model sha256:{result.root_digest} "
        f"({result.manifest_digest})"
    )
    if result.skipped:
        click.echo(f"  note: {_skipped_summary(result.skipped, result.path)}", err=True)
        ctx = click.get_current_context(silent=True)
        if ctx is not None and ctx.find_root().params.get("verbose"):
            for skipped in result.skipped:
                click.echo(f"    skipped {skipped.detail}", err=True)
    for note in result.notes:
        click.echo(f"  note: {note}", err=True)


_SKIPPED_REASONS = {
    "untrusted-key": "signed by a key not trusted here",
    "invalid-signature": "with an invalid signature",
    "other-manifest": "about another manifest",
    "other-model": "about another model",
    "not-evidence": "not evidence",
    "unread": "not read",
    "malformed": "malformed",
}


def _skipped_summary(skipped: Sequence[SkippedReferrer], destination: Path) -> str:
    """One line: how many referrers of which kind were skipped and why; signatures are not placed."""
    from collections import Counter

    counts = Counter((s.kind, _SKIPPED_REASONS.get(s.reason, s.reason)) for s in skipped)
    parts = [f"{n} {kind}{'s' if n > 1 else ''} {why}" for (kind, why), n in counts.items()]
    unplaced = sum(1 for s in skipped if s.kind == "signature")
    placed = f"; {'they are' if unplaced > 1 else 'it is'} not in {destination}" if unplaced else ""
    return f"skipped {', '.join(parts)}{placed} (modelsec --verbose pull lists each referrer)"


@click.command(name="copy")
@click.argument("source", metavar="oci://REGISTRY/REPOSITORY(:TAG|@sha256:HEX)", callback=oci_reference_value)
@click.argument("destination", metavar="oci://REGISTRY/REPOSITORY[:TAG]", callback=oci_reference_value)
@click.option(
    "--verify",
    "verify_first",
    is_flag=True,
    help="Verify the model at the source first, as pull does, under --trusted-key, --policy or "
    "$MODELSEC_POLICY (implied by --trusted-key and --policy).",
)
@click.option(
    "--destination-registry-ca",
    type=click.Path(path_type=Path, dir_okay=False),
    help="CA bundle of the destination registry's TLS certificate (default: that of the source).",
)
@_policy_options
@registry_options
@json_option
def copy(
    source: str,
    destination: str,
    verify_first: bool,
    destination_registry_ca: Path | None,
    keys: tuple[Path, ...],
    policy_file: Path | None,
    registry_ca: Path | None,
    plain_http: bool,
    as_json: bool,
) -> None:
    """Copy a model, its blobs and its evidence referrers from SOURCE to DESTINATION, by digest.

    The manifest keeps its digest, so the bindings copied with it stay valid; a copy without its
    referrers (skopeo, crane) is refused by pull. On a terminal, a status line shows each step.
    """
    from modelsec.distribution.copy import copy_model
    from modelsec.progress import step

    try:
        policy = _policy(keys, policy_file, source) if verify_first or keys or policy_file else None
        options = registry_options_value(registry_ca, plain_http)
        with progress_status(f"copy: {source}", not as_json):
            result = copy_model(
                source,
                destination,
                policy=policy,
                source_options=options,
                destination_options=registry_options_value(destination_registry_ca, plain_http)
                if destination_registry_ca
                else None,
                progress=lambda line: step(f"copy: {line}"),
            )
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply(
            {
                "reference": result.reference,
                "manifestDigest": result.manifest_digest,
                "blobs": result.blobs,
                "bytes": result.bytes,
                "referrers": list(result.referrers),
                "tags": list(result.tags),
                "skipped": list(result.skipped),
                "verified": result.verified,
            }
        )
        return
    click.echo(
        f"copied {result.reference} ({result.blobs} blobs, {result.bytes} bytes, "
        f"{len(result.referrers)} referrers{', verified first' if result.verified else ''})"
    )
    for reason in result.skipped:
        click.echo(f"  note: not copied {reason}", err=True)


def _storage_pairs(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> list[tuple[str, Path]]:
    """KServe's arguments `SRC DEST [SRC DEST]...` as pairs, each SRC a `modelsec+oci://` reference."""
    from modelsec.distribution.initializer import SCHEME, oci_reference

    if not value or len(value) % 2:
        raise click.BadParameter("give SRC_URI DEST_PATH pairs (KServe appends them to the command)")
    pairs = []
    for src, dest in zip(value[::2], value[1::2], strict=True):
        if not src.startswith(SCHEME):
            raise click.BadParameter(
                f"{src!r} is not a {SCHEME} URI: the storage initializer serves the {SCHEME} prefix only "
                "(KServe pulls oci:// itself, as a modelcar)"
            )
        try:
            oci_reference(src)
        except Error as e:
            raise click.BadParameter(e.diagnostics()) from e
        pairs.append((src, Path(dest)))
    return pairs


def _log(record: dict[str, Any]) -> None:
    """The one JSON line of the initializer's log (stderr: KServe keeps an init container's log)."""
    sys.stderr.write(json.dumps({"component": "modelsec.storage-initializer", **record}, default=str) + "\n")


@click.command(name="storage-initializer")
@click.argument(
    "pairs",
    nargs=-1,
    required=True,
    metavar="SRC_URI DEST_PATH [SRC_URI DEST_PATH]...",
    callback=_storage_pairs,
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Policy file (default: $MODELSEC_POLICY); the artifact is matched as oci://REGISTRY/REPOSITORY.",
)
@registry_options
@json_option
def storage_initializer(
    pairs: list[tuple[str, Path]],
    policy_file: Path | None,
    registry_ca: Path | None,
    plain_http: bool,
    as_json: bool,
) -> None:
    """KServe storage initializer: pull each modelsec+oci:// SRC_URI into DEST_PATH after it verifies.

    KServe runs it as the init container of a ClusterStorageContainer whose supportedUriFormats prefix is
    modelsec+oci:// and appends SRC_URI DEST_PATH (one pair per storage URI; DEST_PATH is /mnt/models).
    SRC_URI is modelsec+oci://REGISTRY/REPOSITORY@sha256:HEX (a tag is resolved and the digest logged).
    The model, its binding and its evidence are verified in a staging directory on DEST_PATH's file
    system, and only then renamed into DEST_PATH: a directory to create, or an empty one (the emptyDir);
    one that holds files is refused and left untouched.

    Configuration from the environment: $MODELSEC_POLICY (the policy file), registry credentials from
    $MODELSEC_OCI_USERNAME/$MODELSEC_OCI_PASSWORD or a Docker config.json in $DOCKER_CONFIG, the
    registry's CA in $MODELSEC_OCI_CA. One JSON line per model on stderr says what was verified (or
    refused; with --json, the same records are also the reply on stdout). Exit codes: 0 every model placed,
    1 a model refused (nothing of it placed; the pairs after it are not tried), 2 usage.
    """
    from modelsec.distribution.initializer import initialize_model, oci_reference
    from modelsec.registry.client import parse_reference

    placed: list[dict[str, Any]] = []
    for src, dest in pairs:
        reference = oci_reference(src)
        try:
            admission = _policy((), policy_file, reference)
            with progress_status(f"storage-initializer: {src}", not as_json):
                result = initialize_model(
                    src, dest, admission, options=registry_options_value(registry_ca, plain_http)
                )
        except Error as e:
            where = {"source": src, "destination": str(dest)}
            _log({"ok": False, **where, "error": {"kind": type(e).__name__, "message": e.diagnostics()}})
            if as_json:
                reply({"models": placed, **where}, ok=False, kind=type(e).__name__, message=e.diagnostics())
            sys.exit(1)
        record = {
            "source": src,
            "destination": str(dest),
            "reference": f"{parse_reference(reference).repository_uri}@{result.manifest_digest}",
            "manifestDigest": result.manifest_digest,
            "rootDigest": f"sha256:{result.root_digest}",
            "files": result.files,
            "policy": {"file": admission.source, "names": [p.name for p in admission.policies]},
            "signers": list(result.signers),
            "ignored": list(result.ignored),
        }
        _log({"ok": True, **record})
        placed.append(record)
    if as_json:
        reply({"models": placed})
