"""The `modelsec` command line (click). Commands convert arguments, call the public API, map errors.

Exit codes: 0 success; 1 the model/signature must not be trusted or the operation failed (diagnostic on
stderr, or a JSON object on stdout with `--json`); 2 usage errors (click). Heavy modules are imported
inside the commands so that `modelsec --version` and `--help` start fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from modelsec import __version__
from modelsec._cli_attest import attest_delete
from modelsec._cli_common import (
    PASSWORD_ENV,
    POLICY_ENV,
    _digest_str,
    _fail,
    _ignore_paths_option,
    _json_option,
    _key_password_option,
    _key_password_sources,
    _open_signing_key,
    _option,
    _quiet_option,
    _read_password_source,
    _reply,
    _server_client,
    _server_options,
    _signatures_option,
    _signing_keys_option,
    _trusted_keys_option,
    _usage_error_reply,
    _write_key_file,
)
from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import Error, SignatureError


@contextlib.contextmanager
def _progress(path: Path, description: str, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar over the bytes under `path`, on stderr when it is a terminal; None otherwise.

    The tree is walked for its size only when a bar is shown (never with --json, --quiet or off a terminal).
    """
    total = _tree_size(path) if enabled and sys.stderr.isatty() else 0
    if total <= 0:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


class _Main(click.Group):
    """The root group: one line and a conventional exit code for what no command handles itself.

    A missing optional extra ends any command with one line naming the extra (exit 1); Ctrl-C ends it with
    one line and exit 130 (128 + SIGINT, the shell convention) instead of click's "Aborted!" and exit 1.
    Under `--json`, each of these and every usage error (exit 2) is the JSON reply of `_reply` instead.
    """

    def invoke(self, ctx: click.Context) -> Any:
        from modelsec._lazy import missing_extra

        args = list(ctx.args)  # the subcommand's arguments (click empties ctx.args while invoking it)
        as_json = "--json" in args
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if not as_json:
                raise
            _usage_error_reply(e, self._invoked(ctx, args))
            ctx.exit(2)
        except KeyboardInterrupt:
            command = self._invoked(ctx, args)
            message = f"modelsec {command} interrupted (Ctrl-C)"
            if as_json:
                _reply(ok=False, kind="Interrupted", message=message, command=command)
            else:
                click.echo(f"modelsec: error: {message}", err=True)
            ctx.exit(130)
        except ModuleNotFoundError as e:
            command = self._invoked(ctx, args)
            extra = missing_extra(e.name, command.partition(" ")[0])
            if extra is None:
                raise
            message = (
                f"modelsec {command} needs {e.name}, which is not installed: pip install 'modelsec[{extra}]'"
            )
            if as_json:
                _reply(
                    ok=False,
                    kind="MissingExtraError",
                    message=message,
                    error_fields={"extra": extra},
                    command=command,
                )
            else:
                click.echo(f"modelsec: error: {message}", err=True)
            ctx.exit(1)

    def _invoked(self, ctx: click.Context, args: list[str]) -> str:
        """The words of the command that ran, e.g. `attest list` (`args`: those after the first word)."""
        command = ctx.invoked_subcommand or ""
        if isinstance(self.get_command(ctx, command), click.Group) and args and not args[0].startswith("-"):
            command = f"{command} {args[0]}"
        return command


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="modelsec")
def main() -> None:
    """Sign, watermark, gate and verify sharded safetensors models.

    Typical CI flow: `modelsec keygen`, `modelsec sign MODEL_DIR --signing-key ci.key.pem`; on the
    deployment side: `modelsec verify MODEL_DIR --trusted-key ci.pub.pem`. Exit codes: 0 ok, 1 refused or
    failed, 2 usage. Key options say which key: --signing-key (private), --trusted-key (public),
    --watermark-key, --tls-key/--tls-cert. Every command takes --json (one object on stdout).
    """
    # The node audit lines (`modelsec.audit`) are for serving processes; a command reports on stdout/stderr.
    logging.getLogger("modelsec.audit").addHandler(logging.NullHandler())


