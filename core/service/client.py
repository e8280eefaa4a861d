"""A small typed client for the modelsec.v1 services (blocking; one channel, reused).

```python
from modelsec.service.client import ModelsecClient, ChannelOptions
with ModelsecClient("signer.internal:50051", ChannelOptions(ca=Path("ca.pem"), token="...")) as c:
    bundle = c.sign_statement("ci-p256/1", statement_bytes)
```

Errors: a failed call raises the `modelsec.errors` class the server raised, named by the `google.rpc.Status`
details it sends (`modelsec.service.status`; `DigestMismatchError.path` etc. restored). Without such details
(another server, a proxy, a transport failure) the class follows the status code (`error_for_status`):
UNAUTHENTICATED -> AuthenticationError, PERMISSION_DENIED -> PermissionDeniedError, NOT_FOUND ->
NotFoundError, INVALID_ARGUMENT -> MalformedArtifactError, FAILED_PRECONDITION -> VerificationError,
UNAVAILABLE/DEADLINE_EXCEEDED/CANCELLED -> BackendUnavailableError (retryable), others (RESOURCE_EXHAUSTED:
a message over 4 MiB or a full store slot) -> Error; the message names the method and carries the server's
diagnostic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations.statement import Statement
from modelsec.errors import (
    AuthenticationError,
    BackendUnavailableError,
    Error,
    KeyMaterialError,
    MalformedArtifactError,
    NotFoundError,
    PermissionDeniedError,
    ServerUnreachableError,
    VerificationError,
)
from modelsec.safe_io import read_regular_file
from modelsec.service.status import error_from_status
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

__all__ = ["ChannelOptions", "ModelsecClient", "RemoteSigner", "error_for_status"]

TOKEN_ENV = "MODELSEC_TOKEN"  # noqa: S105 - the name of the variable, not a secret
MAX_TLS_FILE_BYTES = 1 << 20
_ERRORS: dict[grpc.StatusCode, type[Error]] = {
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: MalformedArtifactError,
    grpc.StatusCode.FAILED_PRECONDITION: VerificationError,
    grpc.StatusCode.UNAVAILABLE: BackendUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: BackendUnavailableError,
    grpc.StatusCode.CANCELLED: BackendUnavailableError,
}


def error_for_status(
    method: str, error: grpc.RpcError, *, target: str | None = None, plaintext: bool = False
) -> Error:
    """The `modelsec.errors` instance for a failed call (see the module docstring).

    With `target`, a connection that failed for TLS (TLS spoken to a plaintext server, plaintext to a TLS
    server, an untrusted certificate) is a `ServerUnreachableError` saying what to give instead.
    """
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    detail = error.details() if hasattr(error, "details") else str(error)
    raised = error_from_status(f"{method}: {code.name}", error)
    if raised is not None:
        return raised
    problem = _tls_problem(detail or "", plaintext) if code is grpc.StatusCode.UNAVAILABLE else None
    if target is not None and problem is not None:
        return ServerUnreachableError(target, problem, f"{method}: {code.name}: {detail}")
    return _ERRORS.get(code, Error)(f"{method}: {code.name}: {detail}")


def _tls_problem(detail: str, plaintext: bool) -> str | None:
    """Which `ServerUnreachableError.problem` gRPC's UNAVAILABLE text is, or None (not a TLS failure)."""
    if plaintext:
        # A TLS server drops the plaintext HTTP/2 preface without a word.
        return "tls-server" if "Socket closed" in detail or "Connection reset" in detail else None
    if "handshake failed" not in detail.lower() and "SSL_ERROR" not in detail:
        return None
    if "WRONG_VERSION_NUMBER" in detail or "wrong version number" in detail or "packet length" in detail:
        return "plaintext-server"
    if "CERTIFICATE_VERIFY_FAILED" in detail:
        return "untrusted-certificate"
    return "tls"


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    """How to reach the server.

    Attributes:
        ca: CA bundle (PEM) that signed the server certificate; None with `plaintext`.
        cert: Client certificate (PEM) for mutual TLS.
        key: Client private key (PEM) for mutual TLS.
        token: Bearer token sent as `authorization: Bearer <token>`.
        plaintext: No TLS (local development only; tokens then cross the wire in clear).
        server_name: Override the TLS name checked against the server certificate.
        timeout: Per-call deadline in seconds (streaming gate runs use `gate_timeout`).
    """

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    token: str | None = None
    plaintext: bool = False
    server_name: str | None = None
    timeout: float = 30.0


def _tls_file(path: Path | None, what: str) -> bytes | None:
    """A PEM file of the TLS configuration (None: not given).

    Raises:
        KeyMaterialError: Missing, unreadable, not a regular file, or larger than 1 MiB.
    """
    if path is None:
        return None
    return read_regular_file(path, what, max_bytes=MAX_TLS_FILE_BYTES, error=KeyMaterialError)


