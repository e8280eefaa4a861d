"""What the servers expose to operators: JSON log lines with timestamps, and process and build-info metrics.

`modelsec serve` (gRPC) and `modelsec webhook serve` call `configure_json_logging` for their logs and
`register_runtime_metrics` on their Prometheus registries, so both servers speak the same way:

* every log line on stderr is one JSON object: `time` (RFC 3339, UTC, milliseconds), `level`, `logger`, then
  the record's own fields when its message is a JSON object (the audit and RPC lines), else `message`;
* `/metrics` holds the `process_*` series (CPU seconds, resident memory, open file descriptors, start time;
  Linux `/proc`), `python_info`, and `modelsec_build_info{version, component, python}` (value 1).

Only the standard library is imported here; `prometheus_client` (the grpc and webhook extras) is imported by
`register_runtime_metrics`.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

__all__ = ["JsonLogFormatter", "configure_json_logging", "register_runtime_metrics"]


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: `time`, `level`, `logger`, and the message's fields or `message`."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (a JSON-object message is merged; its own keys win but `time`)."""
        message = record.getMessage()
        doc: dict[str, Any] = {"level": record.levelname.lower(), "logger": record.name}
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