@main.command(name="keygen")
@click.option(
    "--algorithm",
    "-a",
    # The enum is the registry's name list (tests/unit/signer/test_schemes.py); importing the registry here
    # would load `modelsec.signer` and `cryptography` for every CLI start.
    type=click.Choice([a.value for a in SignatureAlgorithm]),
    default=SignatureAlgorithm.ECDSA_P256.value,
    show_default=True,
    help="ecdsa-p256 (OMS/model_signing interop), ecdsa-p384, sm2 (SM2 with SM3, GB/T 32918), or "
    "ml-dsa-44/65/87 (FIPS 204).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="Output prefix: writes PREFIX.key.pem (mode 0600) and PREFIX.pub.pem.",
)
@click.option(
    "--encrypt",
    is_flag=True,
    help=f"Encrypt the private key; the password comes from --key-password, else ${PASSWORD_ENV}, else a "
    "prompt on a terminal.",
)
@click.option(
    "--key-password",
    "key_password",
    metavar="env:VAR|file:PATH",
    help="With --encrypt: read the password from $VAR or from a file (one trailing newline dropped).",
)
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@_json_option
def _keygen(
    algorithm: str, out: Path, encrypt: bool, key_password: str | None, force: bool, as_json: bool
) -> None:
    """Generate a signing key pair (PKCS#8 private key, SubjectPublicKeyInfo public key)."""
    from modelsec.errors import KeyMaterialError
    from modelsec.signer.keys import generate_private_key_pem

    if key_password is not None and not encrypt:
        raise click.UsageError("--key-password needs --encrypt")
    if key_password is not None and (
        key_password.partition(":")[0] not in ("env", "file") or not key_password.partition(":")[2]
    ):
        raise click.UsageError("--key-password: expected env:VAR or file:PATH")
    private_path = Path(f"{out}.key.pem")
    public_path = Path(f"{out}.pub.pem")
    try:
        password = None
        if key_password is not None:
            password = _read_password_source(key_password, f"{private_path} (--key-password)")
        elif encrypt and os.environ.get(PASSWORD_ENV):
            password = os.environ[PASSWORD_ENV].encode("utf-8")
        elif encrypt and sys.stdin.isatty():
            password = click.prompt("Password", hide_input=True, confirmation_prompt=True).encode("utf-8")
        elif encrypt:
            raise KeyMaterialError(
                f"keygen --encrypt: no terminal to ask for the password: set ${PASSWORD_ENV}, or give "
                "--key-password env:VAR or --key-password file:PATH"
            )
        private, public = generate_private_key_pem(SignatureAlgorithm(algorithm), password=password)
        for path, data, mode in ((private_path, private, 0o600), (public_path, public, 0o644)):
            _write_key_file(path, data, mode, force=force)
    except Error as e:
        _fail(e, as_json)
    if as_json:
        _reply({"algorithm": algorithm, "privateKey": str(private_path), "publicKey": str(public_path)})
    else:
        click.echo(f"wrote {private_path} and {public_path} ({algorithm})")


_TENSOR_DIGESTS = [HashAlgorithm.BLAKE3.value, HashAlgorithm.SHA256.value, HashAlgorithm.SM3.value, "none"]


