"""`modelsec serve`: the gRPC service (modelsec.v1) with the configuration file of `modelsec.service.config`.

Only click is imported at module level (grpc loads inside the command, so `modelsec --help` stays fast).
On start the command prints one line, `serving modelsec.v1 on HOST:PORT (metrics on HOST:PORT)`, on
stdout (scripts and tests read the bound port from it when `listen` ends in `:0`); logs are JSON lines on
stderr. Exit 0 after a graceful shutdown (SIGTERM/SIGINT); 1 when the configuration, policy, keys or
address are unusable; 2 on usage errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from modelsec.cli.common import json_option, reply
from modelsec.cli.values import listen_value

__all__ = ["serve"]


@click.command(name="serve")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    envvar="MODELSEC_SERVER_CONFIG",
    help="Server configuration (kind: ServerConfig, YAML or JSON); also $MODELSEC_SERVER_CONFIG.",
)
@click.option(
    "--listen",
    callback=listen_value,
    help="Override the configuration's listen address (HOST:PORT; port 0 picks one).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Structured log level (one JSON line per RPC at info).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    envvar="MODELSEC_SERVE_WORKERS",
    help="Server processes sharing the port (SO_REUSEPORT; one event loop, about one core, each); "
    "the metrics port sums them. Also $MODELSEC_SERVE_WORKERS.",
)
@json_option
def serve(config_path: Path, listen: str | None, log_level: str, workers: int, as_json: bool) -> None:
    """Serve the modelsec.v1 gRPC API (signing, verification, attestation store, watermark, gate).

    Once listening (every worker, with --workers) it prints one line on stdout,
    `serving modelsec.v1 on HOST:PORT`, or with --json the reply
    `{"ok": true, "command": "serve", "listen": "HOST:PORT", "metricsListen": ...}`.
    """
    import asyncio

    from modelsec.cli.common import fail
    from modelsec.errors import BackendUnavailableError, Error
    from modelsec.observability import configure_json_logging, configure_tracing

    # Without the grpc extra this raises ModuleNotFoundError; the root command names the extra.
    from modelsec.service.config import load_server_config
    from modelsec.service.server import RunningServer, run_server

    configure_json_logging(log_level)
    configure_tracing("serve")  # only with $MODELSEC_OTEL=1 (the otel extra)

    def announce(port: int, metrics_port: int | None) -> None:
        host = config.listen.rpartition(":")[0]
        metrics = None
        if metrics_port is not None:
            mhost = (config.metrics_listen or "").rpartition(":")[0]
            metrics = f"{mhost}:{metrics_port}"
        if as_json:
            reply({"listen": f"{host}:{port}", "metricsListen": metrics}, command="serve")
        else:
            extra = f" (metrics on {metrics})" if metrics else ""
            click.echo(f"serving modelsec.v1 on {host}:{port}{extra}")
        sys.stdout.flush()

    def ready(running: RunningServer) -> None:
        announce(running.port, running.metrics_port)

    try:
        config = load_server_config(config_path)
        if listen is not None:
            config = config.replace(listen=listen)  # checked by `listen_value`
        if workers > 1:
            from modelsec.service.workers import serve_workers

            serve_workers(config, workers, on_ready=announce)
        else:
            asyncio.run(run_server(config, on_ready=ready))
    except Error as e:
        fail(e, as_json)
    except OSError as e:  # a TLS file or the data directory cannot be read or created
        fail(BackendUnavailableError(f"{e.filename or config_path}: {e.strerror or e}"), as_json)
