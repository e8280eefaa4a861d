"""Helpers shared by every `modelsec` command module: error output, common options, key passwords.

Only click is imported here, so command modules can use these at import time without importing each other.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from modelsec.errors import Error

__all__ = [
    "PASSWORD_ENV",
    "POLICY_ENV",
    "_fail",
    "_json_option",
    "_keys_option",
    "_password",
    "_quiet_option",
    "_server_client",
    "_server_options",
    "_signatures_option",
    "_write_key_file",
]

F = TypeVar("F", bound=Callable[..., Any])
PASSWORD_ENV = "MODELSEC_KEY_PASSWORD"  # noqa: S105 - the variable name, not a password
POLICY_ENV = "MODELSEC_POLICY"
TOKEN_ENV = "MODELSEC_TOKEN"  # noqa: S105 - the variable name, not a token


def _fail(e: Error, as_json: bool, *, hint: str | None = None) -> NoReturn:
    # The library's messages carry no CLI advice; `hint` is the command's own (e.g. which option to give).
    message = f"{e.diagnostics()} ({hint})" if hint else e.diagnostics()
    if as_json:
        click.echo(json.dumps({"ok": False, "error": {"kind": type(e).__name__, "message": message}}))
    else:
        click.echo(f"modelsec: error: {message}", err=True)
    sys.exit(1)


def _json_option(f: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object on stdout (for scripts)."
    )(f)


def _keys_option(help_text: str, *, required: bool = False) -> Callable[[F], F]:
    """`--key/-k PATH`, repeatable, into the parameter `keys`."""
    return click.option(
        "--key",
        "-k",
        "keys",
        type=click.Path(path_type=Path),
        multiple=True,
        required=required,
        help=help_text,
    )


def _signatures_option(help_text: str) -> Callable[[F], F]:
    """`--signature/-s PATH`, repeatable, into the parameter `signatures`."""
    return click.option(
        "--signature", "-s", "signatures", type=click.Path(path_type=Path), multiple=True, help=help_text
    )


def _quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, help="No progress bar.")(f)


def _password(path: Path) -> bytes | None:
    """The password of an encrypted key: $MODELSEC_KEY_PASSWORD, else a prompt on a terminal."""
    if os.environ.get(PASSWORD_ENV) is not None:
        return os.environ[PASSWORD_ENV].encode("utf-8")
    try:
        head = path.read_bytes()[:100]
    except OSError:
        return None
    if b"ENCRYPTED" in head and sys.stdin.isatty():
        return click.prompt(f"Password for {path}", hide_input=True).encode("utf-8")
    return None


def _server_options(*, required: bool) -> Callable[[F], F]:
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
                "--ca",
                "server_ca",
                type=click.Path(path_type=Path, dir_okay=False),
                help="CA bundle that signed the server certificate (default: the system roots).",
            ),
            click.option(
                "--client-cert",
                type=click.Path(path_type=Path, dir_okay=False),
                help="Client certificate (PEM) for mutual TLS.",
            ),
            click.option(
                "--client-key",
                type=click.Path(path_type=Path, dir_okay=False),
                help="Client private key (PEM) for mutual TLS.",
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


def _server_client(
    server: str,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    *,
    timeout: float = 30.0,
) -> Any:
    """A `modelsec.service.client.ModelsecClient` for the `_server_options` values (`timeout`: per call).

    Raises:
        click.UsageError: Half an mTLS pair, or the grpc extra is not installed.
    """
    if (client_cert is None) != (client_key is None):
        raise click.UsageError("give both --client-cert and --client-key, or neither")
    try:
        from modelsec.service.client import ChannelOptions, ModelsecClient
    except ModuleNotFoundError as e:
        raise click.UsageError(f"{e.name} is missing; install modelsec[grpc]") from e
    options = ChannelOptions(
        ca=server_ca,
        cert=client_cert,
        key=client_key,
        token=os.environ.get(token_env) or None,
        plaintext=plaintext,
        timeout=timeout,
    )
    return ModelsecClient(server, options)


def _write_key_file(path: Path, data: bytes, mode: int, *, force: bool) -> None:
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