@main.command(name="sign")
@click.argument("model_dir", type=click.Path(path_type=Path))
@_signing_keys_option(
    "Private key PEM (repeatable: one bundle per key; old spellings --key, -k). An encrypted key's "
    "password: see --key-password."
)
@_key_password_option
@click.option(
    "--key-version",
    "key_versions",
    multiple=True,
    metavar="NAME/VERSION",
    help="A key version held by the --server (repeatable): hash here, sign there; the key never leaves it.",
)
@click.option(
    "--pin-key",
    "pins",
    type=click.Path(path_type=Path, dir_okay=False),
    multiple=True,
    help="Expected public key PEM of each --key-version, in the same order (refuse any other key).",
)
@_server_options(required=False)
@_signatures_option(
    "Bundle output path, one per key (local --signing-key first, then --key-version, in order; default: "
    "model.sig, model.p384.sig, model.sm2.sig in MODEL_DIR)."
)
@click.option(
    "--tensor-digest",
    type=click.Choice(_TENSOR_DIGESTS),
    default="blake3",
    show_default=True,
    help="Per-tensor digest algorithm recorded in the modelsec extension ('none': plain OMS).",
)
@click.option(
    "--allow-unverifiable",
    is_flag=True,
    help="Sign even when MODEL_DIR holds pickle files (pytorch_model.bin, *.pt, ...) or *.py code, which "
    "verification under the default policy always refuses (refused here by default).",
)
@_ignore_paths_option(
    "Leave this path (a file, or a directory with everything below it) out of the signature and record it "
    "in the signed ignore list (repeatable; as model_signing's --ignore-paths, relative to the current "
    "directory; paths outside MODEL_DIR are dropped)."
)
@_json_option
@_quiet_option
def _sign(
    model_dir: Path,
    keys: tuple[Path, ...],
    key_passwords: tuple[str, ...],
    key_versions: tuple[str, ...],
    pins: tuple[Path, ...],
    server: str | None,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    signatures: tuple[Path, ...],
    tensor_digest: str,
    allow_unverifiable: bool,
    ignore_paths: tuple[Path, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Hash every file of MODEL_DIR once and write one signature bundle per key.

    Keys are local PEM files (--signing-key) or key versions held by a modelsec signing service (--server with
    --key-version): the manifest is built here and only the statement (digests, no weights) is sent; each
    returned bundle is checked to sign exactly that statement with the server's (or the pinned) key.

    Without a terminal (CI), unencrypted keys need nothing; each encrypted key takes its password from its
    own --key-password source, else from $MODELSEC_KEY_PASSWORD, e.g.
    `sign M --signing-key ci-p256.key.pem --signing-key ci-sm2.key.pem
    --key-password ci-sm2.key.pem=env:SM2_KEY_PASSWORD`.
    """
    from modelsec.signer import sign_model
    from modelsec.signer.signing import relative_ignore_paths

    if not keys and not key_versions:
        raise click.UsageError("give --signing-key, or --server with --key-version")
    if key_versions and not server:
        raise click.UsageError("--key-version needs --server")
    if pins and len(pins) != len(key_versions):
        raise click.UsageError("give one --pin-key per --key-version, or none")
    if signatures and len(signatures) != len(keys) + len(key_versions):
        raise click.UsageError("give one --signature per key, or none")
    sources = _key_password_sources(key_passwords, list(keys))
    client = None
    try:
        signers: list[Any] = [_open_signing_key(k, sources) for k in keys]
        if key_versions:
            from modelsec.service.client import RemoteSigner

            client = _server_client(str(server), server_ca, client_cert, client_key, token_env, plaintext)
            signers += [
                RemoteSigner(client, v, expected_public_key_pem=pins[i].read_bytes() if pins else None)
                for i, v in enumerate(key_versions)
            ]
        if not signatures and len({s.algorithm for s in signers}) < len(signers):
            raise click.UsageError(
                "two keys of one algorithm would write the same bundle; give --signature for each key"
            )
        with _progress(model_dir, "hashing", not (quiet or as_json)) as progress:
            result = sign_model(
                model_dir,
                signers,
                signature_paths=dict(enumerate(signatures)) or None,
                tensor_hash=None if tensor_digest == "none" else HashAlgorithm(tensor_digest),
                progress=progress,
                refuse_unverifiable=not allow_unverifiable,
                ignore_paths=relative_ignore_paths(model_dir, ignore_paths),
            )
    except Error as e:
        _fail(e, as_json)
    except OSError as e:
        raise click.UsageError(f"cannot read {e.filename}: {e.strerror}") from e
    finally:
        if client is not None:
            client.close()
    if as_json:
        _reply(
            {
                "rootDigest": _digest_str(result.root_digest),
                "files": result.files,
                "tensors": result.tensors,
                "bundles": [
                    {"path": str(b.path), "algorithm": b.algorithm.value, "keyid": b.keyid}
                    for b in result.bundles
                ],
            }
        )
        return
    click.echo(
        f"signed {result.files} files, {result.tensors} tensors; "
        f"model root digest sha256:{result.root_digest}"
    )
    for b in result.bundles:
        click.echo(f"  {b.algorithm.value:<10} -> {b.path}")


def _signature_hint(e: Error, model_path: Path, signatures: tuple[Path, ...]) -> str | None:
    """The CLI's advice for a model without default bundles (the library's message names no option)."""
    from modelsec.verifier import find_default_bundles

    if signatures or not isinstance(e, SignatureError):
        return None
    model_dir = model_path if model_path.is_dir() else model_path.parent
    return None if find_default_bundles(model_dir) else "give --signature"


def _policy_from_options(
    model_path: Path,
    keys: tuple[Path, ...],
    policy_file: Path | None,
    required: list[SignatureAlgorithm],
    allow_remote_code: bool,
) -> Any:
    """A Policy from --trusted-key options, or from --policy / $MODELSEC_POLICY (options only tighten it)."""
    import dataclasses

    from modelsec.policy import Policy, PolicySet

    if keys and policy_file:
        raise click.UsageError("give --trusted-key or --policy, not both")
    if keys:
        return Policy.from_key_files(keys, require=required, allow_remote_code=allow_remote_code)
    if not policy_file and not os.environ.get(POLICY_ENV):
        raise click.UsageError(f"give --trusted-key, --policy, or set ${POLICY_ENV}")
    policy_set = PolicySet.from_file(policy_file) if policy_file else PolicySet.from_env()
    policy = policy_set.for_model(model_path)
    if allow_remote_code and not policy.allow_remote_code:
        raise click.UsageError("--allow-remote-code cannot loosen a policy file; set allowRemoteCode there")
    return dataclasses.replace(policy, require_algorithms=policy.require_algorithms | set(required))


def _parse_require(value: str | None) -> list[SignatureAlgorithm]:
    if not value:
        return []
    try:
        return [SignatureAlgorithm(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        choices = ", ".join(a.value for a in SignatureAlgorithm)
        raise click.BadParameter(f"{value!r}: choose from {choices}", param_hint="--require") from None


@main.command(name="verify")
@click.argument("model_path", type=click.Path(path_type=Path))
@_trusted_keys_option(
    "Trusted public key PEM (repeatable; old spellings --key, -k). Keys are never taken from the bundle. "
    f"Without --trusted-key, the policy file of --policy or ${POLICY_ENV} decides."
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path),
    help="Policy file (YAML/JSON, kind ModelPolicy); the model is matched as file://<real path>.",
)
@click.option(
    "--shard",
    "shards",
    multiple=True,
    metavar="NAME",
    help="Verify only this signed file of MODEL_PATH (repeatable), e.g. the shard a node holds.",
)
@_signatures_option(
    "Bundle to check (repeatable; default: model.sig, model.p384.sig, model.sm2.sig found in the "
    "model directory)."
)
@click.option(
    "--require",
    "require",
    metavar="ALG[,ALG]",
    help="Algorithms that must all have signed, e.g. ecdsa-p256,sm2.",
)
@click.option(
    "--allow-remote-code",
    is_flag=True,
    help="Accept *.py files and auto_map in config files (refused by default).",
)
@_ignore_paths_option(
    "Also ignore this unsigned path (repeatable; as model_signing's --ignore-paths). Signed files are "
    "verified all the same."
)
@_json_option
@_quiet_option
def _verify(
    model_path: Path,
    keys: tuple[Path, ...],
    policy_file: Path | None,
    shards: tuple[str, ...],
    signatures: tuple[Path, ...],
    require: str | None,
    allow_remote_code: bool,
    ignore_paths: tuple[Path, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Verify MODEL_PATH (a model directory, or one file of it) against its signatures.

    Exit 0 when every signed file and tensor matches and a trusted key signed; exit 1 otherwise. Pickle
    checkpoints and remote code are refused even when signed.
    """
    from modelsec.signer.signing import relative_ignore_paths
    from modelsec.verifier import verify_model

    required = _parse_require(require)
    try:
        model_dir = model_path if model_path.is_dir() else model_path.parent
        ignored = relative_ignore_paths(model_dir, ignore_paths)
        policy = _policy_from_options(model_path, keys, policy_file, required, allow_remote_code)
        with _progress(model_path, "verifying", not (quiet or as_json)) as progress:
            result = verify_model(
                model_path,
                policy,
                bundles=list(signatures) or None,
                files=list(shards) or None,
                progress=progress,
                ignore_paths=ignored,
            )
    except Error as e:
        _fail(e, as_json, hint=_signature_hint(e, model_path, signatures))
    if as_json:
        _reply(
            {
                "rootDigest": _digest_str(result.root_digest),
                "files": result.files,
                "tensors": result.tensors,
                "tensorDigests": result.tensor_digests,
                "bytesHashed": result.bytes_hashed,
                "bundles": [
                    {
                        "path": str(b.path),
                        "algorithm": b.algorithm.value,
                        "key": b.key.name,
                        "keyid": b.key.keyid,
                    }
                    for b in result.bundles
                ],
                "skipped": [str(p) for p in result.skipped],
                "attestations": result.attestations.to_json() if result.attestations else None,
            }
        )
        return
    algs = ", ".join(f"{b.algorithm.value} ({b.key.name})" for b in result.bundles)
    click.echo(
        f"OK sha256:{result.root_digest}: {result.files} signed files, {result.tensors} tensors "
        f"({result.tensor_digests} with per-tensor digests); "
        f"signed by {algs}"
    )
    for p in result.skipped:
        click.echo(f"  note: {p} not checked (no configured key of its algorithm)", err=True)


@main.command(name="digest")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--hash-type",
    type=click.Choice([HashAlgorithm.SHA256.value, HashAlgorithm.BLAKE3.value, HashAlgorithm.SM3.value]),
    default=HashAlgorithm.SHA256.value,
    show_default=True,
    help="File digest of the manifest whose root to print: the OMS root is SHA-256 over these digests "
    "(blake3: model_signing's blake3 bundles; sm3: equals sha256, as SM2 bundles carry the SHA-256 root).",
)
@_ignore_paths_option("Leave this path out, as `sign --ignore-paths` does (repeatable).")
@_json_option
@_quiet_option
def _digest(
    model_dir: Path, hash_type: str, ignore_paths: tuple[Path, ...], as_json: bool, quiet: bool
) -> None:
    """Print the model root digest of MODEL_DIR (OMS SHA-256 subject digest; nothing is verified).

    It equals the root digest `verify` reports for a bundle of that hash type signed over the same files
    with the same ignore paths (OMS path order).
    """
    from modelsec.signer import MODEL_IGNORE_PATHS, compute_manifests
    from modelsec.signer.signing import relative_ignore_paths

    algorithm = HashAlgorithm(hash_type)
    try:
        extra = relative_ignore_paths(model_dir, ignore_paths)
        with _progress(model_dir, "hashing", not (quiet or as_json)) as progress:
            manifests = compute_manifests(
                model_dir,
                [algorithm],
                ignore_paths=[*MODEL_IGNORE_PATHS, *(p for p in extra if p not in MODEL_IGNORE_PATHS)],
                tensor_hash=None,
                progress=progress,
            )
    except Error as e:
        _fail(e, as_json)
    m = manifests[algorithm]
    if as_json:
        _reply(
            {
                "rootDigest": _digest_str(m.subject_digest["sha256"]),
                "hashType": hash_type,
                "files": len(m.resources),
            }
        )
    else:
        click.echo(_digest_str(m.subject_digest["sha256"]))


