"""Transport and operations: TLS, mutual TLS identities, the standard health and reflection clients,
`modelsec serve` as a process (SIGTERM, restart with the store kept)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from modelsec.attestations.bundle import parse_bundle
from modelsec.errors import (
    AuthenticationError,
    BackendUnavailableError,
    PermissionDeniedError,
    ServerUnreachableError,
)
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.support.service import InThreadServer, spawn_cli_server, write_server_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mtls_server(
    tmp_path_factory: pytest.TempPathFactory, key_dir: Path, tls: dict[str, Path]
) -> Iterator[InThreadServer]:
    d = tmp_path_factory.mktemp("mtls")
    # Its own server: mutual TLS with the session PKI's CA; keys and puts only for the CI identity.
    config = write_server_config(
        d,
        key_dir,
        tls={"cert": str(tls["server"]), "key": str(tls["server_key"]), "clientCA": str(tls["ca"])},
        keys=[
            {
                "name": "ci-p256",
                "path": str(key_dir / "ecdsa-p256.key.pem"),
                "allow": ["spiffe://example.org/ci/*"],
            }
        ],
        access={"putAttestation": ["spiffe://example.org/ci/*"]},
    )
    with InThreadServer(config) as server:
        yield server


def _client(server: InThreadServer, tls: dict[str, Path], who: str | None) -> ModelsecClient:
    return ModelsecClient(
        server.target,
        ChannelOptions(
            ca=tls["ca"],
            cert=tls[who] if who else None,
            key=tls[f"{who}_key"] if who else None,
            server_name="localhost",
            timeout=10,
        ),
    )


def test_mtls_identity_comes_from_the_certificate(mtls_server: InThreadServer, tls: dict[str, Path]) -> None:
    with _client(mtls_server, tls, "ci") as ci:
        assert [k.name for k in ci.list_keys()] == ["ci-p256/1"]
        assert ci.get_public_key("ci-p256/1").key.name == "ci-p256/1"
    with _client(mtls_server, tls, "dev") as dev:  # valid certificate, identity 'developer-laptop'
        assert dev.list_keys() == []
        with pytest.raises(PermissionDeniedError, match="'developer-laptop' may not use key version"):
            dev.get_public_key("ci-p256/1")
        with pytest.raises(PermissionDeniedError, match="may not call putAttestation"):
            dev.put_attestation(b"{}")


@pytest.mark.parametrize("who", ["rogue", None])
def test_mtls_refuses_foreign_or_missing_client_certificates(
    mtls_server: InThreadServer, tls: dict[str, Path], who: str | None
) -> None:
    """A certificate from another CA (same SPIFFE ID) or none at all: the handshake fails, no RPC runs."""
    with (
        _client(mtls_server, tls, who) as client,
        pytest.raises(BackendUnavailableError, match="UNAVAILABLE"),
    ):
        client.list_keys()


def test_tls_with_bearer_token(tmp_path: Path, key_dir: Path, tls: dict[str, Path]) -> None:
    import hashlib

    # Its own server: server-side TLS with bearer tokens and no anonymous access.
    config = write_server_config(
        tmp_path,
        key_dir,
        tls={"cert": str(tls["server"]), "key": str(tls["server_key"])},
        tokens=[{"identity": "ci-team", "sha256": hashlib.sha256(b"t0ken").hexdigest()}],
        keys=[{"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem"), "allow": ["ci-team"]}],
    )
    with InThreadServer(config) as server:
        options = ChannelOptions(ca=tls["ca"], server_name="localhost", token="t0ken")
        with ModelsecClient(server.target, options) as client:
            assert [k.name for k in client.list_keys()] == ["ci-p256/1"]
        with ModelsecClient(server.target, ChannelOptions(ca=tls["ca"], server_name="localhost")) as none:
            with pytest.raises(AuthenticationError, match="no credentials"):
                none.list_keys()
        # A client that does not trust the server's CA never sends its token.
        with ModelsecClient(
            server.target, ChannelOptions(ca=tls["rogue"], server_name="localhost", token="t0ken")
        ) as c:
            with pytest.raises(ServerUnreachableError) as info:
                c.list_keys()
            assert info.value.problem == "untrusted-certificate" and "UNAVAILABLE" in info.value.details[0]


def test_health_and_reflection_with_the_standard_clients(
    mtls_server: InThreadServer, tls: dict[str, Path]
) -> None:
    with _client(mtls_server, tls, "dev") as client:
        health = health_pb2_grpc.HealthStub(client.channel)
        for service in ("", "modelsec.v1.SigningService", "modelsec.v1.AttestationService"):
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="nope.Service"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        db = ProtoReflectionDescriptorDatabase(client.channel)
        services = set(db.get_services())
        assert {
            "modelsec.v1.SigningService",
            "modelsec.v1.VerificationService",
            "grpc.health.v1.Health",
        } <= services
        method = db.FindFileContainingSymbol("modelsec.v1.SigningService")
        assert method.name == "modelsec/v1/signing.proto"


@pytest.mark.slow
def test_sigterm_restart_keeps_the_store(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "model")
    result = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    bundle = (model / "model.sig").read_bytes()
    # Its own server, a child process: the test stops it with SIGTERM and starts it again.
    config = write_server_config(tmp_path / "server", key_dir, gracePeriod=2, metricsListen="127.0.0.1:0")
    first = spawn_cli_server(config)
    try:
        with ModelsecClient(first.target, ChannelOptions(plaintext=True)) as client:
            stored = client.put_attestation(bundle)
            health = health_pb2_grpc.HealthStub(client.channel)
            assert (
                health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
            )
    finally:
        code, err = first.terminate()
    assert code == 0, err
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r.get("event") == "shutdown" and r.get("grace_seconds") == 2.0 for r in logs), logs
    assert any(
        r.get("method") == "/modelsec.v1.AttestationService/PutAttestation" and r["code"] == "OK"
        for r in logs
    )
    second = spawn_cli_server(config)
    try:
        with ModelsecClient(second.target, ChannelOptions(plaintext=True)) as client:
            (got,) = client.get_attestations(result.root_digest)
            assert got.bundle == bundle and got.attestation.id == stored.attestation.id
            assert parse_bundle(got.bundle, source="x").hint
    finally:
        code, err = second.terminate()
    assert code == 0, err


def test_bad_configuration_exits_1_with_a_diagnostic(tmp_path: Path, key_dir: Path) -> None:
    from tests.conftest import run_cli

    config = write_server_config(
        tmp_path, key_dir, keys=[{"name": "k", "path": str(tmp_path / "missing.pem")}]
    )
    r = run_cli("serve", "--config", config)
    assert r.returncode == 1 and "missing.pem" in r.stderr, r.stderr
    encrypted = [{"name": "k", "path": str(key_dir / "ecdsa-p256.key.pem"), "passwordEnv": "NO_SUCH_VAR_X"}]
    r = run_cli("serve", "--config", write_server_config(tmp_path, key_dir, keys=encrypted))
    assert r.returncode == 1 and "keys[0] (k/1): passwordEnv $NO_SUCH_VAR_X is unset" in r.stderr, r.stderr
    r = run_cli(
        "serve",
        "--config",
        write_server_config(tmp_path, key_dir, keys=[{"name": "d", "path": str(tmp_path)}]),
    )
    assert r.returncode == 1 and "keys[0] (d/1)" in r.stderr and "not a regular file" in r.stderr, r.stderr
    (tmp_path / "bad.yaml").write_text("kind: ServerConfig\n")
    r = run_cli("serve", "--config", tmp_path / "bad.yaml")
    assert r.returncode == 1 and "missing field(s)" in r.stderr, r.stderr
