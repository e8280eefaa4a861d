"""The HTTPS front door of the admission webhook (starlette on uvicorn; the `webhook` extra).

Routes: `POST /validate` (AdmissionReview v1 in and out), `POST /mutate` (the mutating webhook,
`modelsec.webhook.mutate`: the same, with a JSON patch), `GET /healthz` (the process is up), `GET /readyz`
(the certificate is loaded and the attestation store answers `check()`), `GET /metrics`
(Prometheus text: `modelsec_webhook_decisions_total{outcome,reason}` and the
`modelsec_webhook_decision_seconds` histogram).

This module takes no trust decision: it reads the body (at most `WebhookConfig.max_body_bytes`, within
`WebhookConfig.deadline_seconds`: a body still arriving then is answered 408 and its connection closed), lets
`Reviewer.parse` find the uid (HTTP 400 without one), answers a review its cache decides on the event loop
(`Reviewer.decide_cached`: cached results whose stores' revision memory and a local directory listing still
vouch for; no worker hand-over, so a cached decision never waits behind slow verifications), runs
`Reviewer.decide` in a worker thread for every other and stops waiting at `WebhookConfig.deadline_seconds`
(a deny), logs one JSON audit line per decision on the logger `modelsec.webhook.audit`, and counts it.
TLS only: the serving certificate and key are re-read when their files change on disk (checked every
`reload_interval` seconds; a pair that does not load is logged and the previous one kept), so a rotated
Kubernetes Secret takes effect without a restart. The policy file is
re-read the same way when it changes (`modelsec.webhook.reload`: an updated ConfigMap takes effect without a
restart; a file that does not load is logged and the previous policy kept).

Connection bounds (`build_server`, `ConnectionLimits`), so that neither idle nor slow clients can take the
API server's place:

* every request's headers must be complete within `header_timeout` seconds: for the first request counted
  from the accept (the TLS handshake included: asyncio's `ssl_handshake_timeout` is set to the same value),
  for later ones from the end of the previous response. A connection that misses it is closed (no reply);
* a connection waiting for a request is *idle*; each client (source IPv4 address, or IPv6 /64) keeps at most
  `max_idle_per_client` idle connections and the server at most `max_idle`: beyond either, the client's (or
  the server's) oldest idle connection is closed. New connections are never refused for being new, so the
  API server always gets in, and it sends its review at once;
* at most `max_connections` connections at once (uvicorn answers 503 beyond); since at most `max_idle` of
  them are idle, at least `max_connections - max_idle` reviews can always run;
* request line and headers at most `MAX_HEADER_BYTES`, a body within the decision deadline (above).

A request's memory is thus bounded by its body limit, and the process's by `max_connections` times that.
Not bounded here: how many TCP connections wait in their TLS handshake (each at most `header_timeout`; they
hold a file descriptor, not a slot). The NetworkPolicy in `deploy/webhook/components/apiserver-only`
admits only the API server where the cluster allows it (see deploy/README.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import ipaddress
import json
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from modelsec import __version__
from modelsec.errors import BackendUnavailableError, Error, KeyMaterialError
from modelsec.observability import DecisionTracer, JsonMessage, decision_tracer, register_runtime_metrics
from modelsec.webhook.mutate import Mutator
from modelsec.webhook.reload import PolicyReloader
from modelsec.webhook.review import AdmissionRequest, BadRequestError, Decision, Reviewer

__all__ = [
    "AUDIT_LOGGER",
    "MAX_HEADER_BYTES",
    "CertificateReloader",
    "ConnectionLimits",
    "build_server",
    "create_app",
    "serve",
]

MAX_HEADER_BYTES = 64 * 1024  # request line and headers (uvicorn's h11 limit); the apiserver sends a few

AUDIT_LOGGER = "modelsec.webhook.audit"
_log = logging.getLogger("modelsec.webhook")
_audit = logging.getLogger(AUDIT_LOGGER)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on the server's connections (the idle-flood and slow-header defences; module docstring).

    Attributes:
        header_timeout: Seconds from the accept (TLS handshake included), or from the end of the previous
            response, to a request's complete headers; then the connection is closed. The API server sends
            its review at once, so a few seconds is generous.
        max_idle_per_client: Idle connections (waiting for a request) one client keeps; its oldest beyond are
            closed. Above the API server's own pool of idle connections to a webhook (25 per host: Kubernetes
            `utilnet.SetTransportDefaults`), so it never loses one to this bound.
        max_idle: Idle connections the server keeps; the oldest beyond are closed.
        max_connections: Connections at once (uvicorn answers 503 beyond); must exceed `max_idle`.
    """

    header_timeout: float = 5.0
    max_idle_per_client: int = 32
    max_idle: int = 128
    max_connections: int = 256

    def __post_init__(self) -> None:
        """Refuse limits that would leave no room for a review (a programming error: ValueError)."""
        if not self.header_timeout > 0 or min(self.max_idle_per_client, self.max_idle) < 1:
            raise ValueError("header_timeout, max_idle_per_client and max_idle must be positive")
        if self.max_connections <= self.max_idle:
            raise ValueError(
                "max_connections must exceed max_idle, or idle connections could take every slot"
            )


