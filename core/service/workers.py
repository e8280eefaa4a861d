"""`modelsec serve --workers N`: N server processes on one port, one metrics view.

gRPC Python serves each process from one event loop (about one core), so scale-out on one host is several
processes that share the listening port through `SO_REUSEPORT` (the kernel spreads connections over them),
as gRPC's own multiprocessing example does. The supervisor (this module, in the `modelsec serve` process):

1. reserves the port: it binds a socket with `SO_REUSEPORT` (resolving port 0 to a free port) and holds it,
   never listening, until shutdown, so every worker binds the same port;
2. points `PROMETHEUS_MULTIPROC_DIR` at a fresh private directory (or the one the environment names) before
   the workers start: prometheus-client's multiprocess mode then writes every worker's counters and
   histograms there;
3. starts the workers (`multiprocessing` spawn: fresh interpreters, no forked gRPC state), each a complete
   `start_server` with `grpc.so_reuseport` on and no metrics port of its own, and waits until each is
   listening;
4. serves `/metrics` (the sum over all workers, `MultiProcessCollector`) and `/healthz` itself;
5. on SIGTERM or SIGINT, passes SIGTERM to every worker (each shuts down gracefully) and waits for them.
   A worker that exits on its own stops the others too (fail closed: the orchestrator restarts the pod).

Not provided: restarting a failed worker, or workers on other hosts (run more replicas for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from modelsec.errors import BackendUnavailableError, Error
from modelsec.service.config import ServerConfig

__all__ = ["serve_workers"]

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _reserve_port(listen: str) -> tuple[socket.socket, int]:
    """Bind (not listen) a `SO_REUSEPORT` socket to `listen`; the socket and its port.

    Raises:
        BackendUnavailableError: The address cannot be resolved or bound.
    """
    host, _, port = listen.rpartition(":")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise BackendUnavailableError(f"cannot listen on {listen}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise BackendUnavailableError(f"cannot listen on {listen}: {e.strerror or e}") from None
    return sock, int(sock.getsockname()[1])


def _worker(config: ServerConfig, ready: Connection) -> None:
    """One worker process: a full server on the shared port; reports its start (or its error) on `ready`."""
    from modelsec.service.server import RunningServer, run_server

    def on_ready(running: RunningServer) -> None:
        ready.send(("ready", running.port))

    try:
        asyncio.run(run_server(config, on_ready=on_ready, reuse_port=True))
    except Error as e:
        ready.send(("error", e))
        raise SystemExit(1) from None
    except OSError as e:  # a TLS file or the data directory cannot be read
        ready.send(("error", BackendUnavailableError(f"{e.filename or config.source}: {e.strerror or e}")))
        raise SystemExit(1) from None


class _Workers:
    def __init__(self, config: ServerConfig, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for i in range(count):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_worker, args=(config, child_end), name=f"modelsec-serve-{i}", daemon=True
            )
            proc.start()
            child_end.close()
            self.pipes.append(parent_end)
            self.procs.append(proc)

    def wait_ready(self, timeout: float) -> None:
        """Block until every worker listens.

        Raises:
            Error: A worker's own start-up error (policy, keys, address, store).
            BackendUnavailableError: A worker died or did not start within `timeout` seconds.
        """
        for i, (pipe, proc) in enumerate(zip(self.pipes, self.procs, strict=True)):
            if not pipe.poll(timeout):
                raise BackendUnavailableError(f"serve worker {i} did not start within {timeout:.0f} s")
            try:
                kind, value = pipe.recv()
            except EOFError:
                proc.join(5)
                raise BackendUnavailableError(f"serve worker {i} exited with code {proc.exitcode}") from None
            if kind == "error":
                raise value if isinstance(value, Error) else BackendUnavailableError(str(value))

    def stop(self, grace: float) -> None:
        """SIGTERM every live worker; SIGKILL those still running `grace` seconds later."""
        for proc in self.procs:
            if proc.exitcode is None and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            proc.join(grace)
            if proc.exitcode is None:
                proc.kill()
                proc.join(5)


def serve_workers(
    config: ServerConfig,
    workers: int,
    *,
    on_ready: Callable[[int, int | None], None] | None = None,
    start_timeout: float = 120.0,
) -> None:
    """Run `workers` server processes on `config.listen` until SIGTERM/SIGINT (see the module docstring).

    Args:
        config: The server configuration (port 0 picks one free port for all workers).
        workers: Number of worker processes (>= 1).
        on_ready: Called with the bound port and the metrics port (None without `metricsListen`) once every
            worker listens.
        start_timeout: Seconds each worker may take to start.

    Raises:
        PolicyError, KeyMaterialError: A worker could not load the policy or keys.
        BackendUnavailableError: The address cannot be bound, the metrics directory is unusable, or a worker
            failed to start or exited while serving.
    """
    from modelsec.service.metrics import AggregateMetrics, MetricsServer

    sock, port = _reserve_port(config.listen)
    own_dir = _MULTIPROC_ENV not in os.environ
    metrics_dir = Path(
        tempfile.mkdtemp(prefix="modelsec-metrics-") if own_dir else os.environ[_MULTIPROC_ENV]
    )
    if not metrics_dir.is_dir():
        sock.close()
        raise BackendUnavailableError(f"{_MULTIPROC_ENV}={metrics_dir}: not a directory")
    os.environ[_MULTIPROC_ENV] = str(metrics_dir)  # read by prometheus-client when a worker imports it
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    host = config.listen.rpartition(":")[0]
    pool = _Workers(config.replace(listen=f"{host}:{port}", metrics_listen=None), workers)
    view = AggregateMetrics(metrics_dir)
    metrics_server: MetricsServer | None = None
    try:
        pool.wait_ready(start_timeout)
        if config.metrics_listen is not None:
            mhost, _, mport = config.metrics_listen.rpartition(":")
            try:
                metrics_server = MetricsServer(view, mhost.strip("[]"), int(mport))
            except OSError as e:
                raise BackendUnavailableError(
                    f"cannot listen on {config.metrics_listen}: {e.strerror}"
                ) from None
            metrics_server.start()
        if on_ready is not None:
            on_ready(port, metrics_server.port if metrics_server else None)
        sentinels = [p.sentinel for p in pool.procs]
        while not stop.is_set():
            if ready := wait(sentinels, timeout=0.2):
                dead = pool.procs[sentinels.index(ready[0])]
                dead.join(5)  # the sentinel closes just before the exit status can be collected
                raise BackendUnavailableError(f"serve worker {dead.name} exited with code {dead.exitcode}")
    finally:
        view.serving = False
        pool.stop(config.grace_period + 5)
        if metrics_server is not None:
            metrics_server.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            del os.environ[_MULTIPROC_ENV]
