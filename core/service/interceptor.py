"""The one server interceptor: authentication, error mapping, deadlines, metrics and structured logs.

Every modelsec RPC passes through `ServiceInterceptor` (the standard `grpc.health.v1` and reflection
services are left alone: probes and tooling call them without credentials). In order:

1. authenticate: a bearer token (`authorization: Bearer <token>`, compared by SHA-256) or, failing that,
   the mutual-TLS client certificate (first URI SAN, else first DNS SAN, else subject CN); nothing ->
   UNAUTHENTICATED unless the server allows anonymous plaintext development;
2. a call whose deadline has already passed is refused with DEADLINE_EXCEEDED before any work;
3. the servicer runs with the identity in `state.current_identity`;
4. `modelsec.errors` are mapped to status codes (`status_for`), with a `google.rpc.Status` trailer whose
   `ErrorInfo` names the error class and its fields (`modelsec.service.status`); anything else is INTERNAL
   with a generic message and a reference id, the traceback going to the log only;
5. one JSON log line and the Prometheus counters/histogram per RPC, labelled by method and status code.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from modelsec.errors import (
    AuthenticationError,
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
    UnsupportedAlgorithmError,
)
from modelsec.service.config import ServerConfig
from modelsec.service.metrics import ServiceMetrics
from modelsec.service.state import current_identity
from modelsec.service.status import trailing_metadata_for
from modelsec.service.store import StoreFullError
from modelsec.service.work import CancelledWorkError, DeadlinePassedError

__all__ = ["ServiceInterceptor", "clip", "identity_from_certificate", "status_for"]

_log = logging.getLogger("modelsec.service")
_UNTOUCHED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
_MAX_CACHED_CERTIFICATES = 1024
# Status details travel as HTTP/2 trailers (the client refuses more than ~16 KiB of metadata) and end up in
# logs: a diagnostic that echoes a huge client-supplied value is cut here, whatever raised it.
_MAX_DETAIL_CHARS = 1024


def clip(text: str, limit: int = _MAX_DETAIL_CHARS) -> str:
    """`text`, cut to `limit` characters with a note of how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def status_for(error: Error) -> grpc.StatusCode:
    """The status code for a modelsec error (DESIGN.md decision 8).

    AuthenticationError -> UNAUTHENTICATED; PermissionDeniedError -> PERMISSION_DENIED; NotFoundError ->
    NOT_FOUND; StoreFullError -> RESOURCE_EXHAUSTED; work stopped by the call's deadline or cancellation ->
    DEADLINE_EXCEEDED or CANCELLED; MalformedArtifactError, PolicyError, UnsupportedAlgorithmError ->
    INVALID_ARGUMENT (the request is wrong); BackendUnavailableError -> UNAVAILABLE (retryable); every other
    error (signature, digest, attestation, key material, gate) -> FAILED_PRECONDITION (the artifact or setup
    must change first).
    """
    if isinstance(error, DeadlinePassedError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(error, CancelledWorkError):
        return grpc.StatusCode.CANCELLED
    if isinstance(error, StoreFullError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, AuthenticationError):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(error, PermissionDeniedError):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(error, NotFoundError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, MalformedArtifactError | PolicyError | UnsupportedAlgorithmError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, BackendUnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.FAILED_PRECONDITION


def identity_from_certificate(pem: bytes) -> str | None:
    """The identity a client certificate proves: first URI SAN (SPIFFE ID), else first DNS SAN, else CN."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        for kind in (x509.UniformResourceIdentifier, x509.DNSName):
            values = san.get_values_for_type(kind)
            if values:
                return str(values[0])
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else None


class _Authenticator:
    def __init__(self, config: ServerConfig) -> None:
        self._tokens = {t.sha256: t.identity for t in config.tokens}
        self._anonymous = config.allow_anonymous
        self._cert_cache: dict[bytes, str | None] = {}

    def identity(self, context: aio.ServicerContext[Any, Any]) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                text = value.decode("latin-1") if isinstance(value, bytes) else value
                scheme, _, token = text.partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise AuthenticationError("the authorization header must be 'Bearer <token>'")
                identity = self._tokens.get(hashlib.sha256(token.strip().encode()).hexdigest())
                if identity is None:
                    raise AuthenticationError("unknown bearer token")
                return identity
        auth = context.auth_context()
        certs = auth.get("x509_pem_cert") if auth else None
        if certs:
            pem = next(iter(certs))
            if pem not in self._cert_cache:
                if len(self._cert_cache) >= _MAX_CACHED_CERTIFICATES:
                    self._cert_cache.clear()
                self._cert_cache[pem] = identity_from_certificate(pem)
            identity = self._cert_cache[pem]
            if identity:
                return identity
            raise AuthenticationError("the client certificate names no identity (no SAN, no CN)")
        if self._anonymous:
            return "anonymous"
        raise AuthenticationError("no credentials: present a client certificate or a bearer token")


class ServiceInterceptor(aio.ServerInterceptor):
    """Wraps every modelsec RPC handler (unary-unary, unary-stream) with the steps in the module docstring."""

    def __init__(self, config: ServerConfig, metrics: ServiceMetrics) -> None:
        self._auth = _Authenticator(config)
        self._metrics = metrics
        # method -> (the servicer's handler, our wrapper): each method is wrapped once, not on every call.
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(  # noqa: D102 - see the class docstring
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_UNTOUCHED_PREFIXES):
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped: grpc.RpcMethodHandler[Any, Any]
        if handler.unary_unary is not None:
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        elif handler.unary_stream is not None:
            wrapped = grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        else:
            return handler  # no client-streaming RPCs in modelsec.v1
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap_unary(self, method: str, inner: Any) -> Any:
        async def unary(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            call = _Call(self, method, context)
            try:
                call.begin()
                return await inner(request, context)
            except BaseException as e:
                await call.fail(e)
                raise
            finally:
                call.end()

        return unary

    def _wrap_stream(self, method: str, inner: Any) -> Any:
        async def stream(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            call = _Call(self, method, context)
            try:
                call.begin()
                async for item in inner(request, context):
                    yield item
            except BaseException as e:
                await call.fail(e)
                raise
            finally:
                call.end()

        return stream


class _Call:
    """Book-keeping of one RPC: identity, outcome, timing."""

    def __init__(
        self, owner: ServiceInterceptor, method: str, context: aio.ServicerContext[Any, Any]
    ) -> None:
        self.owner, self.method, self.context = owner, method, context
        self.start = time.perf_counter()
        self.identity = "-"
        self.code = grpc.StatusCode.OK
        self.error = ""
        self._token: Any = None

    def begin(self) -> None:
        self.identity = self.owner._auth.identity(self.context)
        remaining = self.context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlinePassedError("deadline exceeded before the call started")
        self._token = current_identity.set(self.identity)

    async def fail(self, e: BaseException) -> None:
        if isinstance(e, Error):
            self.code, self.error = status_for(e), clip(e.diagnostics())
            await self.context.abort(self.code, self.error, trailing_metadata_for(e, self.code, self.error))
        elif isinstance(e, aio.AbortError | grpc.RpcError):
            self.code = self.context.code() or grpc.StatusCode.UNKNOWN  # already aborted by the servicer
            return
        elif isinstance(e, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
            return
        else:
            reference = uuid.uuid4().hex[:12]
            _log.error("internal error %s in %s", reference, self.method, exc_info=e)
            self.code, self.error = grpc.StatusCode.INTERNAL, f"internal error (reference {reference})"
        await self.context.abort(self.code, self.error)

    def end(self) -> None:
        if self._token is not None:
            current_identity.reset(self._token)
        elapsed = time.perf_counter() - self.start
        code = self.code.name
        self.owner._metrics.observe(self.method, code, elapsed)
        if _log.isEnabledFor(logging.INFO):
            record = {
                "event": "rpc",
                "method": self.method,
                "identity": self.identity,
                "code": code,
                "ms": round(elapsed * 1000, 3),
                "peer": self.context.peer(),
            }
            if self.error:
                record["error"] = self.error
            _log.info(json.dumps(record, separators=(",", ":")))
