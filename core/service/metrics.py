"""Prometheus metrics of the gRPC service and the side HTTP port that serves `/metrics` and `/healthz`.

Metrics (one registry per server, so several servers can live in one process):

* `modelsec_grpc_requests_total{method, code}`: finished RPCs by full method name and status code name;
* `modelsec_grpc_request_duration_seconds{method, code}`: latency histogram (seconds), same labels;
* `modelsec_grpc_decision_duration_seconds{method, policy, outcome, reason}`: the verdicts of VerifyModel and
  VerifyBundle (`outcome` allow/deny; `reason` `verified`, the refusing error class, or `refused` /
  `missing` / `ignored` for evidence), with the time each took (seconds); its `_count` counts them;
* `process_*`, `python_info` and `modelsec_build_info` (`modelsec.observability.register_runtime_metrics`).

`/healthz` (liveness) answers 200 while the server is serving and 503 once it is shutting down. `/readyz`
(readiness) answers 503 as well while the attestation store cannot be read (`unready` names why; the
`grpc.health.v1` service reports NOT_SERVING then too: `modelsec.service.server`).

With `modelsec serve --workers N` every worker records into prometheus-client's multiprocess files
(`PROMETHEUS_MULTIPROC_DIR`, set by `modelsec.service.workers`) and the supervisor serves `AggregateMetrics`:
the same metric names, summed over the workers (the `process_*` series are then the supervisor's own).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from modelsec import __version__
from modelsec.observability import register_runtime_metrics

__all__ = ["AggregateMetrics", "MetricsServer", "ServiceMetrics"]

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0)


class ServiceMetrics:
    """The RPC counters and latency histograms of one server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "modelsec_grpc_requests",
            "Finished modelsec gRPC calls by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "modelsec_grpc_request_duration_seconds",
            "Latency of modelsec gRPC calls by method and status code (seconds).",
            ["method", "code"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Histogram(
            "modelsec_grpc_decision_duration_seconds",
            "Verification verdicts by method, policy, outcome (allow, deny), reason; their time (seconds).",
            ["method", "policy", "outcome", "reason"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        register_runtime_metrics(self.registry, "serve", __version__)
        self.serving = True
        self.unready: str | None = None  # why the store cannot serve, set by the server's readiness checks
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def observe(self, method: str, code: str, seconds: float) -> None:
        """Record one finished call."""
        children = self._children.get((method, code))
        if children is None:  # label lookups cost more than the update itself: keep the children
            children = self.requests.labels(method, code), self.latency.labels(method, code)
            self._children[(method, code)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_decision(self, method: str, policy: str, outcome: str, reason: str, seconds: float) -> None:
        """Record one verdict (`outcome` allow or deny) of `policy` (names joined by `, `; `-` for none)."""
        self.decisions.labels(method, policy or "-", outcome, reason).observe(seconds)


class _MetricsView(Protocol):
    registry: CollectorRegistry
    serving: bool
    unready: str | None


class AggregateMetrics:
    """The metrics of all worker processes that write into `directory` (prometheus multiprocess mode)."""

    def __init__(self, directory: Path) -> None:
        from prometheus_client import multiprocess

        self.registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(self.registry, path=str(directory))  # type: ignore[no-untyped-call]
        register_runtime_metrics(self.registry, "serve", __version__)
        self.serving = True
        self.unready: str | None = None  # each worker checks its store and reports it on its gRPC health


class MetricsServer:
    """Plain-HTTP side port: GET /metrics (Prometheus text format), /healthz and /readyz; a daemon thread."""

    def __init__(self, metrics: _MetricsView, host: str, port: int) -> None:
        owner = metrics

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body, status, ctype = generate_latest(owner.registry), 200, CONTENT_TYPE_LATEST
                elif self.path in ("/healthz", "/readyz"):
                    problem = "shutting down" if not owner.serving else None
                    if problem is None and self.path == "/readyz" and owner.unready is not None:
                        problem = f"not ready: {owner.unready}"
                    body, status, ctype = (
                        (b"ok\n" if problem is None else problem.encode() + b"\n"),
                        (200 if problem is None else 503),
                        "text/plain",
                    )
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="modelsec-metrics", daemon=True
        )

    def start(self) -> None:
        """Start serving in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