@main.command(name="inspect")
@click.argument("model_dir", type=click.Path(path_type=Path))
@_signatures_option("Bundle to show (repeatable; default: the default names in MODEL_DIR).")
@_trusted_keys_option(
    "Trusted public key PEM (repeatable; old spellings --key, -k): check each bundle's signature and name "
    "the key that verifies."
)
@_json_option
def _inspect(model_dir: Path, signatures: tuple[Path, ...], keys: tuple[Path, ...], as_json: bool) -> None:
    """Show what MODEL_DIR's bundles sign: files, tensors, hashes, root digest, and by which key.

    Without --trusted-key nothing is verified and the output says UNVERIFIED: a bundle's contents are
    claims until a trusted key checks them. File contents are never hashed here (use `modelsec verify`).
    """
    from modelsec.attestations.oms_predicate import parse_manifest
    from modelsec.signer.keys import load_trusted_key_file
    from modelsec.verifier import find_default_bundles
    from modelsec.verifier.inspection import inspect_bundle, require_one_checked

    rows: list[dict[str, Any]] = []
    try:
        trusted = [load_trusted_key_file(k) for k in keys]
        paths = list(signatures) or find_default_bundles(model_dir)
        if not paths:
            raise click.UsageError(f"{model_dir}: no bundle found; give --signature")
        checked = [
            inspect_bundle(p, trusted, limits=_limits(), skip_unverifiable=not signatures) for p in paths
        ]
        require_one_checked(checked, trusted, str(model_dir))
        for path, seen in zip(paths, checked, strict=True):
            manifest = parse_manifest(seen.statement, what=str(path))
            hash_type = manifest.hash_type.value
            root = manifest.subject_digest.get("sha256")
            rows.append(
                {
                    "path": str(path),
                    "signer": _signer_json(seen.signer),
                    "skipped": seen.skipped,
                    "hint": seen.bundle.hint,
                    "hashType": hash_type,
                    "rootDigest": None if root is None else _digest_str(root),
                    "subjectDigests": [_digest_str(v, a) for a, v in manifest.subject_digest.items()],
                    "files": [
                        {"name": r.name, "digest": _digest_str(r.digest.hex(), hash_type)}
                        for r in manifest.resources
                    ],
                    "ignorePaths": list(manifest.ignore_paths),
                    "tensorHash": manifest.tensor_hash.value if manifest.tensor_hash else None,
                    "tensors": sum(len(t) for t in manifest.tensors.values()),
                }
            )
    except Error as e:
        _fail(e, as_json)
    if as_json:
        _reply({"bundles": rows})
        return
    for row in rows:
        _skipped_note(row)
        click.echo(f"{row['path']}: signed by {_signer_text(row['signer'], keyid=True)}")
        click.echo(f"  model root digest {row['rootDigest']}  ({row['hashType']} manifest)")
        click.echo(
            f"  {len(row['files'])} files, {row['tensors']} tensors with {row['tensorHash'] or 'no'} "
            "per-tensor digests"
        )
        for f in row["files"]:
            click.echo(f"    {f['digest'].partition(':')[2][:16]}  {f['name']}")
        click.echo(f"  ignored: {', '.join(row['ignorePaths'])}")


