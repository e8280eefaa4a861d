"""Errors for machines: every failed RPC carries a google.rpc.Status naming the modelsec error class.

Through a real server on loopback, for each error class the service raises, the typed client raises that
very class (not the lossy status-code mapping: KeyMaterialError was VerificationError, AttestationError was
VerificationError), and the wire carries an ErrorInfo (domain modelsec.dev, reason the class name). A status
without such details, or naming an unknown class, falls back to the status-code mapping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from modelsec import errors
from modelsec.algorithms import HashAlgorithm
from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.attestations.predicates.oms import manifest_statement
from modelsec.attestations.statement import serialize_statement
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.service.status import DOMAIN, trailing_metadata_for
from modelsec.service.store import StoreFullError
from modelsec.signer import load_private_key_file
from modelsec.signer.layout import MODEL_IGNORE_PATHS
from modelsec.signer.signing import compute_manifests
from modelsec.v1 import signing_pb2
from modelsec.verifier.attestations import GATE_PREDICATE_TYPE
from tests.conftest import write_tiny_model
from tests.service_support import InThreadServer, write_server_config
from tests.unit.verifier.test_joint_verification import gate_predicate

pytestmark = pytest.mark.integration

TOKEN = "t0ken"


def _gate(digest: str, key: Path, seed: int = 0) -> bytes:
    statement = Statement(
        (Subject("model", {"sha256": digest}),),
        GATE_PREDICATE_TYPE,
        gate_predicate(**{"parameters.seed": seed}),
    )
    return sign_statement(statement, load_private_key_file(key))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[tuple[InThreadServer, Path]]:
    root = tmp_path_factory.mktemp("details")
    model = write_tiny_model(root / "models" / "m")
    config = write_server_config(
        root / "server",
        key_dir,
        tokens=[{"identity": "ci", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}],
        keys=[
            {"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem"), "allow": ["ci"]},
            {"name": "nobody", "path": str(key_dir / "ecdsa-p384.key.pem"), "allow": ["someone-else"]},
        ],
        watermarkKeys=[{"name": "lost", "path": str(root / "missing.wmkey"), "allow": ["ci"]}],
        readRoots=[str(root / "models")],
    )
    with InThreadServer(config) as s:
        yield s, model


def _client(target: str, token: str | None = TOKEN) -> ModelsecClient:
    return ModelsecClient(target, ChannelOptions(plaintext=True, token=token, timeout=20))


def _raises(cls: type[errors.Error], call: Callable[[], Any]) -> errors.Error:
    with pytest.raises(errors.Error) as info:
        call()
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    return info.value


def test_each_error_class_the_service_raises_reaches_the_client_as_itself(
    server: tuple[InThreadServer, Path], key_dir: Path
) -> None:
    s, model = server
    manifests = compute_manifests(model, [HashAlgorithm.SHA256], ignore_paths=list(MODEL_IGNORE_PATHS))
    statement = serialize_statement(manifest_statement(manifests[HashAlgorithm.SHA256]))
    with _client(s.target, token=None) as anonymous:
        e = _raises(errors.AuthenticationError, anonymous.list_keys)
        assert "UNAUTHENTICATED" in str(e) and "no credentials" in str(e)
    with _client(s.target) as c:
        _raises(errors.NotFoundError, lambda: c.get_public_key("missing/1"))
        _raises(errors.PermissionDeniedError, lambda: c.sign_statement("nobody/1", statement))
        _raises(errors.MalformedArtifactError, lambda: c.sign_statement("ci-p256/1", b"{}"))
        # Lossy before: FAILED_PRECONDITION came back as VerificationError.
        e = _raises(errors.KeyMaterialError, lambda: c.detect_watermark(str(model), "lost"))
        assert "'lost' cannot be loaded" in str(e) and not isinstance(e, errors.VerificationError)
        untrusted = _gate("d" * 64, key_dir / "other.key.pem")
        e = _raises(errors.AttestationError, lambda: c.put_attestation(untrusted))
        assert "not trusted" in str(e)
        c.put_attestation(_gate("e" * 64, key_dir / "ecdsa-p256.key.pem", seed=1))
        s.running.state.store.max_bundles_per_digest = 1  # no config field sets it; the default is 256
        try:
            second = _gate("e" * 64, key_dir / "ecdsa-p256.key.pem", seed=2)
            e = _raises(StoreFullError, lambda: c.put_attestation(second))
        finally:
            s.running.state.store.max_bundles_per_digest = 256
        assert "RESOURCE_EXHAUSTED" in str(e)


def test_the_wire_carries_an_error_info(server: tuple[InThreadServer, Path]) -> None:
    """Another client (any language) reads the class from the status details, not from the message."""
    s, _ = server
    with _client(s.target) as c:
        with pytest.raises(grpc.RpcError) as info:
            c.signing.GetPublicKey(
                signing_pb2.GetPublicKeyRequest(key_version="missing/1"),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
                timeout=20,
            )
    status = rpc_status.from_call(info.value)  # type: ignore[arg-type]
    assert status is not None and status.code == grpc.StatusCode.NOT_FOUND.value[0]
    (detail,) = status.details
    error_info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(error_info)
    assert (error_info.domain, error_info.reason) == (DOMAIN, "NotFoundError")
    assert error_info.metadata["retryable"] == "false"


# -- a bare gRPC server on loopback answering GetPublicKey with whatever status a test chooses ------------


@pytest.fixture
def answering() -> Iterator[tuple[str, list[tuple[grpc.StatusCode, str, Any]]]]:
    answers: list[tuple[grpc.StatusCode, str, Any]] = []

    def get_public_key(request: Any, context: grpc.ServicerContext) -> Any:
        code, message, trailers = answers.pop(0)
        context.abort_with_status(_Status(code, message, trailers))

    handler = grpc.method_handlers_generic_handler(
        "modelsec.v1.SigningService",
        {
            "GetPublicKey": grpc.unary_unary_rpc_method_handler(
                get_public_key,
                request_deserializer=signing_pb2.GetPublicKeyRequest.FromString,
                response_serializer=signing_pb2.GetPublicKeyResponse.SerializeToString,
            )
        },
    )
    bare = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    bare.add_generic_rpc_handlers((handler,))
    port = bare.add_insecure_port("127.0.0.1:0")
    bare.start()
    try:
        yield f"127.0.0.1:{port}", answers
    finally:
        bare.stop(None)


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


def test_structured_fields_survive_the_trip(answering: tuple[str, list[Any]]) -> None:
    target, answers = answering
    code = grpc.StatusCode.FAILED_PRECONDITION
    digest = errors.DigestMismatchError("shard-1.safetensors", "a" * 64, "b" * 64)
    answers.append((code, digest.diagnostics(), trailing_metadata_for(digest, code, digest.diagnostics())))
    fileset = errors.FileSetMismatchError("m", ["evil.py"], [f"s{i}" for i in range(5000)])
    answers.append((code, "differs", trailing_metadata_for(fileset, code, "differs")))
    with _client(target, token=None) as c:
        got = _raises(errors.DigestMismatchError, lambda: c.get_public_key("k/1"))
        assert isinstance(got, errors.DigestMismatchError)
        assert (got.path, got.expected, got.actual, got.algorithm) == (
            "shard-1.safetensors",
            "a" * 64,
            "b" * 64,
            "sha256",
        )
        assert "FAILED_PRECONDITION" in str(got) and "shard-1.safetensors" in str(got)
        many = _raises(errors.FileSetMismatchError, lambda: c.get_public_key("k/1"))
        assert isinstance(many, errors.FileSetMismatchError)
        # 5000 names do not fit a trailer: whole names are kept while they fit.
        assert many.extra == ["evil.py"] and 10 < len(many.missing) < 5000
        assert many.missing == [f"s{i}" for i in range(len(many.missing))]


@pytest.mark.parametrize(
    ("reason", "domain", "expected"),
    [
        (None, None, errors.MalformedArtifactError),  # no details at all: the status code decides
        ("os.system", DOMAIN, errors.MalformedArtifactError),  # a reason is never an import path
        ("Exception", DOMAIN, errors.MalformedArtifactError),  # nor a class outside modelsec.errors
        ("KeyMaterialError", "example.com", errors.MalformedArtifactError),  # another domain's reason
        ("KeyMaterialError", DOMAIN, errors.KeyMaterialError),
    ],
)
def test_details_absent_or_unknown_fall_back_to_the_status_code(
    answering: tuple[str, list[Any]], reason: str | None, domain: str | None, expected: type[errors.Error]
) -> None:
    from google.protobuf import any_pb2
    from google.rpc import status_pb2

    target, answers = answering
    code = grpc.StatusCode.INVALID_ARGUMENT
    trailers: Any = None
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain))
        status = status_pb2.Status(code=code.value[0], message="bad", details=[detail])
        trailers = rpc_status.to_status(status).trailing_metadata
    answers.append((code, "bad", trailers))
    with _client(target, token=None) as c:
        e = _raises(expected, lambda: c.get_public_key("k/1"))
    assert str(e) == "GetPublicKey: INVALID_ARGUMENT: bad"
