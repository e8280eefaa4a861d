"""The `modelsec` command line (click). Commands convert arguments, call the public API, map errors.

Exit codes: 0 success; 1 the model/signature must not be trusted or the operation failed (diagnostic on
stderr, or a JSON object on stdout with `--json`); 2 usage errors (click). Heavy modules are imported
inside the commands so that `modelsec --version` and `--help` start fast.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from modelsec import __version__
from modelsec.cli.attest import attest
from modelsec.cli.common import reply, usage_error_reply
from modelsec.cli.keys import keygen
from modelsec.cli.release import release
from modelsec.cli.sign import sign
from modelsec.cli.verify import digest, inspect, verify


class _Main(click.Group):
    """The root group: one line and a conventional exit code for what no command handles itself.

    A missing optional extra ends any command with one line naming the extra (exit 1); Ctrl-C ends it with
    one line and exit 130 (128 + SIGINT, the shell convention) instead of click's "Aborted!" and exit 1.
    Under `--json`, each of these and every usage error (exit 2) is the JSON reply of `reply` instead.
    """

    def invoke(self, ctx: click.Context) -> Any:
        from modelsec.lazy import missing_extra

        args = list(ctx.args)  # the subcommand's arguments (click empties ctx.args while invoking it)
        as_json = "--json" in args
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if not as_json:
                raise
            usage_error_reply(e, self._invoked(ctx, args))
            ctx.exit(2)
        except KeyboardInterrupt:
            command = self._invoked(ctx, args)
            message = f"modelsec {command} interrupted (Ctrl-C)"
            if as_json:
                reply(ok=False, kind="Interrupted", message=message, command=command)
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
                reply(
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
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="After an error's one line, print its detail (give before the command).",
)
def main(verbose: bool) -> None:
    """Sign, watermark, gate and verify sharded safetensors models.

    Typical CI flow: `modelsec keygen`, `modelsec sign MODEL_DIR --signing-key ci.key.pem`; on the
    deployment side: `modelsec verify MODEL_DIR --trusted-key ci.pub.pem`. Exit codes: 0 ok, 1 refused or
    failed, 2 usage; an error is one line saying what to do next, its detail behind `modelsec --verbose`.
    Key options say which key: --signing-key (private), --trusted-key (public),
    --watermark-key, --tls-key/--tls-cert. Every command takes --json (one object on stdout).
    """
    # The node audit lines (`modelsec.audit`) are for serving processes; a command reports on stdout/stderr.
    logging.getLogger("modelsec.audit").addHandler(logging.NullHandler())


for _command in (keygen, sign, verify, digest, inspect, release, attest):
    main.add_command(_command)


def _register_command_groups() -> None:
    """Attach the command groups of the optional packages (their modules import only click at top level)."""
    import importlib

    for module, attr in (
        ("modelsec.cli.watermark", "watermark"),
        ("modelsec.cli.gate", "gate"),
        ("modelsec.cli.webhook", "webhook"),
        ("modelsec.cli.policy", "policy"),
        ("modelsec.cli.receipts", "receipts"),
        ("modelsec.cli.service", "serve"),
        *(("modelsec.cli.oci", name) for name in ("push", "pull", "copy", "storage_initializer")),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        main.add_command(getattr(mod, attr))


_register_command_groups()