def _signer_json(key: Any) -> dict[str, str] | None:
    """The key that verified a bundle (`algorithm`, `key` name, `keyid`), or None when nothing verified it."""
    if key is None:
        return None
    return {"algorithm": key.algorithm.value, "key": key.name, "keyid": key.keyid}


def _skipped_note(row: dict[str, Any]) -> None:
    from modelsec.verifier.inspection import SKIPPED_NOTE

    if row["skipped"]:
        click.echo(f"  note: {row['path']} {SKIPPED_NOTE}", err=True)


def _signer_text(signer: dict[str, str] | None, *, keyid: bool = False) -> str:
    if signer is None:
        return "UNVERIFIED"
    if keyid:
        return f"{signer['algorithm']} ({signer['key']}, keyid {signer['keyid'][:16]})"
    return f"{signer['key']} ({signer['algorithm']})"


@main.command(name="release")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "-o",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Where the released model is written (must not exist or be empty).",
)
@_signing_keys_option(
    "Private key PEM that signs the weights (repeatable: ECDSA and/or SM2; old spellings --key, -k); the "
    "first also signs the attestations unless --attestation-signing-key is given.",
    required=True,
)
@_option(
    "--attestation-signing-key",
    "attestation_key",
    aliases=("--attestation-key",),
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="Private key PEM that signs the watermark and gate attestations (old spelling --attestation-key).",
)
@_key_password_option
@click.option(
    "--watermark-key",
    type=click.Path(path_type=Path),
    required=True,
    metavar="PATH",
    help="The owner's secret watermark key file (`modelsec watermark keygen`).",
)
@click.option("--message", "-m", required=True, help="Watermark message (text, or hex with a 0x prefix).")
@click.option(
    "--gate-config",
    type=click.Path(path_type=Path),
    required=True,
    help="PGD gate configuration (YAML/JSON: architecture, data, eps, stepSize, steps, ...).",
)
@click.option(
    "--report", type=click.Path(path_type=Path), help="Gate report: .md (Markdown) or .xml (JUnit)."
)
@_json_option
def _release(
    model_dir: Path,
    out_dir: Path,
    keys: tuple[Path, ...],
    attestation_key: Path | None,
    key_passwords: tuple[str, ...],
    watermark_key: Path,
    message: str,
    gate_config: Path,
    report: Path | None,
    as_json: bool,
) -> None:
    """Release MODEL_DIR: watermark -> sign -> PGD gate -> attest -> verify, into OUT.

    Fails fast with the stage named (exit 1); the result verifies under a policy requiring every
    signature algorithm used, the watermark and the gate.
    """
    from modelsec.release import load_gate_spec, release_model
    from modelsec.watermark import load_key_file, parse_message

    sources = _key_password_sources(key_passwords, [*keys, *([attestation_key] if attestation_key else [])])
    try:
        signers = [_open_signing_key(k, sources) for k in keys]
        attester = _open_signing_key(attestation_key, sources) if attestation_key else None
        result = release_model(
            model_dir,
            out_dir,
            signers=signers,
            watermark_key=load_key_file(watermark_key),
            message=parse_message(message),
            gate=load_gate_spec(gate_config),
            attestation_signer=attester,
            report=report,
        )
    except Error as e:
        _fail(e, as_json)
    if as_json:
        _reply(
            {
                "out": str(result.out_dir),
                "rootDigest": _digest_str(result.root_digest),
                "bundles": [str(b) for b in result.bundles],
                "watermarkAttestation": str(result.watermark_attestation),
                "gateAttestation": str(result.gate_attestation),
                "robustAccuracy": result.robust_accuracy,
            }
        )
        return
    click.echo(f"released {result.out_dir}: model root digest sha256:{result.root_digest}")
    for b in result.bundles:
        click.echo(f"  signature   {b}")
    click.echo(f"  watermark   {result.watermark_attestation}")
    click.echo(f"  gate        {result.gate_attestation} (robust accuracy {result.robust_accuracy:.4f})")
    click.echo("  verified under a policy requiring all of them")


