"""`modelsec serve --workers 2`: two processes answer on one port and `/metrics` sums them."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from modelsec.v1 import signing_pb2, signing_pb2_grpc
from tests.support.service import spawn_cli_server, write_server_config

pytestmark = pytest.mark.integration

CALLS = 24
_METHOD = 'modelsec_grpc_requests_total{code="OK",method="/modelsec.v1.SigningService/ListKeys"}'


def _list_keys_on_a_new_connection(target: str) -> None:
    # A local subchannel pool: each channel opens its own TCP connection, which the kernel assigns to one
    # of the SO_REUSEPORT listeners by its address hash.
    with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        signing_pb2_grpc.SigningServiceStub(channel).ListKeys(signing_pb2.ListKeysRequest(), timeout=20)


def _scrape(port: int, path: str = "/metrics") -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()


@pytest.mark.slow
def test_two_workers_share_the_port_and_the_metrics(tmp_path: Path, key_dir: Path) -> None:
    # Its own server, a child process with two workers (multiprocess metrics).
    config = write_server_config(tmp_path / "srv", key_dir, metricsListen="127.0.0.1:0")
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    server = spawn_cli_server(
        config, env={"MODELSEC_SERVE_WORKERS": "2", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    )
    try:
        assert server.metrics_port is not None
        for _ in range(CALLS):
            _list_keys_on_a_new_connection(server.target)
        # prometheus-client's multiprocess mode writes one file per process: both workers counted calls.
        writers = {
            m.group(1) for p in metrics_dir.iterdir() if (m := re.fullmatch(r"counter_(\d+)\.db", p.name))
        }
        assert len(writers) == 2, sorted(p.name for p in metrics_dir.iterdir())
        assert server.process.pid not in {int(w) for w in writers}  # the supervisor serves, never counts
        deadline = time.monotonic() + 5  # a call is counted just after the client has its answer
        while (
            f"{_METHOD} {CALLS}.0" not in (text := _scrape(server.metrics_port))
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert f"{_METHOD} {CALLS}.0" in text, text[-3000:]
        assert _scrape(server.metrics_port, "/healthz") == "ok\n"
    finally:
        code, err = server.terminate()
    assert code == 0, err[-3000:]
    with pytest.raises(grpc.RpcError):
        _list_keys_on_a_new_connection(server.target)


@pytest.mark.slow
def test_a_worker_that_dies_stops_the_service(tmp_path: Path, key_dir: Path) -> None:
    # Its own server, a child process with two workers, one of which the test kills.
    config = write_server_config(tmp_path / "srv", key_dir)
    server = spawn_cli_server(config, env={"MODELSEC_SERVE_WORKERS": "2"})
    try:
        children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
        workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2
        os.kill(workers[-1], signal.SIGKILL)
        server.process.wait(timeout=60)
    finally:
        code, err = server.terminate()
    assert code == 1
    assert re.search(r"serve worker modelsec-serve-\d exited with code -9", err), err[-3000:]
