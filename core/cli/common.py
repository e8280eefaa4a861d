"""Helpers shared by every `modelsec` command module: error output, common options, key passwords.

Only click is imported here, so command modules can use these at import time without importing each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from modelsec.errors import Error

__all__ = [
    "KEY_PASSWORD_HELP",
    "PASSWORD_ENV",
    "POLICY_ENV",
    "TIMESTAMP_HELP",
    "_command_name",
    "_password",
    "digest_str",
    "fail",
    "json_option",
    "key_password_option",
    "key_password_option_with",
    "key_password_sources",
    "limits",
    "open_signing_key",
    "progress_bar",
    "progress_status",
    "quiet_option",
    "read_password_source",
    "reply",
    "server_client",
    "server_options",
    "signatures_option",
    "signer_json",
    "signer_text",
    "signing_keys_option",
    "skipped_note",
    "timestamp_option",
    "timestamp_option_with",
    "timestamper",
    "trusted_keys_option",
    "usage_error_reply",
    "write_key_file",
]

F = TypeVar("F", bound=Callable[..., Any])
PASSWORD_ENV = "MODELSEC_KEY_PASSWORD"  # noqa: S105 - the variable name, not a password
POLICY_ENV = "MODELSEC_POLICY"
TOKEN_ENV = "MODELSEC_TOKEN"  # noqa: S105 - the variable name, not a token


def _command_name(ctx: click.Context | None = None) -> str:
    """The command's words below the root, e.g. `attest list` (what `command` says in a JSON reply)."""
    ctx = ctx if ctx is not None else click.get_current_context(silent=True)
    words: list[str] = []
    while ctx is not None and ctx.parent is not None:
        words.append(ctx.command.name or ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(words))


def digest_str(value: str, algorithm: str = "sha256") -> str:
    """`<algorithm>:<hex>`, the one spelling of a digest in every output (idempotent)."""
    return value if value.startswith(f"{algorithm}:") else f"{algorithm}:{value}"


def reply(
    fields: Mapping[str, Any] | None = None,
    *,
    ok: bool = True,
    kind: str | None = None,
    message: str | None = None,
    error_fields: Mapping[str, Any] | None = None,
    command: str | None = None,
) -> None:
    """Print the one JSON object of a `--json` reply on stdout.

    The envelope is the same for every command: `ok` (true only for a positive verdict), `command`, the
    command's own camelCase `fields`, and on failure `error: {kind, message}` with `kind` the modelsec
    error class name (`UsageError`, `Interrupted` and `MissingExtraError` outside the hierarchy).
    """
    doc: dict[str, Any] = {"ok": ok, "command": _command_name() if command is None else command}
    doc.update(fields or {})
    if kind is not None:
        doc["error"] = {"kind": kind, "message": message or "", **(error_fields or {})}
    click.echo(json.dumps(doc, default=str))


def fail(
    e: Error, as_json: bool, *, hint: str | None = None, fields: Mapping[str, Any] | None = None
) -> NoReturn:
    """Report a modelsec error (one line on stderr, or the JSON envelope with `error`) and exit 1.

    The error's `details` (each skipped reason, a third-party error's text) follow the line under the root
    option `--verbose`, and are the `error.details` list of a JSON reply.
    """
    # The library's messages carry no CLI advice; `hint` is the command's own (e.g. which option to give).
    message = f"{e.diagnostics()} ({hint})" if hint else e.diagnostics()
    if as_json:
        details = {"details": list(e.details)} if e.details else None
        # A private subclass (e.g. the registry client's `_BodyLostError`) is reported as its public class.
        kind = next(c for c in type(e).__mro__ if not c.__name__.startswith("_")).__name__
        reply(fields, ok=False, kind=kind, message=message, error_fields=details)
    else:
        click.echo(f"modelsec: error: {message}", err=True)
        ctx = click.get_current_context(silent=True)
        if e.details and ctx is not None and ctx.find_root().params.get("verbose"):
            for line in e.details:
                click.echo(f"  {line}", err=True)
    sys.exit(1)