@main.group(name="attest")
def _attest() -> None:
    """List and show the attestations about a model (weights signatures, watermark, robustness gate)."""


_attest.add_command(attest_delete)


def _attestation_rows(model_dir: Path, store: str | None, keys: tuple[Path, ...]) -> list[dict[str, Any]]:
    """The bundles about MODEL_DIR (its reserved names, and the store's for the digests they name)."""
    from modelsec.signer import MODEL_IGNORE_PATHS
    from modelsec.signer.keys import load_trusted_key_file
    from modelsec.verifier.inspection import inspect_bundle, require_one_checked
    from modelsec.verifier.stores import StoreOptions, open_store

    trusted = [load_trusted_key_file(k) for k in keys]
    paths = [model_dir / n for n in MODEL_IGNORE_PATHS if n.endswith(".sig") and (model_dir / n).is_file()]
    seen = [inspect_bundle(p, trusted, limits=_limits(), skip_unverifiable=True) for p in paths]
    require_one_checked(seen, trusted, str(model_dir))
    if store is not None:
        digests = sorted({s.digest.get("sha256", "") for b in seen for s in b.statement.subjects} - {""})
        opened = open_store(store, StoreOptions(limits=_limits()))
        try:
            for digest in digests:
                seen += [inspect_bundle(e, trusted, limits=_limits()) for e in opened.entries(digest)]
        finally:
            opened.close()
    return [
        {
            "path": str(b.source),
            "predicateType": b.statement.predicate_type,
            "signer": _signer_json(b.signer),
            "skipped": b.skipped,
            "subjects": [
                {"name": s.name, "digests": [_digest_str(v, a) for a, v in s.digest.items()]}
                for s in b.statement.subjects
            ],
            "predicate": dict(b.statement.predicate),
        }
        for b in seen
    ]


