"""Machine-readable error details: a `modelsec.errors` class <-> a `google.rpc.Status` (grpcio-status).

The interceptor attaches to every failed RPC a `google.rpc.Status` whose one detail is a
`google.rpc.ErrorInfo`: `domain` "modelsec.dev", `reason` the name of the modelsec error class raised (the
nearest class in `ERROR_CLASSES` for a private subclass), `metadata` the fields the error names (file,
expected and actual digests, extra and missing files) plus `retryable`. The typed client reads it back and
raises that class; a status without such a detail (another server, a proxy, a transport error) falls back
to the status-code mapping. Only classes in `ERROR_CLASSES` are ever constructed from a reason: a reason is
data from the network, never an import path.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from modelsec import errors
from modelsec.service.store import StoreFullError
from modelsec.service.work import CancelledWorkError, DeadlinePassedError

__all__ = ["DOMAIN", "ERROR_CLASSES", "error_from_status", "error_info", "trailing_metadata_for"]

DOMAIN = "modelsec.dev"
_CLASSES: list[type[errors.Error]] = [getattr(errors, name) for name in errors.__all__]
ERROR_CLASSES: dict[str, type[errors.Error]] = {
    cls.__name__: cls for cls in (*_CLASSES, StoreFullError, CancelledWorkError, DeadlinePassedError)
}
# The attributes an error may carry, sent as ErrorInfo metadata (strings; lists as JSON arrays).
_FIELDS: dict[type[errors.Error], tuple[str, ...]] = {
    errors.DigestMismatchError: ("path", "expected", "actual", "algorithm"),
    errors.FileSetMismatchError: ("model", "extra", "missing"),
    errors.UntrustedSignerError: ("path", "keyid"),
}
_MAX_METADATA_CHARS = 1024
_LIST_FIELDS = frozenset({"extra", "missing"})


def _public_class(error: errors.Error) -> type[errors.Error]:
    for cls in type(error).__mro__:
        known = ERROR_CLASSES.get(cls.__name__)
        if known is cls:
            return known
    return errors.Error


def _bounded_list(items: list[str]) -> str:
    # Trailers are bounded (~16 KiB on the client): whole names while they fit, never a cut one.
    kept: list[str] = []
    for item in items:
        if len(json.dumps([*kept, item])) > _MAX_METADATA_CHARS:
            break
        kept.append(item)
    return json.dumps(kept)


def error_info(error: errors.Error) -> dict[str, Any]:
    """The ErrorInfo fields for `error`: `reason` (class name) and `metadata` (clipped strings)."""
    cls = _public_class(error)
    metadata = {"retryable": "true" if error.retryable else "false"}
    for name in _FIELDS.get(cls, ()):
        value = getattr(error, name, None)
        if isinstance(value, list):
            value = _bounded_list([str(v) for v in value])
        if isinstance(value, str):
            metadata[name] = value[:_MAX_METADATA_CHARS]
    return {"reason": cls.__name__, "domain": DOMAIN, "metadata": metadata}


def trailing_metadata_for(
    error: errors.Error, code: grpc.StatusCode, message: str
) -> tuple[tuple[str, str | bytes], ...]:
    """The `grpc-status-details-bin` trailer carrying the status of a failed call with `error`'s ErrorInfo."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(**error_info(error)))
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return tuple(rpc_status.to_status(status).trailing_metadata)


def _field(name: str, text: str) -> str | list[str]:
    if name not in _LIST_FIELDS:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def error_from_status(prefix: str, call: Any) -> errors.Error | None:
    """The modelsec error a failed call's status details name, or None when they name none.

    `prefix` starts the message (the client puts the method and status code there); the server's message
    follows. Fields the server sent for `DigestMismatchError` / `FileSetMismatchError` are restored.
    """
    try:
        status = rpc_status.from_call(call)
    except (ValueError, TypeError, AttributeError):
        return None  # a status code that contradicts the details, or not a call at all
    if status is None:
        return None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if not detail.Is(info.DESCRIPTOR) or not detail.Unpack(info) or info.domain != DOMAIN:
            continue
        cls = ERROR_CLASSES.get(info.reason)
        if cls is None:
            return None
        # Subclasses with structured constructors are built without them; their fields come from metadata.
        error: errors.Error = Exception.__new__(cls)
        Exception.__init__(error, f"{prefix}: {status.message}")
        for name in _FIELDS.get(cls, ()):
            setattr(error, name, _field(name, info.metadata.get(name, "")))
        return error
    return None