def _client_key(client: tuple[str, int] | None) -> str:
    """The unit a client is counted in: its IPv4 address, or its IPv6 /64 (one host's usual allocation)."""
    if client is None:
        return ""
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return client[0]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _IdleConnections:
    """Connections waiting for a request, oldest first, overall and per client (event-loop thread only)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self._limits = limits
        self._all: OrderedDict[Any, str] = OrderedDict()
        self._by_client: dict[str, OrderedDict[Any, None]] = {}

    def add(self, connection: Any, client: str) -> list[Any]:
        """Record `connection` as idle; return the connections to close (the oldest beyond the bounds)."""
        self._all[connection] = client
        self._by_client.setdefault(client, OrderedDict())[connection] = None
        excess: list[Any] = []
        mine = self._by_client[client]
        while len(mine) > self._limits.max_idle_per_client:
            oldest = next(iter(mine))
            self.discard(oldest)
            excess.append(oldest)
        while len(self._all) > self._limits.max_idle:
            oldest = next(iter(self._all))
            self.discard(oldest)
            excess.append(oldest)
        return excess

    def discard(self, connection: Any) -> None:
        """Forget `connection` (it sent a request, or closed); unknown connections are ignored."""
        client = self._all.pop(connection, None)
        if client is None:
            return
        mine = self._by_client[client]
        del mine[connection]
        if not mine:
            del self._by_client[client]


def _protocol_class(limits: ConnectionLimits) -> type[Any]:
    """The h11 protocol of uvicorn, with the header deadline and the idle bounds of `limits` added.

    uvicorn arms no timer before the first request and counts idle connections against its concurrency
    limit, so idle TLS connections alone could take every slot. The protocol is created at the accept,
    before the TLS handshake, which is where the first request's header deadline starts.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    idle = _IdleConnections(limits)

    class _Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._idle_since: float | None = self.loop.time()  # the accept
            self._header_timer: asyncio.TimerHandle | None = None
            self._client_key = ""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._client_key = _client_key(self.client)
            self._track()

        def connection_lost(self, exc: Exception | None) -> None:
            self._idle_since = None
            self._stop_waiting()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            self._track()

        def on_response_complete(self) -> None:
            self._idle_since = self.loop.time()  # the next request's headers are due from now
            super().on_response_complete()
            self._track()

        def _track(self) -> None:
            if self.transport is None or self.transport.is_closing():
                self._stop_waiting()
            elif self.conn.their_state is h11.IDLE:  # no request line and headers complete yet
                if self._header_timer is None:
                    since = self.loop.time() if self._idle_since is None else self._idle_since
                    self._header_timer = self.loop.call_at(since + limits.header_timeout, self._drop)
                    for connection in idle.add(self, self._client_key):
                        connection._drop()
            else:
                self._idle_since = None
                self._stop_waiting()

        def _stop_waiting(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            idle.discard(self)

        def _drop(self) -> None:
            # abort, not close: a TLS close waits up to 30 s for the client's close_notify, a slot held.
            self._stop_waiting()
            if self.transport is not None:
                self.transport.abort()

    return _Protocol


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
    # The series of each label set, looked up once (`labels()` checks and locks on every call).
    _counts: dict[tuple[str, str], Any] = field(default_factory=dict)
    _latencies: dict[tuple[str, str, str], Any] = field(default_factory=dict)

    def record(self, outcome: str, policy: str, reason: str, seconds: float) -> None:
        """Count one decision and observe its latency."""
        count = self._counts.get((outcome, reason))
        if count is None:
            count = self._counts[outcome, reason] = self.decisions.labels(outcome, reason)
        latency = self._latencies.get((outcome, policy, reason))
        if latency is None:
            latency = self._latencies[outcome, policy, reason] = self.latency.labels(outcome, policy, reason)
        count.inc()
        latency.observe(seconds)

    @classmethod
    def create(cls) -> _Metrics:
        registry = CollectorRegistry()
        register_runtime_metrics(registry, "webhook", __version__)
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
                "Time from request body read to response (seconds), by outcome, deciding policy and reason.",
                ["outcome", "policy", "reason"],
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                registry=registry,
            ),
        )