@_attest.command(name="list")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--store",
    help="Also list what an attestation store (a directory or file://, sqlite://, grpc(s):// URI) holds "
    "about the model's digest.",
)
@_trusted_keys_option(
    "Trusted public key PEM (repeatable; old spellings --key, -k): check each signature (role by predicate "
    "type; unknown types are refused)."
)
@_json_option
def _attest_list(model_dir: Path, store: str | None, keys: tuple[Path, ...], as_json: bool) -> None:
    """One line per bundle about MODEL_DIR: predicate type, subject, signer (UNVERIFIED without a key)."""
    try:
        rows = _attestation_rows(model_dir, store, keys)
    except Error as e:
        _fail(e, as_json)
    if as_json:
        _reply({"bundles": [{k: v for k, v in r.items() if k != "predicate"} for r in rows]})
        return
    for r in rows:
        _skipped_note(r)
        digests = [d for s in r["subjects"] for d in s["digests"] if d.startswith("sha256:")]
        digest = (digests[0] if digests else "sha256:?")[:23]
        click.echo(f"{r['predicateType']:<45} {digest}…  {_signer_text(r['signer']):<30} {r['path']}")


@_attest.command(name="put")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--store",
    required=True,
    help="The attestation store: a directory (<store>/sha256/<digest>/<id>.sig) or a file://, sqlite:// URI.",
)
@_json_option
def _attest_put(bundles: tuple[Path, ...], store: str, as_json: bool) -> None:
    """File BUNDLES in a store by their subject's root digest (verified when read, not here)."""
    from modelsec.verifier.stores import StoreOptions, open_store

    try:
        opened = open_store(store, StoreOptions(limits=_limits()))
        try:
            written = [opened.put(b.read_bytes())[0].source for b in bundles]
        finally:
            opened.close()
    except OSError as e:
        raise click.UsageError(f"cannot read or write: {e}") from e
    except Error as e:
        _fail(e, as_json)
    if as_json:
        _reply({"stored": [str(p) for p in written]})
    else:
        for p in written:
            click.echo(f"stored {p}")


