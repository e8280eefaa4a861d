"""`modelsec attest ...`: list, show, put, push, pull and delete the attestations about a model.

Registered on the root group by `modelsec.cli.main`. The commands convert options, call the stores
(`modelsec.verifier.stores`), the service client or `inspect_bundle`, and print: nothing is trusted by
filing or fetching a bundle, and a signer is named only when a --trusted-key verifies it. `delete` is an
authorised operation: exit 0 when the record is gone from what readers get, exit 1 otherwise (diagnostic on
stderr, or the JSON envelope). Who may delete is the store's access control: a directory's file
permissions, the SQLite file's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from modelsec.cli.common import (
    digest_str,
    fail,
    json_option,
    key_password_option,
    key_password_sources,
    limits,
    open_signing_key,
    provenance_inputs,
    provenance_options,
    reply,
    server_client,
    server_options,
    signer_json,
    signer_text,
    skipped_note,
    trusted_keys_option,
)
from modelsec.cli.values import root_digest_value
from modelsec.errors import Error, MalformedArtifactError

__all__ = ["attest", "attest_delete"]


@click.group(name="attest")
def attest() -> None:
    """List and show the attestations about a model (weights signatures, watermark, robustness gate)."""


def _attestation_rows(model_dir: Path, store: str | None, keys: tuple[Path, ...]) -> list[dict[str, Any]]:
    """The bundles about MODEL_DIR (its reserved names, and the store's for the digests they name).

    With keys, a default-named weights signature signed by a key of another scheme than its name says is
    refused, as `verify` refuses it (`check_bundle_name`; the attestation names and store entries name no
    scheme).

    Raises:
        MalformedArtifactError: MODEL_DIR is missing or not a directory (as `digest` and `verify` say).
        PolicyViolationError: MODEL_DIR is a symlink.
        SignatureError: A default-named bundle of another scheme than its name (`check_bundle_name`).
    """
    from modelsec.modelformat.model_files import open_model_root
    from modelsec.signer.keys import load_trusted_key_file
    from modelsec.signer.layout import find_attestation_files, find_default_bundles
    from modelsec.verifier.inspection import inspect_bundle, require_one_checked
    from modelsec.verifier.stores import StoreOptions, open_store
    from modelsec.verifier.trust.bundles import check_bundle_name

    os.close(open_model_root(model_dir))  # a missing path is an error, not an empty list
    trusted = [load_trusted_key_file(k) for k in keys]
    found = (*find_default_bundles(model_dir), *find_attestation_files(model_dir))
    paths = [p for p in found if p.is_file()]
    seen = [inspect_bundle(p, trusted, limits=limits(), skip_unverifiable=True) for p in paths]
    for path, b in zip(paths, seen, strict=True):
        if b.signer is not None:
            check_bundle_name(path, b.signer)  # verify's rule for the default weights-signature names
    require_one_checked(seen, trusted, str(model_dir))
    if store is not None:
        digests = sorted({s.digest.get("sha256", "") for b in seen for s in b.statement.subjects} - {""})
        opened = open_store(store, StoreOptions(limits=limits()))
        try:
            for digest in digests:
                # As for the local bundles (and as verify does): a bundle no configured key can check is
                # listed as skipped, not a failure of the whole listing.
                seen += [
                    inspect_bundle(e, trusted, limits=limits(), skip_unverifiable=True)
                    for e in opened.entries(digest)
                ]
        finally:
            opened.close()
    return [
        {
            "path": str(b.source),
            "predicateType": b.statement.predicate_type,
            "signer": signer_json(b.signer),
            "skipped": b.skipped,
            "subjects": [
                {"name": s.name, "digests": [digest_str(v, a) for a, v in s.digest.items()]}
                for s in b.statement.subjects
            ],
            "predicate": dict(b.statement.predicate),
        }
        for b in seen
    ]


@attest.command(name="list")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--store",
    help="Also list what an attestation store (a directory or file://, sqlite://, postgresql://, "
    "grpc(s):// URI) holds about the model's digest.",
)
@trusted_keys_option(
    "Trusted public key PEM (repeatable): check each signature (role by predicate "
    "type; unknown types are refused)."
)
@json_option
def _attest_list(model_dir: Path, store: str | None, keys: tuple[Path, ...], as_json: bool) -> None:
    """One line per bundle about MODEL_DIR: predicate type, subject, signer (UNVERIFIED without a key)."""
    try:
        rows = _attestation_rows(model_dir, store, keys)
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply({"bundles": [{k: v for k, v in r.items() if k != "predicate"} for r in rows]})
        return
    for r in rows:
        skipped_note(r)
        digests = [d for s in r["subjects"] for d in s["digests"] if d.startswith("sha256:")]
        digest = (digests[0] if digests else "sha256:?")[:23]
        click.echo(f"{r['predicateType']:<45} {digest}…  {signer_text(r['signer']):<30} {r['path']}")


@attest.command(name="put")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--store",
    required=True,
    help="The attestation store: a directory (<store>/sha256/<digest>/<id>.sig) or a file://, sqlite://, "
    "postgresql:// URI (password from $PGPASSWORD or $PGPASSFILE, never the command line).",
)
@json_option
def _attest_put(bundles: tuple[Path, ...], store: str, as_json: bool) -> None:
    """File BUNDLES in a store by their subject's root digest (verified when read, not here)."""
    from modelsec.verifier.stores import StoreOptions, open_store

    try:
        opened = open_store(store, StoreOptions(limits=limits()))
        try:
            written = [opened.put(_read_bundle_file(b))[0].source for b in bundles]
        finally:
            opened.close()
    except OSError as e:
        raise click.UsageError(f"cannot write to the store: {e}") from e
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply({"stored": [str(p) for p in written]})
    else:
        for p in written:
            click.echo(f"stored {p}")


@attest.command(name="push")
@click.argument("args", nargs=-1, required=True, metavar="[STORE] BUNDLE...")
@server_options(required=False)
@json_option
def _attest_push(
    args: tuple[str, ...],
    server: str | None,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    as_json: bool,
) -> None:
    """Store BUNDLE... in STORE, or with --server in the service's store (which verifies each first).

    STORE is a directory or a file://, sqlite://, postgresql://, grpc(s)://, oci://REGISTRY/REPOSITORY URI (a
    PostgreSQL password from $PGPASSWORD or $PGPASSFILE); a store files
    each bundle by its subject's root digest without trusting it (`oci://` attaches it as a referrer of the
    manifest `modelsec push` tagged `oms-sha256-<digest>`), and readers verify it. With $MODELSEC_SERVER
    set, name a directory store as file://. Exit 1 at the first bundle the store or server refuses.
    """
    ctx = click.get_current_context()
    from_command_line = ctx.get_parameter_source("server") == click.core.ParameterSource.COMMANDLINE
    if "://" in args[0] or server is None:
        if from_command_line:
            raise click.UsageError("give STORE or --server, not both")
        if len(args) < 2:
            raise click.UsageError("give STORE and at least one BUNDLE (or --server HOST:PORT)")
        _push_to_store(args[0], [Path(a) for a in args[1:]], as_json)
        return
    results = []
    with server_client(server, server_ca, client_cert, client_key, token_env, plaintext) as client:
        for path in map(Path, args):
            try:
                response = client.put_attestation(_read_bundle_file(path))
            except Error as e:
                fail(e.add_context(str(path)), as_json)
            a = response.attestation
            results.append(
                {
                    "path": str(path),
                    "id": a.id,
                    "rootDigest": digest_str(a.root_digest),
                    "predicateType": a.predicate_type,
                    "signer": a.signer,
                    "created": response.created,
                }
            )
            if not as_json:
                state = "stored" if response.created else "already stored"
                click.echo(f"{state} {path} as {a.id[:16]}… ({a.predicate_type}, signer {a.signer})")
    if as_json:
        reply({"stored": results})


def _read_bundle_file(path: Path) -> bytes:
    """An attestation bundle given on the command line, at most `Limits.max_bundle_bytes`.

    Raises:
        MalformedArtifactError: Missing, unreadable, not a regular file (a FIFO is refused, never waited on),
            or larger than the bundle limit; the message names `path`.
    """
    from modelsec.errors import MalformedArtifactError
    from modelsec.safe_io import read_regular_file

    limit = limits().max_bundle_bytes
    return read_regular_file(path, "attestation bundle", max_bytes=limit, error=MalformedArtifactError)


def _push_to_store(store: str, paths: list[Path], as_json: bool) -> None:
    """`attest push STORE BUNDLE...`: file each bundle in the store by URI (nothing verified here)."""
    from modelsec.attestations.bundle import parse_bundle
    from modelsec.attestations.statement import parse_statement
    from modelsec.verifier.stores import StoreOptions, open_store

    results = []
    try:
        opened = open_store(store, StoreOptions(limits=limits(), must_exist=False))
    except Error as e:
        fail(e, as_json)
    try:
        for path in paths:
            try:
                data = _read_bundle_file(path)
                entry, created = opened.put(data)
                statement = parse_statement(
                    parse_bundle(data, source=str(path)).envelope.payload, what=str(path)
                )
            except Error as e:
                fail(e.add_context(str(path)), as_json)
            row = {
                "path": str(path),
                "id": entry.id,
                "rootDigest": digest_str(entry.root_digest),
                "predicateType": statement.predicate_type,
                "source": entry.source,
                "created": created,
            }
            results.append(row)
            if not as_json:
                state = "stored" if created else "already stored"
                click.echo(
                    f"{state} {path} as {entry.id[:16]}… ({statement.predicate_type}) in {entry.source}"
                )
    finally:
        opened.close()
    if as_json:
        reply({"stored": results})


@attest.command(name="pull")
@click.argument("root_digest", callback=root_digest_value)
@server_options(required=True)
@click.option(
    "--out",
    help="Write the bundles into this store (a directory: <out>/sha256/<digest>/<id>.sig, or a file://, "
    "sqlite://, postgresql:// URI), e.g. a policy's attestationStore; without it, only list them.",
)
@json_option
def _attest_pull(
    root_digest: str,
    server: str,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    out: str | None,
    as_json: bool,
) -> None:
    """Fetch every bundle the service stores about ROOT_DIGEST (hex, optionally prefixed `sha256:`).

    Nothing is trusted by fetching: a verifier checks the bundles against its own policy when it reads them.
    """
    from modelsec.verifier.stores import StoreOptions, open_store

    digest = root_digest.removeprefix("sha256:").lower()
    rows = []
    with server_client(server, server_ca, client_cert, client_key, token_env, plaintext) as client:
        try:
            target = None if out is None else open_store(out, StoreOptions(limits=limits(), must_exist=False))
            for item in client.get_attestations(digest):
                a = item.attestation
                row = {
                    "id": a.id,
                    "predicateType": a.predicate_type,
                    "signer": a.signer,
                    "storedAt": a.stored_at,
                }
                if target is not None:
                    row["path"] = target.put(item.bundle)[0].source
                rows.append(row)
            if target is not None:
                target.close()
        except Error as e:
            fail(e, as_json)
        except OSError as e:
            raise click.UsageError(f"cannot write to {out}: {e.strerror}") from e
    if as_json:
        reply({"rootDigest": digest_str(digest), "bundles": rows})
        return
    for r in rows:
        click.echo(f"{r['predicateType']:<45} {r['signer']:<30} {r.get('path', r['id'])}")
    if not rows:
        click.echo(f"no stored bundles about sha256:{digest}", err=True)


@attest.command(name="show")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--store", help="Also show what an attestation store holds about the model's digest.")
@trusted_keys_option(
    "Trusted public key PEM (repeatable): check each signature (role by predicate "
    "type; unknown types are refused)."
)
@json_option
def _attest_show(model_dir: Path, store: str | None, keys: tuple[Path, ...], as_json: bool) -> None:
    """Print every bundle's statement about MODEL_DIR as indented JSON (signer null without --trusted-key).

    With --json the same bundles come as the `bundles` field of one JSON reply.
    """
    try:
        rows = _attestation_rows(model_dir, store, keys)
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply({"bundles": rows})
    else:
        click.echo(json.dumps(rows, indent=2, default=str))


@attest.command(name="delete")
@click.argument("store")
@click.option(
    "--digest",
    "digest",
    required=True,
    metavar="[sha256:]HEX",
    callback=root_digest_value,
    help="The model root digest the record is filed under.",
)
@click.option(
    "--id", "bundle_id", required=True, metavar="ID", help="The record's id (as `attest list` shows)."
)
@click.option(
    "--supersede",
    is_flag=True,
    help="Keep the record but withdraw it from readers (SQLite and PostgreSQL keep it for audit; a directory "
    "removes it).",
)
@json_option
def attest_delete(store: str, digest: str, bundle_id: str, supersede: bool, as_json: bool) -> None:
    """Delete (or supersede) the record ID about DIGEST in STORE.

    STORE is a directory or a file://, sqlite:// or postgresql:// URI.
    """
    from modelsec.limits import Limits
    from modelsec.verifier.stores import StoreOptions, open_store

    digest = digest.removeprefix("sha256:")
    try:
        opened = open_store(store, StoreOptions(limits=Limits()))
        try:
            (opened.supersede if supersede else opened.delete)(digest, bundle_id)
        finally:
            opened.close()
    except Error as e:
        fail(e, as_json)
    verb = "superseded" if supersede else "deleted"
    if as_json:
        reply({verb: {"rootDigest": digest, "id": bundle_id}})
    else:
        click.echo(f"{verb} {bundle_id} (sha256:{digest}) in {store}")


def _statement_signer_options(f: Any) -> Any:
    """The signer (a local key, a `pkcs11:` URI, or a --server key version) and where the bundle goes."""
    f = click.option(
        "--force",
        is_flag=True,
        help="Replace an existing bundle at --out (without it: exit 1, nothing written).",
    )(f)
    f = click.option(
        "--store",
        help="Also file the bundle in an attestation store: a directory or a file://, sqlite://, "
        "postgresql://, grpc(s)://, or oci://REGISTRY/REPOSITORY URI (a referrer of the manifest "
        "`modelsec push` tagged oms-sha256-<digest>).",
    )(f)
    f = click.option(
        "--out",
        type=click.Path(path_type=Path, dir_okay=False),
        help="Where to write the bundle (default: beside the model, MODEL_DIR/model.attestations/<type>.sig, "
        "a folder every signature leaves out; '-' with --store: nowhere else).",
    )(f)
    f = server_options(required=False)(f)
    f = click.option(
        "--key-version", metavar="NAME/VERSION", help="A key version held by the --server (signs there)."
    )(f)
    f = key_password_option(f)
    return click.option(
        "--signing-key",
        "signing_key",
        type=click.Path(path_type=Path),
        help="Private key PEM, or a pkcs11: URI (RFC 7512; its PIN from its pin-source).",
    )(f)


def _open_statement_signer(
    signing_key: Path | None,
    key_passwords: tuple[str, ...],
    key_version: str | None,
    server: str | None,
    connection: tuple[Path | None, Path | None, Path | None, str, bool],
) -> tuple[Any, Any]:
    """(signer, client to close or None) for --signing-key or --server/--key-version.

    Raises:
        click.UsageError: Neither or both are given.
        KeyMaterialError, BackendUnavailableError: As `open_signing_key`; or the server's errors.
    """
    if (signing_key is None) == (key_version is None):
        raise click.UsageError("give --signing-key KEY, or --server with --key-version")
    if signing_key is not None:
        return open_signing_key(signing_key, key_password_sources(key_passwords, [signing_key])), None
    if not server:
        raise click.UsageError("--key-version needs --server")
    from modelsec.service.client import RemoteSigner

    client = server_client(server, *connection)
    try:
        return RemoteSigner(client, str(key_version)), client
    except Error:
        client.close()
        raise


def _sign_model_statement(
    model_dir: Path,
    prepare: Callable[[], Callable[[str], Any]],
    signer_spec: tuple[Path | None, tuple[str, ...], str | None, str | None],
    connection: tuple[Path | None, Path | None, Path | None, str, bool],
    destination: tuple[Path | None, str | None, bool],
    as_json: bool,
) -> None:
    """`attest sign` / `attest provenance`: the steps after their own inputs.

    Reads and checks the inputs (`prepare`, before any password prompt or server call), opens the signer,
    hashes the model once, builds the statement about its root digest, signs it, writes and reports it.
    """
    from modelsec.signer.statements import model_root_digest, sign_statement_with

    client = None
    try:
        make = prepare()
        signer, client = _open_statement_signer(*signer_spec, connection)
        built = make(model_root_digest(model_dir, limits=limits()))
        out, store, force = destination
        _emit_statement(
            sign_statement_with(built, signer, limits=limits()), model_dir, out, store, force, as_json
        )
    except Error as e:
        fail(e, as_json)
    except OSError as e:
        raise click.UsageError(f"cannot write: {e}") from e
    finally:
        if client is not None:
            client.close()


def _emit_statement(
    signed: Any, model_dir: Path, out: Path | None, store: str | None, force: bool, as_json: bool
) -> None:
    """Write a signed statement beside the model (or to --out) and/or into --store, and report it.

    Raises:
        BundleExistsError: --out exists and not --force.
        PolicyError: --out cannot be written.
        The store's errors (`open_store`, `put`).
    """
    from modelsec.attestations.predicates.generic import predicate_slug
    from modelsec.errors import PolicyError
    from modelsec.signer.layout import STATEMENTS_DIR_NAME, write_bundle_file
    from modelsec.verifier.stores import StoreOptions, open_store

    statement = signed.statement
    if out is None:
        folder = model_dir / STATEMENTS_DIR_NAME
        if folder.is_symlink():
            raise PolicyError(f"{folder}: refusing to write attestations through a symlink")
        folder.mkdir(exist_ok=True)
        out = folder / f"{predicate_slug(statement.predicate_type)}.sig"
    written = None
    if str(out) != "-":
        written = str(write_bundle_file(out, signed.bundle, what="attestation bundle", replace=force))
    elif store is None:
        raise click.UsageError("--out - writes nothing: give --store")
    stored = None
    if store is not None:
        opened = open_store(store, StoreOptions(limits=limits(), must_exist=False))
        try:
            stored = opened.put(signed.bundle)[0].source
        finally:
            opened.close()
    digest = statement.subjects[0].digest["sha256"]
    if as_json:
        reply(
            {
                "rootDigest": digest_str(digest),
                "predicateType": statement.predicate_type,
                "path": written,
                "stored": stored,
            }
        )
        return
    for where in (written, stored):
        if where is not None:
            click.echo(f"signed {statement.predicate_type} about sha256:{digest} -> {where}")


@attest.command(name="sign")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--predicate-type", required=True, metavar="URI", help="The statement's predicateType URI.")
@click.option(
    "--predicate",
    "predicate_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="A JSON file holding the predicate object.",
)
@_statement_signer_options
@json_option
def _attest_sign(
    model_dir: Path,
    predicate_type: str,
    predicate_file: Path,
    signing_key: Path | None,
    key_passwords: tuple[str, ...],
    key_version: str | None,
    server: str | None,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    out: Path | None,
    store: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Sign an in-toto statement of any predicate type about MODEL_DIR's root digest.

    The predicate (a JSON object in FILE) is signed as it is, with the model root digest (computed from the
    files, as `sign` hashes them) as the subject. A type modelsec registers (gate, watermark) must parse as
    its own commands write it. Verifiers select it by predicate type (policy conditions).
    """
    from modelsec.attestations.predicates.generic import model_statement, parse_predicate_document
    from modelsec.safe_io import read_regular_file

    def prepare() -> Any:
        data = read_regular_file(
            predicate_file, "predicate", max_bytes=limits().max_bundle_bytes + 1, error=MalformedArtifactError
        )
        predicate = parse_predicate_document(data, what=str(predicate_file), limits=limits())
        return lambda root: model_statement(
            root, predicate_type, predicate, name=model_dir.resolve().name, what=str(predicate_file)
        )

    _sign_model_statement(
        model_dir,
        prepare,
        (signing_key, key_passwords, key_version, server),
        (server_ca, client_cert, client_key, token_env, plaintext),
        (out, store, force),
        as_json,
    )


@attest.command(name="provenance")
@click.argument("model_dir", type=click.Path(path_type=Path))
@provenance_options
@_statement_signer_options
@json_option
def _attest_provenance(
    model_dir: Path,
    source_repo: str | None,
    source_commit: str | None,
    source_dir: Path | None,
    datasets: list[Any],
    base_models: tuple[Path, ...],
    signing_key: Path | None,
    key_passwords: tuple[str, ...],
    key_version: str | None,
    server: str | None,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    out: Path | None,
    store: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Sign SLSA v1 provenance about MODEL_DIR: builder from the CI environment, code, data, base models.

    The builder and invocation are read from GitHub Actions (GITHUB_*), GitLab CI (CI_*) or the generic
    MODELSEC_BUILDER_ID / MODELSEC_BUILD_TYPE / MODELSEC_INVOCATION_ID / MODELSEC_SOURCE_REPO /
    MODELSEC_SOURCE_COMMIT variables; outside CI the provenance says it is a local build. Default output:
    MODEL_DIR/model.attestations/slsa.dev-provenance-v1.sig.
    """
    from modelsec.attestations.predicates.provenance import provenance_statement

    def prepare() -> Any:
        inputs = provenance_inputs(source_repo, source_commit, source_dir, datasets, base_models)
        return lambda root: provenance_statement(
            root,
            name=model_dir.resolve().name,
            environment=inputs.environment,
            sources=inputs.sources,
            datasets=inputs.datasets,
            base_models=inputs.base_models,
        )

    _sign_model_statement(
        model_dir,
        prepare,
        (signing_key, key_passwords, key_version, server),
        (server_ca, client_cert, client_key, token_env, plaintext),
        (out, store, force),
        as_json,
    )
