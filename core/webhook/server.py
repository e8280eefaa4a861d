"""The HTTPS front door of the admission webhook (starlette on uvicorn; the `webhook` extra).

Routes: `POST /validate` (AdmissionReview v1 in and out), `GET /healthz` (the process is up), `GET /readyz`
(the certificate is loaded and the attestation store answers `check()`), `GET /metrics`
(Prometheus text: `modelsec_webhook_decisions_total{outcome,reason}` and the
`modelsec_webhook_decision_seconds` histogram).

This module takes no trust decision: it reads the body (at most `WebhookConfig.max_body_bytes`, within
`WebhookConfig.deadline_seconds`: a body still arriving then is answered 408 and its connection closed), lets
`Reviewer.parse` find the uid (HTTP 400 without one), runs `Reviewer.decide` in a worker thread and stops
waiting at `WebhookConfig.deadline_seconds` (a deny), logs one JSON audit line per decision on the logger
`modelsec.webhook.audit`, and counts it. TLS only: the serving certificate and key are re-read when their
files change on disk (checked every `reload_interval` seconds; a pair that does not load is logged and the
previous one kept), so a rotated Kubernetes Secret takes effect without a restart. The policy file is
re-read the same way when it changes (`modelsec.webhook.reload`: an updated ConfigMap takes effect without a
restart; a file that does not load is logged and the previous policy kept).

Connection bounds (`build_server`): at most `limit_concurrency` connections at once (uvicorn answers 503
beyond), idle keep-alive connections closed after `timeout_keep_alive` seconds, request line and headers at
most `MAX_HEADER_BYTES`. A request's memory is thus bounded by its body limit, and the process's by
`limit_concurrency` times that. Not bounded: how long a client may take to send its headers (uvicorn has
no such timeout); such a connection holds one of the `limit_concurrency` slots.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from modelsec.errors import BackendUnavailableError, Error, KeyMaterialError
from modelsec.webhook.reload import PolicyReloader
from modelsec.webhook.review import BadRequestError, Decision, Reviewer

__all__ = ["AUDIT_LOGGER", "MAX_HEADER_BYTES", "CertificateReloader", "build_server", "create_app", "serve"]

MAX_HEADER_BYTES = 64 * 1024  # request line and headers (uvicorn's h11 limit); the apiserver sends a few

AUDIT_LOGGER = "modelsec.webhook.audit"
_log = logging.getLogger("modelsec.webhook")
_audit = logging.getLogger(AUDIT_LOGGER)


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class CertificateReloader:
    """One server `SSLContext` whose certificate and key follow the files on disk.

    New connections use the pair loaded last; established ones keep theirs. A changed pair is first loaded
    into a throwaway context, so a half-written or mismatched pair never replaces a working one.
    """

    def __init__(self, cert: Path, key: Path) -> None:
        """Load the pair (TLS 1.2 or later).

        Raises:
            KeyMaterialError: The certificate or key cannot be read or do not match.
        """
        self.cert, self.key = cert, key
        self.context = self._new_context()
        self._stamps = self._current_stamps()
        self.reloads = 0

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise KeyMaterialError(
                f"cannot load the serving certificate {self.cert} and key {self.key}: {e}"
            ) from e

    def _current_stamps(self) -> tuple[tuple[int, int, int], ...]:
        try:
            return (_stamp(self.cert), _stamp(self.key))
        except OSError as e:
            raise KeyMaterialError(f"cannot stat the serving certificate or key: {e.strerror}") from e

    def maybe_reload(self) -> bool:
        """Reload the pair if either file changed since the last load.

        Returns:
            True when a new pair was loaded.

        Raises:
            KeyMaterialError: The files changed but do not load (the previous pair stays in use; the next
                call tries again).
        """
        stamps = self._current_stamps()
        if stamps == self._stamps:
            return False
        self._new_context()  # validates the new pair before it touches the live context
        self._load(self.context)
        self._stamps = stamps
        self.reloads += 1
        return True


@dataclass(slots=True)
class _Metrics:
    registry: CollectorRegistry
    decisions: Counter
    latency: Histogram

    @classmethod
    def create(cls) -> _Metrics:
        registry = CollectorRegistry()
        return cls(
            registry,
            Counter(
                "modelsec_webhook_decisions",
                "Admission decisions by outcome (allow, deny, warn, audit, bad-request) and reason.",
                ["outcome", "reason"],
                registry=registry,
            ),
            Histogram(
                "modelsec_webhook_decision_seconds",
                "Time from request body read to response, in seconds.",
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                registry=registry,
            ),
        )


def _outcome(decision: Decision) -> str:
    if decision.verdict == "allow":
        return "allow"
    return "deny" if not decision.allowed else decision.mode.value


def create_app(
    reviewer: Reviewer,
    *,
    certificates: CertificateReloader | None = None,
    reload_interval: float = 10.0,
    workers: int = 4,
    policy: PolicyReloader | None = None,
) -> Starlette:
    """The ASGI application (routes in the module docstring).

    Args:
        reviewer: Decides on each review.
        certificates: Reloaded every `reload_interval` seconds while the app runs (None: no TLS here,
            for tests of the routes alone).
        reload_interval: Seconds between certificate checks.
        workers: Threads that run decisions (verification is CPU-bound); a request waiting for a free
            thread counts against its deadline.
        policy: Reloads the policy file every `reload_interval` seconds while the app runs (None: never).

    Returns:
        The Starlette app; `app.state.metrics_registry` holds its Prometheus registry.
    """
    metrics = _Metrics.create()
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix="modelsec-review"
    )
    deadline = reviewer.config.deadline_seconds
    max_body = reviewer.config.max_body_bytes

    async def read_body(request: Request) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def record(decision: Decision, started: float) -> None:
        elapsed = time.monotonic() - started
        metrics.decisions.labels(_outcome(decision), decision.reason).inc()
        metrics.latency.observe(elapsed)
        line = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "event": "admission-decision",
            "latencyMs": round(elapsed * 1000, 3),
            **decision.audit_record(),
        }
        _audit.info(json.dumps(line, sort_keys=True))

    def bad_request(message: str, started: float) -> Response:
        metrics.decisions.labels("bad-request", "no-uid").inc()
        metrics.latency.observe(time.monotonic() - started)
        _audit.info(json.dumps({"event": "admission-bad-request", "error": message}, sort_keys=True))
        return JSONResponse({"error": message}, status_code=400)

    async def validate(request: Request) -> Response:
        started = time.monotonic()
        try:
            body = await asyncio.wait_for(read_body(request), timeout=deadline)
        except TimeoutError:
            # A body trickling in (slowloris) must not hold a connection and its buffer: the apiserver
            # sends its review at once, so a body still arriving at the deadline is refused, the
            # connection closed.
            metrics.decisions.labels("bad-request", "slow-body").inc()
            _audit.info(json.dumps({"event": "admission-bad-request", "error": "slow body"}, sort_keys=True))
            return JSONResponse(
                {"error": f"request body not received within {deadline:g} s"},
                status_code=408,
                headers={"connection": "close"},
            )
        if body is None:
            return bad_request(f"request body larger than {max_body} bytes", started)
        try:
            parsed = reviewer.parse(body)
        except BadRequestError as e:
            return bad_request(e.diagnostics(), started)
        loop = asyncio.get_running_loop()
        try:
            remaining = max(0.0, deadline - (time.monotonic() - started))
            future = loop.run_in_executor(executor, lambda: reviewer.decide(parsed, started=started))
            decision = await asyncio.wait_for(future, timeout=remaining)
        except TimeoutError:
            decision = reviewer.deny_deadline(parsed)
        except Exception as e:  # noqa: BLE001 - fail closed: an executor failure is a deny, never an allow
            decision = reviewer.deny(parsed, "error", f"internal error: {type(e).__name__}")
        record(decision, started)
        return JSONResponse(decision.response)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        try:
            reviewer.store.check()
        except BackendUnavailableError as e:
            return PlainTextResponse(e.diagnostics() + "\n", status_code=503)
        return PlainTextResponse("ready\n")

    async def metrics_route(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = []
        if certificates is not None:
            tasks.append(asyncio.create_task(_reload_loop(certificates, reload_interval)))
        if policy is not None:
            tasks.append(asyncio.create_task(_policy_loop(policy, reload_interval)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            executor.shutdown(wait=False, cancel_futures=True)

    app = Starlette(
        routes=[
            Route("/validate", validate, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.metrics_registry = metrics.registry
    return app


async def _reload_loop(certificates: CertificateReloader, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            if certificates.maybe_reload():
                _log.info("reloaded the serving certificate from %s", certificates.cert)
        except KeyMaterialError as e:
            _log.warning("keeping the previous serving certificate: %s", e.diagnostics())


async def _policy_loop(policy: PolicyReloader, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            if policy.maybe_reload():
                _log.info("reloaded the policy file %s", policy.path)
        except Error as e:
            _log.warning("keeping the previous policy: %s", e.diagnostics())


def build_server(
    reviewer: Reviewer,
    cert: Path,
    key: Path,
    *,
    host: str = "0.0.0.0",  # noqa: S104 - a webhook Pod serves the cluster network
    port: int = 8443,
    reload_interval: float = 10.0,
    workers: int = 4,
    limit_concurrency: int = 128,
    timeout_keep_alive: float = 5.0,
    policy_file: Path | None = None,
) -> tuple[Any, CertificateReloader]:
    """A configured `uvicorn.Server` serving `create_app(reviewer)` over TLS, and its certificate reloader.

    Args:
        reviewer: Decides on each review.
        cert: Serving certificate (PEM), reloaded when it changes.
        key: Its private key (PEM).
        host: Address to listen on.
        port: Port to listen on (0: any free port).
        reload_interval: Seconds between certificate checks.
        workers: Threads that run decisions.
        limit_concurrency: Most connections (and requests) at once; uvicorn answers 503 beyond.
        timeout_keep_alive: Seconds an idle keep-alive connection stays open.
        policy_file: The file `reviewer.policies` came from, reloaded when it changes (None: never).

    Returns:
        The server (`run()` / `serve()`) and the certificate reloader.

    Raises:
        KeyMaterialError: The certificate or key cannot be loaded.
        PolicyError: `policy_file` cannot be stat'ed.
    """
    import uvicorn

    certificates = CertificateReloader(cert, key)
    app = create_app(
        reviewer,
        certificates=certificates,
        reload_interval=reload_interval,
        workers=workers,
        policy=PolicyReloader(policy_file, reviewer) if policy_file is not None else None,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(timeout_keep_alive),
        limit_concurrency=limit_concurrency,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    config.load()
    # Serve from the reloader's context, not the one uvicorn built, so that rotations take effect.
    config.ssl = certificates.context
    return uvicorn.Server(config), certificates


def serve(
    reviewer: Reviewer,
    cert: Path,
    key: Path,
    *,
    host: str = "0.0.0.0",  # noqa: S104 - a webhook Pod serves the cluster network
    port: int = 8443,
    policy_file: Path | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (graceful stop: in-flight reviews finish, at most 5 s).

    Raises:
        KeyMaterialError: The certificate or key cannot be loaded.
        PolicyError: `policy_file` cannot be stat'ed.
    """
    server, _ = build_server(reviewer, cert, key, host=host, port=port, policy_file=policy_file)
    server.run()