@_attest.command(name="push")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@_server_options(required=True)
@_json_option
def _attest_push(
    bundles: tuple[Path, ...],
    server: str,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    as_json: bool,
) -> None:
    """Store BUNDLES in the service's attestation store (the server verifies each against its policy first).

    Exit 1 at the first bundle the server refuses (untrusted signer, failed requirement, malformed).
    """
    results = []
    with _server_client(server, server_ca, client_cert, client_key, token_env, plaintext) as client:
        for path in bundles:
            try:
                response = client.put_attestation(path.read_bytes())
            except OSError as e:
                raise click.UsageError(f"cannot read {path}: {e.strerror}") from e
            except Error as e:
                _fail(e.add_context(str(path)), as_json)
            a = response.attestation
            results.append(
                {
                    "path": str(path),
                    "id": a.id,
                    "rootDigest": _digest_str(a.root_digest),
                    "predicateType": a.predicate_type,
                    "signer": a.signer,
                    "created": response.created,
                }
            )
            if not as_json:
                state = "stored" if response.created else "already stored"
                click.echo(f"{state} {path} as {a.id[:16]}… ({a.predicate_type}, signer {a.signer})")
    if as_json:
        _reply({"stored": results})


@_attest.command(name="pull")
@click.argument("root_digest")
@_server_options(required=True)
@click.option(
    "--out",
    help="Write the bundles into this store (a directory: <out>/sha256/<digest>/<id>.sig, or a file://, "
    "sqlite:// URI), e.g. a policy's attestationStore; without it, only list them.",
)
@_json_option
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
    with _server_client(server, server_ca, client_cert, client_key, token_env, plaintext) as client:
        try:
            target = (
                None if out is None else open_store(out, StoreOptions(limits=_limits(), must_exist=False))
            )
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
            _fail(e, as_json)
        except OSError as e:
            raise click.UsageError(f"cannot write to {out}: {e.strerror}") from e
    if as_json:
        _reply({"rootDigest": _digest_str(digest), "bundles": rows})
        return
    for r in rows:
        click.echo(f"{r['predicateType']:<45} {r['signer']:<30} {r.get('path', r['id'])}")
    if not rows:
        click.echo(f"no stored bundles about sha256:{digest}", err=True)


@_attest.command(name="show")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--store", help="Also show what an attestation store holds about the model's digest.")
@_trusted_keys_option(
    "Trusted public key PEM (repeatable; old spellings --key, -k): check each signature (role by predicate "
    "type; unknown types are refused)."
)
@_json_option
def _attest_show(model_dir: Path, store: str | None, keys: tuple[Path, ...], as_json: bool) -> None:
    """Print every bundle's statement about MODEL_DIR as indented JSON (signer null without --trusted-key).

    With --json the same bundles come as the `bundles` field of one JSON reply.
    """
    try:
        rows = _attestation_rows(model_dir, store, keys)
    except Error as e:
        _fail(e, as_json)
    if as_json:
        _reply({"bundles": rows})
    else:
        click.echo(json.dumps(rows, indent=2, default=str))


def _limits() -> Any:
    from modelsec.limits import Limits

    return Limits()


def _register_command_groups() -> None:
    """Attach the command groups of the optional packages (their modules import only click at top level)."""
    import importlib

    for module, attr in (
        ("modelsec._cli_watermark", "watermark"),
        ("modelsec._cli_gate", "gate"),
        ("modelsec._cli_webhook", "webhook"),
        ("modelsec._cli_service", "serve"),
        *(("modelsec._cli_oci", name) for name in ("push", "pull")),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        main.add_command(getattr(mod, attr))


_register_command_groups()