def _trace(tracer: DecisionTracer | None, decision: Decision, seconds: float) -> None:
    """The decision's span, when tracing is on (`modelsec.observability.decision_tracer`)."""
    if tracer is not None:
        attributes = {"modelsec.outcome": _outcome(decision), "modelsec.policy": _policy_label(decision)}
        attributes |= {"modelsec.reason": decision.reason, "modelsec.uid": decision.uid}
        tracer.record("modelsec.webhook.decision", seconds, attributes)


def _policy_label(decision: Decision) -> str:
    """The policy that decided: the first refused reference's, else the first reference's; `-` for none."""
    refs = [r for r in decision.references if not r.allowed] or list(decision.references)
    return next((r.policy for r in refs if r.policy), "-")


def _outcome(decision: Decision) -> str:
    if decision.verdict == "allow":
        return "allow"
    return "deny" if not decision.allowed else decision.mode.value


async def _read_body(request: Request, max_body: int) -> bytes | None:
    """The request body, or None when it is larger than `max_body` bytes (reading stops there)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _decision(
    reviewer: Reviewer,
    executor: concurrent.futures.Executor,
    parsed: AdmissionRequest,
    started: float,
    decide: Callable[[AdmissionRequest, float], Decision],
    cached: Callable[[AdmissionRequest, float], Decision | None] | None,
) -> Decision:
    """`cached`'s decision made here on the event loop, else `decide`'s in a worker within the deadline.

    A decision the cache answers (`Reviewer.decide_cached`: memory and a local listing) costs less than the
    hand-over to a worker thread and back; any other runs in `executor`, and the wait stops at the
    deadline (a deny). Never raises: a failure is a deny.
    """
    if cached is not None:
        try:
            decision = cached(parsed, started)
        except Exception as e:  # noqa: BLE001 - fail closed: a bug here is a deny, never an allow
            return reviewer.deny(parsed, "error", f"internal error: {type(e).__name__}")
        if decision is not None:
            return decision
    remaining = max(0.0, reviewer.config.deadline_seconds - (time.monotonic() - started))
    try:
        async with asyncio.timeout(remaining):
            return await asyncio.get_running_loop().run_in_executor(executor, decide, parsed, started)
    except TimeoutError:
        return reviewer.deny_deadline(parsed)
    except Exception as e:  # noqa: BLE001 - fail closed: an executor failure is a deny, never an allow
        return reviewer.deny(parsed, "error", f"internal error: {type(e).__name__}")


def create_app(
    reviewer: Reviewer,
    *,
    certificates: CertificateReloader | None = None,
    reload_interval: float = 10.0,
    workers: int = 4,
    policy: PolicyReloader | None = None,
    mutator: Mutator | None = None,
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
        mutator: Answers `POST /mutate` (None: 404 there); it shares `reviewer`'s policies and deadline.

    Returns:
        The Starlette app; `app.state.metrics_registry` holds its Prometheus registry.
    """
    metrics = _Metrics.create()
    tracer = decision_tracer("webhook")
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix="modelsec-review"
    )
    deadline = reviewer.config.deadline_seconds
    max_body = reviewer.config.max_body_bytes

    def record(decision: Decision, started: float) -> None:
        elapsed = time.monotonic() - started
        metrics.record(_outcome(decision), _policy_label(decision), decision.reason, elapsed)
        _trace(tracer, decision, elapsed)
        line = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "event": "admission-decision",
            "latencyMs": round(elapsed * 1000, 3),
            **decision.audit_record(),
        }
        _audit.info(JsonMessage(line))

    def bad_request(message: str, started: float) -> Response:
        metrics.decisions.labels("bad-request", "no-uid").inc()
        metrics.latency.labels("bad-request", "-", "no-uid").observe(time.monotonic() - started)
        _audit.info(json.dumps({"event": "admission-bad-request", "error": message}, sort_keys=True))
        return JSONResponse({"error": message}, status_code=400)

    async def answer(
        request: Request,
        decide: Callable[[AdmissionRequest, float], Decision],
        cached: Callable[[AdmissionRequest, float], Decision | None] | None = None,
    ) -> Response:
        started = time.monotonic()
        try:
            # `asyncio.timeout`, not `wait_for`: no task per request, the same deadline.
            async with asyncio.timeout(deadline):
                body = await _read_body(request, max_body)
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
        decision = await _decision(reviewer, executor, parsed, started, decide, cached)
        record(decision, started)
        return JSONResponse(decision.response)

    def decide(parsed: AdmissionRequest, started: float) -> Decision:
        return reviewer.decide(parsed, started=started)

    def decide_cached(parsed: AdmissionRequest, started: float) -> Decision | None:
        return reviewer.decide_cached(parsed, started=started)

    async def validate(request: Request) -> Response:
        return await answer(request, decide, decide_cached)

    async def mutate(request: Request) -> Response:
        if mutator is None:
            return PlainTextResponse("no mutating webhook here\n", status_code=404)
        return await answer(request, lambda parsed, started: mutator.mutate(parsed, started=started).decision)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        try:
            reviewer.check()
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
            Route("/mutate", mutate, methods=["POST"]),
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
    limits: ConnectionLimits | None = None,
    timeout_keep_alive: float = 5.0,
    policy_file: Path | None = None,
    mutator: Mutator | None = None,
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
        limits: Header deadline and connection bounds (module docstring); defaults to `ConnectionLimits()`.
        timeout_keep_alive: Seconds an idle keep-alive connection stays open (at most
            `limits.header_timeout` in effect: the next request's headers are due by then).
        policy_file: The file `reviewer.policies` came from, reloaded when it changes (None: never).
        mutator: Answers `POST /mutate` (None: not served).

    Returns:
        The server (`run()` / `serve()`; it listens with the handshake bound) and the certificate reloader.

    Raises:
        KeyMaterialError: The certificate or key cannot be loaded.
        PolicyError: `policy_file` cannot be stat'ed.
    """
    import uvicorn

    bounds = limits or ConnectionLimits()
    certificates = CertificateReloader(cert, key)
    app = create_app(
        reviewer,
        certificates=certificates,
        reload_interval=reload_interval,
        workers=workers,
        policy=PolicyReloader(policy_file, reviewer) if policy_file is not None else None,
        mutator=mutator,
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
        limit_concurrency=bounds.max_connections,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        # The bounds live in our h11 protocol and in asyncio's loop: never httptools or uvloop.
        http=_protocol_class(bounds),
        loop="asyncio",
    )
    config.load()
    # Serve from the reloader's context, not the one uvicorn built, so that rotations take effect.
    config.ssl = certificates.context

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[Any] | None = None) -> None:
            # uvicorn passes no `ssl_handshake_timeout`, and asyncio's default (60 s) would let a client that
            # never finishes its handshake outlast the header deadline; the handshake gets the same bound.
            loop = asyncio.get_running_loop()
            create_server = loop.create_server
            bounded = functools.partial(create_server, ssl_handshake_timeout=bounds.header_timeout)
            setattr(loop, "create_server", bounded)  # noqa: B010 - shadows the method on this loop only
            try:
                await super().startup(sockets=sockets)
            finally:
                delattr(loop, "create_server")

    return _Server(config), certificates


def serve(
    reviewer: Reviewer,
    cert: Path,
    key: Path,
    *,
    host: str = "0.0.0.0",  # noqa: S104 - a webhook Pod serves the cluster network
    port: int = 8443,
    policy_file: Path | None = None,
    limits: ConnectionLimits | None = None,
    mutator: Mutator | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (graceful stop: in-flight reviews finish, at most 5 s).

    `limits` bounds idle and slow connections (`ConnectionLimits`; its defaults when None); `mutator`
    answers `POST /mutate` (None: not served).

    Raises:
        KeyMaterialError: The certificate or key cannot be loaded.
        PolicyError: `policy_file` cannot be stat'ed.
    """
    server, _ = build_server(
        reviewer, cert, key, host=host, port=port, policy_file=policy_file, limits=limits, mutator=mutator
    )
    server.run()
