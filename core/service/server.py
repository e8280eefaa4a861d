"""The `grpc.aio` server behind `modelsec serve`.

What runs: the modelsec.v1 services (`SERVICES`), the standard health service (`grpc.health.v1.Health`,
per service and overall), server reflection, the interceptor (`modelsec.service.interceptor`), and the
metrics side port (`/healthz` liveness, `/readyz` readiness, `/metrics`).

Readiness: the store is checked (`AttestationStore.check`: a query, re-connecting a broken PostgreSQL
connection) when the server starts and every `READINESS_INTERVAL_S` seconds after. While it fails, health is
NOT_SERVING (overall and per service) and `/readyz` answers 503 naming the store and why, so that a replica
whose database is down is taken out of the Service's endpoints instead of answering every call with
UNAVAILABLE; when the store answers again it is SERVING. A check that has not returned by the next tick keeps
the replica not ready. Liveness (`/healthz`) does not depend on the store: a restart would not bring a
database back. Messages are limited to gRPC's 4 MiB default in
both directions (digests and bundles cross the wire, never weights).

Shutdown: SIGTERM or SIGINT flips health to NOT_SERVING, stops accepting calls, gives in-flight calls
`gracePeriod` seconds, then cancels the rest (a running gate sees the cancellation at its next batch and
stops) and closes the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from modelsec.errors import KeyMaterialError
from modelsec.observability import decision_tracer
from modelsec.safe_io import read_regular_file
from modelsec.service.attestation import AttestationServicer
from modelsec.service.config import ServerConfig
from modelsec.service.interceptor import ServiceInterceptor
from modelsec.service.metrics import MetricsServer, ServiceMetrics
from modelsec.service.robustness import RobustnessServicer
from modelsec.service.signing import SigningServicer
from modelsec.service.state import ServiceState
from modelsec.service.verification import VerificationServicer
from modelsec.service.watermark import WatermarkServicer
from modelsec.v1 import (
    attestation_pb2,
    attestation_pb2_grpc,
    robustness_pb2,
    robustness_pb2_grpc,
    signing_pb2,
    signing_pb2_grpc,
    verification_pb2,
    verification_pb2_grpc,
    watermark_pb2,
    watermark_pb2_grpc,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "READINESS_INTERVAL_S",
    "SERVICES",
    "RunningServer",
    "run_server",
    "start_server",
]

_log = logging.getLogger("modelsec.service")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MAX_TLS_FILE_BYTES = 1 << 20
READINESS_INTERVAL_S = 5.0  # as the readinessProbe's periodSeconds in deploy/serve


# Full service name -> how to add its servicer.
SERVICES: dict[str, Callable[[ServiceState, aio.Server], None]] = {
    signing_pb2.DESCRIPTOR.services_by_name["SigningService"].full_name: lambda s, srv: (
        signing_pb2_grpc.add_SigningServiceServicer_to_server(SigningServicer(s), srv)
    ),
    verification_pb2.DESCRIPTOR.services_by_name["VerificationService"].full_name: lambda s, srv: (
        verification_pb2_grpc.add_VerificationServiceServicer_to_server(VerificationServicer(s), srv)
    ),
    attestation_pb2.DESCRIPTOR.services_by_name["AttestationService"].full_name: lambda s, srv: (
        attestation_pb2_grpc.add_AttestationServiceServicer_to_server(AttestationServicer(s), srv)
    ),
    # Both import numpy and torch inside their RPC methods only, so server start stays light.
    watermark_pb2.DESCRIPTOR.services_by_name["WatermarkService"].full_name: lambda s, srv: (
        watermark_pb2_grpc.add_WatermarkServiceServicer_to_server(WatermarkServicer(s), srv)
    ),
    robustness_pb2.DESCRIPTOR.services_by_name["RobustnessService"].full_name: lambda s, srv: (
        robustness_pb2_grpc.add_RobustnessServiceServicer_to_server(RobustnessServicer(s), srv)
    ),
}


@dataclass
class RunningServer:
    """A started server: its bound port, and what `stop` needs."""

    server: aio.Server
    port: int
    state: ServiceState
    metrics: ServiceMetrics
    health: health_aio.HealthServicer
    metrics_server: MetricsServer | None
    readiness: asyncio.Task[None] | None = None

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port (None when disabled)."""
        return self.metrics_server.port if self.metrics_server else None

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, no new calls, `grace` seconds for in-flight ones, then cancel."""
        self.metrics.serving = False
        if self.readiness is not None:
            self.readiness.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.state.config.grace_period if grace is None else grace)
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.state.close()


def _credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if config.tls is None:
        return None
    ca = _tls_file(config.tls.client_ca, "TLS client CA file") if config.tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(_tls_file(config.tls.key, "TLS key file"), _tls_file(config.tls.cert, "TLS certificate file"))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def _tls_file(path: Path, what: str) -> bytes:
    return read_regular_file(path, what, max_bytes=_MAX_TLS_FILE_BYTES, error=KeyMaterialError)


def _decision_observer(metrics: ServiceMetrics) -> Callable[[str, str, str, str, float], None]:
    """The metrics' decision histogram, and with tracing on one span per decision (`decision_tracer`)."""
    tracer = decision_tracer("serve")
    if tracer is None:
        return metrics.observe_decision

    def observe(method: str, policy: str, outcome: str, reason: str, seconds: float) -> None:
        metrics.observe_decision(method, policy, outcome, reason, seconds)
        attributes = {"modelsec.method": method, "modelsec.policy": policy or "-"}
        attributes |= {"modelsec.outcome": outcome, "modelsec.reason": reason}
        tracer.record("modelsec.grpc.decision", seconds, attributes)

    return observe


