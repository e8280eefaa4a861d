"""Two `modelsec serve` replicas on one PostgreSQL database hold one state that survives a kill -9 of either.

Real processes, since the death of a process is under test; one real PostgreSQL server (`postgres`) with a
database of this test's own, its password given to the replicas as a file (as a mounted Secret would).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from modelsec.errors import NotFoundError, PolicyError
from modelsec.policy import Policy
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.service.config import load_server_config
from modelsec.service.state import ServiceState
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_attestations
from modelsec.verifier.stores import StoreOptions, open_store
from tests.conftest import write_tiny_model
from tests.support.postgres import Postgres
from tests.support.service import ChildServer, spawn_cli_server, write_server_config

pytestmark = pytest.mark.integration

_ACCESS = {"putAttestation": ["*"], "supersedeAttestation": ["*"], "deleteAttestation": ["*"]}


def _replica_config(directory: Path, key_dir: Path, url: str, password_file: Path) -> Path:
    return write_server_config(
        directory,
        key_dir,
        dataDir=None,
        store={"url": url, "passwordFile": str(password_file)},
        access=_ACCESS,
    )


def _client(server: ChildServer) -> ModelsecClient:
    return ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=20))


def _kill9(server: ChildServer) -> None:
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.communicate(timeout=30)
    assert server.process.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_replicas_share_puts_withdrawals_and_idempotency_and_survive_kill_9(
    tmp_path: Path, key_dir: Path, postgres: Postgres
) -> None:
    model = write_tiny_model(tmp_path / "model", shards=1)
    keys = {a: load_private_key_file(key_dir / f"{a}.key.pem") for a in ("ecdsa-p256", "sm2")}
    v1 = sign_model(model, [keys["ecdsa-p256"]])
    digest = v1.root_digest
    first = (model / "model.sig").read_bytes()
    sign_model(model, [keys["sm2"]])
    second = (model / "model.sm2.sig").read_bytes()  # a second signer's evidence about the same model
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem", key_dir / "sm2.pub.pem"])

    url = postgres.new_database()
    password_file = tmp_path / "db-password"
    password_file.write_text(postgres.password + "\n")
    configs = [_replica_config(tmp_path / name, key_dir, url, password_file) for name in ("a", "b")]
    servers = [spawn_cli_server(c) for c in configs]
    try:
        a, b = (_client(s) for s in servers)
        put = a.put_attestation(first)
        assert put.created
        assert b.bundles(digest) == [first]  # a put through A is read through B

        b.supersede_attestation(digest, put.attestation.id)  # withdrawn through B...
        assert a.bundles(digest) == []  # ...is withdrawn for A's readers
        again = a.put_attestation(first)  # the same record through A: not new, and stays withdrawn
        assert not again.created and again.attestation.id == put.attestation.id
        assert b.bundles(digest) == []
        with pytest.raises(NotFoundError):
            a.supersede_attestation(digest, put.attestation.id)

        replacement = b.put_attestation(second)  # superseded by new evidence, put through B
        assert replacement.created
        assert a.bundles(digest) == [second]
        assert [r.id for r in a.list_attestations(root_digest=digest)] == [replacement.attestation.id]

        for i in range(2):  # kill -9 each replica in turn and start it again on the same database
            _kill9(servers[i])
            a.close() if i == 0 else b.close()
            servers[i] = spawn_cli_server(configs[i])
            a, b = (_client(s) for s in servers)
            assert a.bundles(digest) == [second] and b.bundles(digest) == [second]
            assert not a.put_attestation(first).created  # the withdrawal survived too

        # Both replicas put one new record at once, eight times each: one record, one `created`.
        other = write_tiny_model(tmp_path / "other", shards=1, seed=1)
        other_digest = sign_model(other, [keys["ecdsa-p256"]]).root_digest
        third = (other / "model.sig").read_bytes()
        with ThreadPoolExecutor(8) as pool:
            created = list(pool.map(lambda i: (a, b)[i % 2].put_attestation(third).created, range(16)))
        assert created.count(True) == 1 and b.bundles(other_digest) == [third]
        # What the replicas serve is evidence a verifier accepts, read through either one.
        with open_store(
            f"grpc://{servers[1].target}", StoreOptions(channel=ChannelOptions(plaintext=True))
        ) as s:
            assert verify_attestations(digest, s.entries(digest), policy).ok
        a.close()
        b.close()
    finally:
        for server in servers:
            server.terminate()


def test_store_urls_that_would_leak_the_password_are_refused(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def config(**store: str) -> Path:
        return write_server_config(tmp_path, key_dir, dataDir=None, store=store)

    with pytest.raises(PolicyError, match=r"store\.url holds a password"):
        load_server_config(config(url="postgresql://modelsec:hunter2@127.0.0.1/db"))
    with pytest.raises(PolicyError, match=r"reaches db\.example\.org with sslmode=require"):
        load_server_config(config(url="postgresql://modelsec@db.example.org/db?sslmode=require"))
    with pytest.raises(PolicyError, match=r"reaches db\.example\.org with sslmode=prefer"):
        load_server_config(config(url="postgresql://modelsec@db.example.org/db"))
    with pytest.raises(PolicyError, match="one attestation store"):
        load_server_config(write_server_config(tmp_path, key_dir, store={"url": "postgresql://u@[::1]/db"}))
    verified = "postgresql://modelsec@db.example.org/db?sslmode=verify-full&sslrootcert=/ca.pem"
    assert load_server_config(config(url=verified)).store is not None
    # A URL from the environment (a Secret) may hold the password, and is checked when the server starts.
    env_config = load_server_config(config(urlEnv="MODELSEC_TEST_STORE_URL"))
    with pytest.raises(PolicyError, match=r"urlEnv \$MODELSEC_TEST_STORE_URL is unset"):
        ServiceState(env_config)
    monkeypatch.setenv("MODELSEC_TEST_STORE_URL", "postgresql://modelsec:pw@db.example.org/db")
    with pytest.raises(PolicyError, match=r"urlEnv \$MODELSEC_TEST_STORE_URL: store URL reaches db.example"):
        ServiceState(env_config)