def usage_error_reply(e: click.UsageError, command: str) -> None:
    """The JSON reply to a usage error under `--json` (the caller exits 2); `command` unless `e` names one."""
    name = _command_name(e.ctx) if e.ctx is not None and e.ctx.parent is not None else command
    reply(ok=False, kind="UsageError", message=e.format_message(), command=name)


def json_option(f: F) -> F:
    """`--json`: print one JSON object on stdout instead of text (errors included)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print one JSON object on stdout (for scripts; fields: docs/reference/output.md).",
    )(f)


def _key_files_option(name: str, help_text: str, required: bool) -> Callable[[F], F]:
    """A repeatable `name PATH` option into the parameter `keys` (one shape for both kinds of key)."""
    return click.option(
        name,
        "keys",
        type=click.Path(path_type=Path),
        multiple=True,
        required=required,
        metavar="PATH",
        help=help_text,
    )


def signing_keys_option(help_text: str, *, required: bool = False) -> Callable[[F], F]:
    """`--signing-key PATH` (private key), repeatable, into `keys`."""
    return _key_files_option("--signing-key", help_text, required)


def registry_options(f: F) -> F:
    """`--registry-ca PATH` and `--plain-http`: how to reach an OCI registry (push, pull, the webhook).

    Credentials never come from the command line: `$MODELSEC_OCI_USERNAME` / `_PASSWORD` or a Docker
    `config.json` (`$DOCKER_CONFIG`), read by `registry_options_value`.
    """
    f = click.option(
        "--registry-ca",
        type=click.Path(path_type=Path, dir_okay=False),
        help="CA bundle of the registry's TLS certificate (default: the system roots; or $MODELSEC_OCI_CA).",
    )(f)
    return click.option(
        "--plain-http",
        is_flag=True,
        help="Speak HTTP to the registry (development registries only; or $MODELSEC_OCI_PLAIN_HTTP=1).",
    )(f)


def registry_options_value(registry_ca: Path | None, plain_http: bool) -> Any:
    """The `modelsec.registry.client.RegistryOptions` of `registry_options` and the environment.

    Raises:
        MalformedArtifactError: `$MODELSEC_OCI_TIMEOUT` is not a number, or `_TRANSFERS` not 1-64.
    """
    from modelsec.registry.client import RegistryOptions

    return RegistryOptions.from_env(ca_file=registry_ca, plain_http=plain_http or None)


def trusted_keys_option(help_text: str, *, required: bool = False) -> Callable[[F], F]:
    """`--trusted-key PATH` (public key a verdict relies on), repeatable, into `keys`."""
    return _key_files_option("--trusted-key", help_text, required)


def signatures_option(help_text: str) -> Callable[[F], F]:
    """`--signature/-s PATH`, repeatable, into the parameter `signatures` (`-` and streams refused)."""
    return click.option(
        "--signature",
        "-s",
        "signatures",
        type=click.Path(path_type=Path),
        multiple=True,
        callback=_no_stream_bundles,
        help=help_text,
    )


def _no_stream_bundles(
    _ctx: click.Context, param: click.Parameter, values: tuple[Path, ...]
) -> tuple[Path, ...]:
    """Refuse `-`, `/dev/stdin` and other descriptor paths as a bundle, with a usage error (exit 2).

    Bundles are regular files only: the reader refuses a symlink (`/dev/stdin` and `/dev/fd/N` are links
    into `/proc`) and anything but a regular file, so that nothing in a model tree or beside it can redirect
    or block it. Streams are not special-cased, since a path that reads differently each time is exactly
    what that rule keeps out; this only says so before any work, instead of "is a symlink".
    """
    for value in values:
        text = os.path.normpath(value) if str(value) != "-" else "-"
        if text in ("-", "/dev/stdin", "/dev/stdout") or _FD_PATH.match(text):
            raise click.BadParameter(
                f"{value}: a signature bundle must be a regular file, not standard input/output or a file "
                "descriptor; save it to a file and give that path",
                param=param,
            )
    return values


_FD_PATH = re.compile(r"/dev/fd/|/proc/[^/]+/fd/")


def ignore_paths_option(help_text: str) -> Callable[[F], F]:
    """`--ignore-paths PATH`, repeatable, into the parameter `ignore_paths` (model_signing's spelling)."""
    return click.option(
        "--ignore-paths",
        "ignore_paths",
        type=click.Path(path_type=Path),
        multiple=True,
        help=help_text,
    )


def report_path(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """Click callback for `--report`: check the extension before any work (a usage error, exit 2)."""
    from modelsec.errors import PolicyError
    from modelsec.reports import check_report_path

    if value is not None:
        try:
            check_report_path(value)
        except PolicyError as e:
            raise click.BadParameter(str(e)) from None
    return value


def timestamp_option_with(help_text: str) -> Callable[[F], F]:
    """`timestamp_option` with a help text of the command's own (a short one, its detail in the man page)."""
    from modelsec.cli.values import timestamp_url_value

    return click.option(
        "--timestamp-url",
        "timestamp_url",
        metavar="URL",
        callback=timestamp_url_value,
        help=help_text,
    )


TIMESTAMP_HELP = (
    "RFC 3161 timestamp authority (http:// or https://): each bundle's signature is timestamped and the "
    "timestamp stored in the bundle (verificationMaterial.timestampVerificationData). If the TSA fails, or "
    "dates the timestamp more than 5 minutes from this machine's clock, signing fails and no bundle is "
    "written."
)


def timestamp_option(f: F) -> F:
    """`--timestamp-url URL` into the parameter `timestamp_url` (see `timestamper`)."""
    return timestamp_option_with(TIMESTAMP_HELP)(f)


def timestamper(url: str | None) -> Callable[[bytes], list[bytes]] | None:
    """What `sign_model` calls to timestamp each signature at `url` (None: no timestamps).

    Raises:
        click.UsageError: `rfc3161-client` (the `timestamp` extra) is not installed.
    """
    if url is None:
        return None
    try:
        from modelsec.verifier.trust.timestamps import request_timestamp
    except ModuleNotFoundError as e:
        raise click.UsageError(
            f"--timestamp-url needs {e.name} (pip install 'modelsec[timestamp]')"
        ) from None
    return lambda signature: [request_timestamp(signature, url)]


def quiet_option(f: F) -> F:
    """`--quiet/-q`: no progress bar."""
    return click.option("--quiet", "-q", is_flag=True, help="No progress bar.")(f)


KEY_PASSWORD_HELP = (
    "Password source of one encrypted key, as KEY=env:VAR (read $VAR) or KEY=file:PATH (read the file; "
    "one trailing newline is dropped); repeatable, one per key. An encrypted key without one uses "
    f"${PASSWORD_ENV} (shared by every encrypted key), else a prompt on a terminal. Unencrypted keys need "
    "no password (the shared one is not applied to them)."
)
_MAX_PASSWORD_FILE_BYTES = 64 * 1024


def key_password_option(f: F) -> F:
    """`--key-password KEY=env:VAR|file:PATH`, repeatable, into the parameter `key_passwords`."""
    return key_password_option_with(KEY_PASSWORD_HELP)(f)


def key_password_option_with(help_text: str) -> Callable[[F], F]:
    """`key_password_option` with a help text of the command's own (short, the detail in the man page)."""
    return click.option(
        "--key-password",
        "key_passwords",
        multiple=True,
        metavar="KEY=env:VAR|file:PATH",
        help=help_text,
    )


def _same_file_key(path: Path) -> str:
    return os.path.normpath(os.path.abspath(path))


def key_password_sources(specs: tuple[str, ...], keys: list[Path]) -> dict[str, str]:
    """Parse `--key-password` values into {normalised key path: `env:VAR` or `file:PATH`}.

    Raises:
        click.UsageError: A malformed value, a key named twice, or a key that is not one of `keys`.
    """
    known = {_same_file_key(k) for k in keys}
    sources: dict[str, str] = {}
    for spec in specs:
        at = max(spec.rfind("=env:"), spec.rfind("=file:"))
        key, source = spec[: max(at, 0)], spec[at + 1 :]
        if at <= 0 or not source.partition(":")[2]:
            # Nothing of the value is echoed: it may be a password typed where a source was expected.
            raise click.UsageError(
                "--key-password: expected KEY=env:VAR or KEY=file:PATH "
                "(passwords themselves are never taken from the command line)"
            )
        name = _same_file_key(Path(key))
        if name not in known:
            raise click.UsageError(f"--key-password names {key}, which is not a private key of this command")
        if name in sources:
            raise click.UsageError(f"--key-password: {key} is given twice")
        sources[name] = source
    return sources


def read_password_source(source: str, what: str) -> bytes:
    """Read a password from `env:VAR` or `file:PATH` (one trailing newline dropped).

    Raises:
        KeyMaterialError: The variable is unset or empty, or the file cannot be read or is empty.
    """
    from modelsec.errors import KeyMaterialError

    kind, _, value = source.partition(":")
    if kind == "env":
        password = os.environ.get(value, "")
        if not password:
            raise KeyMaterialError(f"{what}: ${value} is not set or empty")
        return password.encode("utf-8")
    try:
        with open(value, "rb") as f:
            data = f.read(_MAX_PASSWORD_FILE_BYTES + 1)
    except OSError as e:
        raise KeyMaterialError(f"{what}: cannot read the password file {value}: {e.strerror}") from e
    if len(data) > _MAX_PASSWORD_FILE_BYTES:
        raise KeyMaterialError(f"{what}: the password file {value} is larger than 64 KiB")
    data = data.removesuffix(b"\n").removesuffix(b"\r")
    if not data:
        raise KeyMaterialError(f"{what}: the password file {value} is empty")
    return data


def _key_is_encrypted(path: Path) -> bool:
    """Whether the PEM private key at `path` is encrypted (PKCS#8 or legacy `Proc-Type: 4,ENCRYPTED`).

    Raises:
        KeyMaterialError: The key file cannot be read (missing, a symlink, not a regular file, too large).
    """
    from modelsec.signer.keys import key_file_is_encrypted

    return key_file_is_encrypted(path)


def _password(path: Path, sources: dict[str, str] | None = None) -> bytes | None:
    """The password of the private key at `path`, or None when the key is not encrypted.

    An encrypted key's password comes from its `--key-password` source, else $MODELSEC_KEY_PASSWORD (set
    and non-empty), else a prompt when stdin is a terminal.

    Raises:
        KeyMaterialError: The key cannot be read; an encrypted key has no password source and there is no
            terminal; its source cannot be read; or `--key-password` was given for an unencrypted key.
    """
    from modelsec.errors import KeyMaterialError

    source = (sources or {}).get(_same_file_key(path))
    if not _key_is_encrypted(path):
        if source is not None:
            raise KeyMaterialError(f"{path}: --key-password was given but the key is not encrypted")
        return None
    if source is not None:
        return read_password_source(source, f"{path} (--key-password)")
    shared = os.environ.get(PASSWORD_ENV)
    if shared:
        return shared.encode("utf-8")
    if sys.stdin.isatty():
        return click.prompt(f"Password for {path}", hide_input=True).encode("utf-8")
    raise KeyMaterialError(
        f"{path}: the key is encrypted and no password was given (no terminal to ask): set "
        f"${PASSWORD_ENV}, or give --key-password {path}=env:VAR or --key-password {path}=file:PATH"
    )


def open_signing_key(path: Path, sources: dict[str, str] | None = None) -> Any:
    """Open the private key `path` names for signing (`modelsec.signer.keys.key_source`), with its password.

    A `pkcs11:` URI reads its PIN from its own `pin-source` (`modelsec.signer.pkcs11`), never from a prompt.

    Raises:
        KeyMaterialError: See `_password`; or the key cannot be loaded; `--key-password` for a token key.
        UnsupportedAlgorithmError: An unsupported key type.
        BackendUnavailableError: A token key without python-pkcs11 installed, or a removed token.
    """
    from modelsec.errors import KeyMaterialError
    from modelsec.signer.keys import PemFileKeySource, key_source

    source = key_source(path)
    if not isinstance(source, PemFileKeySource):
        if _same_file_key(path) in (sources or {}):
            raise KeyMaterialError(f"{source.reference}: --key-password is for PEM keys; a URI names its PIN")
        return source.open()
    return source.open(password=_password(path, sources))


def server_options(*, required: bool) -> Callable[[F], F]:
    """`--server HOST:PORT` and how to reach it (TLS CA, mTLS client certificate, bearer token, plaintext)."""

    def decorate(f: F) -> F:
        options = [
            click.option(
                "--server",
                required=required,
                envvar="MODELSEC_SERVER",
                metavar="HOST:PORT",
                help="The modelsec gRPC service (also $MODELSEC_SERVER).",
            ),
            click.option(
                "--tls-ca",
                "server_ca",
                type=click.Path(path_type=Path, dir_okay=False),
                help="CA bundle that signed the server certificate (default: the system roots).",
            ),
            click.option(
                "--tls-cert",
                "client_cert",
                type=click.Path(path_type=Path, dir_okay=False),
                help="Client certificate (PEM) for mutual TLS.",
            ),
            click.option(
                "--tls-key",
                "client_key",
                type=click.Path(path_type=Path, dir_okay=False),
                help="Client private key (PEM) for mutual TLS, with --tls-cert.",
            ),
            click.option(
                "--token-env",
                default=TOKEN_ENV,
                show_default=True,
                metavar="VAR",
                help="Environment variable holding a bearer token (never pass tokens as arguments).",
            ),
            click.option(
                "--plaintext", is_flag=True, help="No TLS (local development only; tokens travel in clear)."
            ),
        ]
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def server_client(
    server: str,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    *,
    timeout: float = 30.0,
) -> Any:
    """A `modelsec.service.client.ModelsecClient` for the `server_options` values (`timeout`: per call).

    Raises:
        click.UsageError: Half an mTLS pair.
        ModuleNotFoundError: The grpc extra is not installed (the root command names the extra).
    """
    if (client_cert is None) != (client_key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    from modelsec.service.client import ChannelOptions, ModelsecClient

    options = ChannelOptions(
        ca=server_ca,
        cert=client_cert,
        key=client_key,
        token=os.environ.get(token_env) or None,
        plaintext=plaintext,
        timeout=timeout,
    )
    return ModelsecClient(server, options)


def write_key_file(path: Path, data: bytes, mode: int, *, force: bool) -> None:
    """Write a key file with exactly `mode` (also when `--force` replaces an existing file).

    Raises:
        click.UsageError: The file exists and `force` is not set.
        KeyMaterialError: The file cannot be written (missing directory, permissions, a symlink).
    """
    from modelsec.errors import KeyMaterialError

    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise click.UsageError(f"{path} exists (use --force to overwrite)") from None
    except OSError as e:
        raise KeyMaterialError(f"{path}: cannot write the key file: {e.strerror}") from e
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, mode)  # O_TRUNC keeps an existing file's mode: a private key must not stay 0644
        f.write(data)


@contextlib.contextmanager
def progress_bar(path: Path, description: str, enabled: bool) -> Iterator[Callable[[int], None] | None]:
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


@contextlib.contextmanager
def progress_status(description: str, enabled: bool) -> Iterator[None]:
    """A status line on stderr showing the latest step the library reports (`modelsec.progress`).

    Shown from the start of the command, and only when `enabled` (not `--json` or `--quiet`) and stderr is a
    terminal; otherwise nothing is written and the steps stay unrouted log records. The line is transient: it
    is erased when the command ends, leaving its result or error alone on the screen.
    """
    if not (enabled and sys.stderr.isatty()):
        yield
        return
    import logging

    from rich.console import Console

    from modelsec.progress import PROGRESS_LOGGER

    logger = logging.getLogger(PROGRESS_LOGGER)

    class _ToStatus(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            status.update(f"{record.getMessage()} …")

    handler, level, propagate = _ToStatus(logging.INFO), logger.level, logger.propagate
    with Console(stderr=True).status(f"{description} …") as status:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # the steps are for this line, not for a root handler the command set
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def signer_json(key: Any) -> dict[str, str] | None:
    """The key that verified a bundle (`algorithm`, `key` name, `keyid`), or None when nothing verified it."""
    if key is None:
        return None
    return {"algorithm": key.algorithm.value, "key": key.name, "keyid": key.keyid}


def skipped_note(row: dict[str, Any]) -> None:
    """`verify`'s note, on stderr, for a bundle `inspect` / `attest list` could not check with the keys."""
    from modelsec.verifier.inspection import SKIPPED_NOTE

    if row["skipped"]:
        click.echo(f"  note: {row['path']} {SKIPPED_NOTE}", err=True)


def signer_text(signer: dict[str, str] | None, *, keyid: bool = False) -> str:
    """Who signed, for text output: the signer's description (with its keyid if asked), or UNVERIFIED."""
    if signer is None:
        return "UNVERIFIED"
    if keyid:
        return f"{signer['algorithm']} ({signer['key']}, keyid {signer['keyid'][:16]})"
    return f"{signer['key']} ({signer['algorithm']})"


def limits() -> Any:
    """The default `modelsec.limits.Limits` (imported on first use, to keep `--help` fast)."""
    from modelsec.limits import Limits

    return Limits()


def _dataset_value(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Any]:
    """`NAME=sha256:HEX` (or `NAME=HEX`) into `Dataset`s."""
    from modelsec.attestations.predicates.provenance import Dataset
    from modelsec.attestations.statement import is_sha256_hex

    out = []
    for v in values:
        name, sep, digest = v.partition("=")
        digest = digest.removeprefix("sha256:")
        if not sep or not name or not is_sha256_hex(digest):
            raise click.BadParameter(f"{v!r} is not NAME=sha256:<64 lowercase hex>", ctx, param)
        out.append(Dataset(name, digest))
    return out


def provenance_options(f: F) -> F:
    """The inputs of SLSA provenance (`attest provenance`, `release`): code, datasets, base models."""
    f = click.option(
        "--base-model",
        "base_models",
        multiple=True,
        type=click.Path(path_type=Path, file_okay=False),
        help="A signed base model directory (repeatable): its root digest and its signature bundle's digest "
        "go into the provenance.",
    )(f)
    f = click.option(
        "--dataset",
        "datasets",
        multiple=True,
        metavar="NAME=sha256:HEX",
        callback=_dataset_value,
        help="A dataset the model was trained or gated on, by digest (repeatable).",
    )(f)
    f = click.option(
        "--source-dir",
        type=click.Path(path_type=Path, file_okay=False),
        help="Read the training code's repository and commit from this git checkout.",
    )(f)
    f = click.option("--source-commit", metavar="SHA", help="The training code's git commit (40 or 64 hex).")(
        f
    )
    return click.option(
        "--source-repo",
        metavar="URL",
        help="The training code's git repository, with --source-commit (default: from the CI environment).",
    )(f)


def provenance_inputs(
    source_repo: str | None,
    source_commit: str | None,
    source_dir: Path | None,
    datasets: Sequence[Any],
    base_models: Sequence[Path],
) -> Any:
    """The `modelsec.release.ProvenanceInputs` of `provenance_options` and the CI environment.

    Raises:
        click.UsageError: --source-repo without --source-commit (or the reverse), or with --source-dir.
        PolicyError: The CI environment lacks a variable (`build_environment`), or --source-dir is not a
            git checkout.
        MalformedArtifactError: A base model is unsigned, or its signature signs other files.
    """
    from modelsec.attestations.predicates.provenance import Source, build_environment
    from modelsec.release.pipeline import ProvenanceInputs
    from modelsec.signer.statements import base_model_of, source_from_checkout

    if (source_repo is None) != (source_commit is None):
        raise click.UsageError("give --source-repo and --source-commit together")
    if source_dir is not None and source_repo is not None:
        raise click.UsageError("give --source-dir or --source-repo/--source-commit, not both")
    environment = build_environment(os.environ)
    sources = [Source(str(source_repo), str(source_commit).lower())] if source_repo else []
    if source_dir is not None:
        sources = [source_from_checkout(source_dir)]
    bases = [base_model_of(b, limits=limits()) for b in base_models]
    return ProvenanceInputs(environment, tuple(sources), tuple(datasets), tuple(bases))
