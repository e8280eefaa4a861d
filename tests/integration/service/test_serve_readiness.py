"""A `modelsec serve` replica whose PostgreSQL cannot be reached reports NOT_SERVING, and SERVING again after.

The shared database is the replicas' whole state: a replica that cannot read it must leave the Service's
endpoints (gRPC health, `/readyz`) rather than answer every call with UNAVAILABLE, and come back by itself.
The outage is real and confined to a database of this test's own on the session's PostgreSQL server: its
connections are refused (`ALLOW_CONNECTIONS false`) and the server's connection is terminated, then allowed
again. Liveness (`/healthz`) stays up throughout: restarting the pod would not bring the database back.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.postgres import Postgres
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
_INTERVAL = 0.2


def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _until(what: Callable[[], bool], timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < end, "the readiness check did not follow the database"
        time.sleep(_INTERVAL / 2)


@pytest.mark.slow
def test_a_replica_whose_database_is_down_is_not_serving_until_it_is_back(
    tmp_path: Path, key_dir: Path, postgres: Postgres
) -> None:
    import psycopg

    url = postgres.new_database()
    name = url.rsplit("/", 1)[1]
    password_file = tmp_path / "db-password"
    password_file.write_text(postgres.password + "\n")
    config = write_server_config(
        tmp_path,
        key_dir,
        dataDir=None,
        store={"url": url, "passwordFile": str(password_file)},
        metricsListen="127.0.0.1:0",
    )
    with (
        InThreadServer(config, readiness_interval=_INTERVAL) as server,
        grpc.insecure_channel(server.target) as channel,
        psycopg.connect(postgres.url(), password=postgres.password, autocommit=True) as admin,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        metrics = server.running.metrics_port
        assert metrics is not None

        def status(service: str = "") -> int:
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            return int(answer.status)

        assert status() == SERVING and _http(metrics, "/readyz") == (200, "ok\n")

        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> "
            "pg_backend_pid()",
            (name,),
        )
        _until(lambda: status() == NOT_SERVING)
        assert status("modelsec.v1.AttestationService") == NOT_SERVING
        code, body = _http(metrics, "/readyz")
        assert code == 503 and "not ready" in body and name in body  # names the store and why
        assert postgres.password not in body
        assert _http(metrics, "/healthz") == (200, "ok\n")  # alive: a restart would not help

        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        _until(lambda: status() == SERVING)
        assert status("modelsec.v1.AttestationService") == SERVING
        assert _http(metrics, "/readyz") == (200, "ok\n")
