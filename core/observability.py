"""What the servers expose to operators: JSON log lines with timestamps, and process and build-info metrics.

`modelsec serve` (gRPC) and `modelsec webhook serve` call `configure_json_logging` for their logs and
`register_runtime_metrics` on their Prometheus registries, so both servers speak the same way:

* every log line on stderr is one JSON object: `time` (RFC 3339, UTC, milliseconds), `level`, `logger`, then
  the record's own fields when its message is a JSON object (the audit and RPC lines), else `message`;
* `/metrics` holds the `process_*` series (CPU seconds, resident memory, open file descriptors, start time;
  Linux `/proc`), `python_info`, and `modelsec_build_info{version, component, python}` (value 1).

* with tracing on (`$MODELSEC_OTEL=1`, off by default) and OpenTelemetry installed (the `otel` extra), one
  span per decision (`decision_tracer`): `modelsec.grpc.decision` (a VerifyBundle or VerifyModel verdict) and
  `modelsec.webhook.decision` (an admission review), with the decision's policy, outcome and reason as
  attributes and its duration as the span's. The spans go to the process's tracer provider:
  `configure_tracing` (called by both `serve` commands) installs the SDK's with an OTLP/HTTP exporter
  (`opentelemetry-exporter-otlp-proto-http`, configured by the standard `OTEL_EXPORTER_OTLP_*` variables)
  unless the application set one. A span is made when the decision is recorded, not around the work; no
  incoming trace context is joined (this first slice links no parent span).

Only the standard library is imported here; `prometheus_client` (the grpc and webhook extras) is imported by
`register_runtime_metrics`, and `opentelemetry` only when tracing is on.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "TRACING_ENV",
    "DecisionTracer",
    "JsonLogFormatter",
    "JsonMessage",
    "configure_json_logging",
    "configure_tracing",
    "decision_tracer",
    "register_runtime_metrics",
]

# `1` (or `true`) turns the decision spans on; anything else, or unset, leaves them off.
TRACING_ENV = "MODELSEC_OTEL"
_log = logging.getLogger("modelsec.observability")


class JsonMessage:
    """A log message that is one JSON object, encoded only when a handler asks for its text.

    `JsonLogFormatter` merges `fields` as they are (no encoding and decoding again per line, which the
    webhook's audit line, one per decision, would pay); any other formatter, and `record.getMessage()`, get
    `str(message)`: the object as JSON with sorted keys, the text a JSON-string message would have had.

    Attributes:
        fields: The object (JSON-ready values; others are written with `str`).
    """

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        """Wrap `fields` (not copied: the caller does not change it afterwards)."""
        self.fields = fields

    def __str__(self) -> str:
        """The object as one line of JSON, keys sorted."""
        return json.dumps(self.fields, sort_keys=True, default=str)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: `time`, `level`, `logger`, and the message's fields or `message`."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (a JSON-object message is merged; its own keys win but `time`)."""
        doc: dict[str, Any] = {"level": record.levelname.lower(), "logger": record.name}
        if isinstance(record.msg, JsonMessage) and not record.args:
            doc.update(record.msg.fields)
        else:
            message = record.getMessage()
            fields = _json_object(message)
            if fields is None:
                doc["message"] = message
            else:
                doc.update(fields)
        doc["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


def _json_object(message: str) -> dict[str, Any] | None:
    if not message.startswith("{"):
        return None
    try:
        value = json.loads(message)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def configure_json_logging(level: int | str = logging.INFO) -> None:
    """Send every log record of this process to stderr as one JSON line (`JsonLogFormatter`).

    For a server's start-up: it replaces the root logger's handlers, so an application calls it, never
    library code.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


class _BuildInfo:
    """`modelsec_build_info{version, component, python} 1` (a collector: no value to keep per process)."""

    def __init__(self, component: str, version: str) -> None:
        self._labels = {"version": version, "component": component, "python": platform.python_version()}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "modelsec_build_info", "modelsec build information (value 1).", labels=list(self._labels)
        )
        family.add_metric(list(self._labels.values()), 1.0)
        yield family


def register_runtime_metrics(registry: Any, component: str, version: str) -> None:
    """Add the process, platform and build-info collectors to a `prometheus_client.CollectorRegistry`.

    Args:
        registry: The server's registry (one per server, so several servers can share a process).
        component: `serve` or `webhook`, the `component` label of `modelsec_build_info`.
        version: `modelsec.__version__` (passed in: this bottom layer does not import the package root).
    """
    from prometheus_client import PlatformCollector, ProcessCollector

    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(_BuildInfo(component, version))


def _tracing_on() -> bool:
    return os.environ.get(TRACING_ENV, "").strip().lower() in ("1", "true")


class DecisionTracer:
    """Makes one span per recorded decision on an OpenTelemetry tracer (`decision_tracer`)."""

    def __init__(self, tracer: Any) -> None:
        """`tracer`: an `opentelemetry.trace.Tracer`."""
        self._tracer = tracer

    def record(self, name: str, seconds: float, attributes: Mapping[str, str]) -> None:
        """A span `name` that ended now and lasted `seconds`, with `attributes`; never raises."""
        try:
            end = time.time_ns()
            span = self._tracer.start_span(
                name, start_time=end - max(0, int(seconds * 1e9)), attributes=dict(attributes)
            )
            span.end(end_time=end)
        except Exception:  # noqa: BLE001  (a tracing backend's fault must not fail a decision)
            _log.warning('{"event":"tracing_failed","span":%s}', json.dumps(name), exc_info=True)


def decision_tracer(component: str) -> DecisionTracer | None:
    """The decision spans of a server's `component` (`serve`, `webhook`), or None when tracing is off.

    On only with `$MODELSEC_OTEL=1` and `opentelemetry-api` importable (the `otel` extra); otherwise None, and
    the servers make no span (nothing of OpenTelemetry is imported).
    """
    if not _tracing_on():
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        _log.warning('{"event":"tracing_unavailable","message":"%s=1 but opentelemetry is not installed: '
                     'pip install \'modelsec[otel]\'"}', TRACING_ENV)  # fmt: skip
        return None
    return DecisionTracer(trace.get_tracer(f"modelsec.{component}"))


def configure_tracing(component: str) -> None:
    """For a server's start-up, with tracing on: the SDK's tracer provider exporting over OTLP/HTTP.

    Does nothing when tracing is off, when the application already set a tracer provider, or when the SDK
    or the OTLP exporter is not installed (then a warning says which). An application calls it, never
    library code.
    """
    if not _tracing_on():
        return
    try:
        from opentelemetry import trace
        # Optional beyond the extra (its protobuf must fit the grpc extra's): looked up, not a static import.
        exporter = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        _log.warning(
            '{"event":"tracing_unavailable","message":%s}', json.dumps(f"{e}: pip install 'modelsec[otel]'")
        )
        return
    if type(trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        return  # the application's own provider
    provider = TracerProvider(resource=Resource.create({"service.name": f"modelsec-{component}"}))
    provider.add_span_processor(BatchSpanProcessor(exporter.OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
