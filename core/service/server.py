"""The `grpc.aio` server behind `modelsec serve`.

What runs: the modelsec.v1 services (`SERVICES`), the standard health service (`grpc.health.v1.Health`,
SERVING per service and overall, NOT_SERVING once shutdown starts), server reflection, the interceptor
(`modelsec.service.interceptor`), and the metrics side port. Messages are limited to gRPC's 4 MiB default in
both directions (digests and bundles cross the wire, never weights).

Shutdown: SIGTERM or SIGINT flips health to NOT_SERVING, stops accepting calls, gives in-flight calls
`gracePeriod` seconds, then cancels the rest (a running gate sees the cancellation at its next batch and
stops) and closes the store.
"""

from __future__ import annotations

import asyncio
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

__all__ = ["MAX_MESSAGE_BYTES", "SERVICES", "RunningServer", "run_server", "start_server"]

_log = logging.getLogger("modelsec.service")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MAX_TLS_FILE_BYTES = 1 << 20


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

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port (None when disabled)."""
        return self.metrics_server.port if self.metrics_server else None

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, no new calls, `grace` seconds for in-flight ones, then cancel."""
        self.metrics.serving = False
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


async def start_server(
    config: ServerConfig, state: ServiceState | None = None, *, reuse_port: bool = False
) -> RunningServer:
    """Build and start the server for `config` (port 0 in `listen` picks a free port).

    With `reuse_port`, the port is bound with `SO_REUSEPORT`, shared with the other worker processes of
    `modelsec serve --workers` (`modelsec.service.workers`); otherwise a port in use is an error.

    Raises:
        PolicyError, KeyMaterialError: From loading the state (policy file, keys).
        KeyMaterialError: A TLS file cannot be read, is not a regular file or is larger than 1 MiB.
        BackendUnavailableError: The address cannot be bound or the store cannot be opened.
    """
    from modelsec.errors import BackendUnavailableError

    state = state or ServiceState(config)
    metrics = ServiceMetrics()
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
    for name in ("", *SERVICES):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    metrics_server = None
    if config.metrics_listen is not None:
        host, _, mport = config.metrics_listen.rpartition(":")
        metrics_server = MetricsServer(metrics, host.strip("[]"), int(mport))
        metrics_server.start()
    return RunningServer(server, port, state, metrics, health, metrics_server)


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