class ModelsecClient:
    """Blocking client of the modelsec.v1 services; use as a context manager or call `close()`.

    Raises (constructor):
        KeyMaterialError: A TLS file of `options` cannot be read (`_tls_file`).
    """

    def __init__(self, target: str, options: ChannelOptions | None = None) -> None:
        self.options = options or ChannelOptions()
        self.target = target
        opts: list[tuple[str, Any]] = []
        if self.options.server_name:
            opts.append(("grpc.ssl_target_name_override", self.options.server_name))
        if self.options.plaintext:
            self.channel = grpc.insecure_channel(target, options=opts)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_tls_file(self.options.ca, "TLS CA file"),
                private_key=_tls_file(self.options.key, "TLS key file"),
                certificate_chain=_tls_file(self.options.cert, "TLS certificate file"),
            )
            self.channel = grpc.secure_channel(target, creds, options=opts)
        self._metadata = (("authorization", f"Bearer {self.options.token}"),) if self.options.token else ()
        self.signing = signing_pb2_grpc.SigningServiceStub(self.channel)
        self.verification = verification_pb2_grpc.VerificationServiceStub(self.channel)
        self.attestations = attestation_pb2_grpc.AttestationServiceStub(self.channel)
        self.watermark = watermark_pb2_grpc.WatermarkServiceStub(self.channel)
        self.robustness = robustness_pb2_grpc.RobustnessServiceStub(self.channel)

    def __enter__(self) -> ModelsecClient:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def _error(self, method: str, e: grpc.RpcError) -> Error:
        return error_for_status(method, e, target=self.target, plaintext=self.options.plaintext)

    def _call(self, method: str, fn: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return fn(request, timeout=timeout or self.options.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(method, e) from None

    # -- signing -------------------------------------------------------------------------------------------

    def sign_statement(self, key_version: str, statement: bytes) -> signing_pb2.SignStatementResponse:
        """Sign an in-toto statement (JSON bytes) with a server-held key version; returns bundle and key."""
        return self._call(  # type: ignore[no-any-return]
            "SignStatement",
            self.signing.SignStatement,
            signing_pb2.SignStatementRequest(key_version=key_version, statement=statement),
        )

    def get_public_key(self, key_version: str) -> signing_pb2.GetPublicKeyResponse:
        """The key version's metadata and public key PEM."""
        return self._call(  # type: ignore[no-any-return]
            "GetPublicKey",
            self.signing.GetPublicKey,
            signing_pb2.GetPublicKeyRequest(key_version=key_version),
        )

    def list_keys(self) -> list[signing_pb2.KeyVersion]:
        """The key versions this caller may use."""
        return list(self._call("ListKeys", self.signing.ListKeys, signing_pb2.ListKeysRequest()).keys)

    # -- verification --------------------------------------------------------------------------------------

    def verify_bundle(
        self, root_digest: str, bundles: list[bytes], *, policy: str = "", require_signatures: bool = False
    ) -> verification_pb2.VerifyBundleResponse:
        """The verdict on bundles about a model root digest (untrusted is a verdict, not an error)."""
        return self._call(  # type: ignore[no-any-return]
            "VerifyBundle",
            self.verification.VerifyBundle,
            verification_pb2.VerifyBundleRequest(
                root_digest=root_digest, bundles=bundles, policy=policy, require_signatures=require_signatures
            ),
        )

    def verify_model(
        self, path: str, *, timeout: float | None = None
    ) -> verification_pb2.VerifyModelResponse:
        """Verify a model directory on the server (under its read roots)."""
        return self._call(  # type: ignore[no-any-return]
            "VerifyModel",
            self.verification.VerifyModel,
            verification_pb2.VerifyModelRequest(path=path),
            timeout,
        )

    # -- attestation store ---------------------------------------------------------------------------------

    def put_attestation(self, bundle: bytes) -> attestation_pb2.PutAttestationResponse:
        """Store a bundle (the server verifies it against its policy first)."""
        return self._call(  # type: ignore[no-any-return]
            "PutAttestation",
            self.attestations.PutAttestation,
            attestation_pb2.PutAttestationRequest(bundle=bundle),
        )

    def get_attestations(self, root_digest: str) -> list[attestation_pb2.GetAttestationsResponse]:
        """Every stored bundle about a model root digest, with its metadata."""
        try:
            stream = self.attestations.GetAttestations(
                attestation_pb2.GetAttestationsRequest(root_digest=root_digest),
                timeout=self.options.timeout,
                metadata=self._metadata,
            )
            return list(stream)
        except grpc.RpcError as e:
            raise self._error("GetAttestations", e) from None

    def bundles(self, digest: str) -> list[bytes]:
        """The stored bundles about a digest (the webhook's `AttestationStore` protocol)."""
        return [r.bundle for r in self.get_attestations(digest)]

    def delete_attestation(self, root_digest: str, record_id: str) -> None:
        """Remove a stored record for good (the server checks the `deleteAttestation` permission)."""
        self._call(
            "DeleteAttestation",
            self.attestations.DeleteAttestation,
            attestation_pb2.DeleteAttestationRequest(root_digest=root_digest, id=record_id),
        )

    def supersede_attestation(self, root_digest: str, record_id: str) -> None:
        """Withdraw a stored record from readers, keeping it (permission `supersedeAttestation`)."""
        self._call(
            "SupersedeAttestation",
            self.attestations.SupersedeAttestation,
            attestation_pb2.SupersedeAttestationRequest(root_digest=root_digest, id=record_id),
        )

    def list_attestations(
        self, *, root_digest: str = "", page_size: int = 100
    ) -> Iterator[attestation_pb2.StoredAttestation]:
        """Every stored record (newest first), fetching pages as needed."""
        token = ""
        while True:
            page = self._call(
                "ListAttestations",
                self.attestations.ListAttestations,
                attestation_pb2.ListAttestationsRequest(
                    root_digest=root_digest, page_size=page_size, page_token=token
                ),
            )
            yield from page.attestations
            token = page.next_page_token
            if not token:
                return

    # -- watermark and robustness --------------------------------------------------------------------------

    def detect_watermark(
        self, model_path: str, watermark_key: str, message: bytes = b"", *, timeout: float | None = None
    ) -> watermark_pb2.DetectWatermarkResponse:
        """Detect the watermark in a model directory on the server."""
        return self._call(  # type: ignore[no-any-return]
            "DetectWatermark",
            self.watermark.DetectWatermark,
            watermark_pb2.DetectWatermarkRequest(
                model_path=model_path, watermark_key=watermark_key, message=message
            ),
            timeout,
        )

    def embed_watermark(
        self, request: watermark_pb2.EmbedWatermarkRequest, *, timeout: float | None = None
    ) -> watermark_pb2.EmbedWatermarkResponse:
        """Write a watermarked copy of a model directory on the server."""
        return self._call("EmbedWatermark", self.watermark.EmbedWatermark, request, timeout)  # type: ignore[no-any-return]

    def run_gate(
        self, request: robustness_pb2.RunGateRequest, *, timeout: float | None = None
    ) -> Iterator[robustness_pb2.RunGateResponse]:
        """Start a gate run: progress messages, then the result; closing the iterator cancels the run."""
        call = self.robustness.RunGate(request, timeout=timeout, metadata=self._metadata)
        try:
            yield from call
        except grpc.RpcError as e:
            raise self._error("RunGate", e) from None
        finally:
            call.cancel()


class RemoteSigner:
    """A `modelsec.signer.BundleSigner` backed by the SigningService: `sign_model(dir, [RemoteSigner(...)])`.

    The public key is fetched once (`GetPublicKey`) and, when `expected_public_key_pem` is given, must equal
    it (pin the key so a compromised or misconfigured server cannot substitute another). Every returned
    bundle is checked before it is accepted: it parses strictly, its payload is byte for byte the statement
    that was sent, and its signature verifies under that public key.

    Raises (constructor and `sign_bundle`):
        KeyMaterialError: The server's key differs from the pinned one.
        SignatureError: The returned bundle does not sign the sent statement with that key.
        The errors of `error_for_status` for failed calls.
    """

    def __init__(
        self, client: ModelsecClient, key_version: str, *, expected_public_key_pem: bytes | None = None
    ) -> None:
        from modelsec.errors import KeyMaterialError
        from modelsec.signer.keys import load_trusted_key

        self.client = client
        self.key_version = key_version
        response = client.get_public_key(key_version)
        self._pem = response.public_key_pem
        self._trusted = load_trusted_key(self._pem, name=key_version)
        if expected_public_key_pem is not None:
            pinned = load_trusted_key(expected_public_key_pem, name="pinned")
            if pinned.keyid != self._trusted.keyid:
                raise KeyMaterialError(
                    f"key version {key_version!r} on the server is not the pinned public key"
                )

    @property
    def algorithm(self) -> SignatureAlgorithm:
        """The key version's signature algorithm."""
        return self._trusted.algorithm

    def public_key_pem(self) -> bytes:
        """The key version's public key (PEM)."""
        return self._pem

    def sign_bundle(self, statement: Statement) -> bytes:
        """Ask the server to sign `statement`; return the checked bundle JSON."""
        from modelsec.attestations.bundle import parse_bundle
        from modelsec.attestations.statement import serialize_statement
        from modelsec.errors import SignatureError
        from modelsec.verifier.trust.bundles import verify_bundle_signature

        payload = serialize_statement(statement)
        data = self.client.sign_statement(self.key_version, payload).bundle
        bundle = parse_bundle(data, source=f"bundle from {self.key_version}")
        if bundle.envelope.payload != payload:
            raise SignatureError(f"the server's bundle for {self.key_version!r} signs another statement")
        verify_bundle_signature(bundle, [self._trusted], role=None)
        return data