async def start_server(
    config: ServerConfig,
    state: ServiceState | None = None,
    *,
    reuse_port: bool = False,
    readiness_interval: float = READINESS_INTERVAL_S,
) -> RunningServer:
    """Build and start the server for `config` (port 0 in `listen` picks a free port).

    With `reuse_port`, the port is bound with `SO_REUSEPORT`, shared with the other worker processes of
    `modelsec serve --workers` (`modelsec.service.workers`); otherwise a port in use is an error. The store
    is checked every `readiness_interval` seconds (see the module docstring).

    Raises:
        PolicyError, KeyMaterialError: From loading the state (policy file, keys).
        KeyMaterialError: A TLS file cannot be read, is not a regular file or is larger than 1 MiB.
        BackendUnavailableError: The address cannot be bound or the store cannot be opened.
    """
    from modelsec.errors import BackendUnavailableError

    state = state or ServiceState(config)
    for problem in config.refusing_settings():  # a first configuration that refuses calls says which setting
        _log.warning('{"event":"config_refuses","message":%s}', json.dumps(problem))
    metrics = ServiceMetrics()
    state.decision_observer = _decision_observer(metrics)
    server = aio.server(
        interceptors=[ServiceInterceptor(config, metrics)],
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    for add in SERVICES.values():
        add(state, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [*SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    credentials = _credentials(config)
    try:
        if credentials is None:
            port = server.add_insecure_port(config.listen)
        else:
            port = server.add_secure_port(config.listen, credentials)
    except RuntimeError as e:
        raise BackendUnavailableError(f"cannot listen on {config.listen}: {e}") from e
    if port == 0:
        raise BackendUnavailableError(f"cannot listen on {config.listen}")
    await server.start()
    await _set_health(health, metrics, _store_problem(state))
    metrics_server = None
    if config.metrics_listen is not None:
        host, _, mport = config.metrics_listen.rpartition(":")
        metrics_server = MetricsServer(metrics, host.strip("[]"), int(mport))
        metrics_server.start()
    readiness = asyncio.create_task(_watch_store(state, health, metrics, readiness_interval))
    return RunningServer(server, port, state, metrics, health, metrics_server, readiness)


def _store_problem(state: ServiceState) -> str | None:
    """Why the store cannot serve now (its `BackendUnavailableError`), or None when it answers."""
    from modelsec.errors import BackendUnavailableError

    try:
        state.store.check()
    except BackendUnavailableError as e:
        return e.diagnostics()
    return None


async def _set_health(
    health: health_aio.HealthServicer, metrics: ServiceMetrics, problem: str | None
) -> None:
    """SERVING or NOT_SERVING, overall and per service, and `/readyz`, after a store check."""
    if problem != metrics.unready:
        if problem is None:
            _log.info('{"event":"store_ready"}')
        else:
            _log.warning('{"event":"store_unavailable","error":%s}', json.dumps(problem))
    metrics.unready = problem
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if problem is None
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICES):
        await health.set(name, status)  # a no-op once graceful shutdown has begun


async def _watch_store(
    state: ServiceState, health: health_aio.HealthServicer, metrics: ServiceMetrics, interval: float
) -> None:
    """Check the store every `interval` seconds in a worker thread (the check blocks), until cancelled."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[str | None] | None = None
    while True:
        await asyncio.sleep(interval)
        if pending is None:
            pending = loop.run_in_executor(None, _store_problem, state)
        try:
            problem = await asyncio.wait_for(asyncio.shield(pending), interval)
        except TimeoutError:
            problem = f"the attestation store did not answer a check within {interval:g} s"
        else:
            pending = None
        await _set_health(health, metrics, problem)


async def run_server(
    config: ServerConfig,
    *,
    on_ready: Callable[[RunningServer], None] | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully (see the module docstring)."""
    running = await start_server(config, reuse_port=reuse_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready(running)
    await stop.wait()
    _log.info('{"event":"shutdown","grace_seconds":%s}', config.grace_period)
    await running.stop()
