"""Slow-body connections (headers sent, then the body trickled a byte at a time) are dropped in time.

uvicorn has no body read timeout: before, each such connection stayed open as long as its client kept
trickling, holding a request task and its buffer. The webhook now reads a body within its deadline
(answering 408 and closing the connection otherwise), and the server caps connections
(`limit_concurrency`), header size and idle keep-alive. The server runs in a child process whose peak RSS
(VmHWM) is measured while the slow connections are open.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from tests.conftest import CORPUS
from tests.integration.test_webhook_https import CA

pytestmark = pytest.mark.integration

SLOW_CONNECTIONS = 100
DEADLINE = 2.0
# The webhook process idles at ~100 MiB (Python, cryptography, starlette); 100 open requests cost little
# more. Unbounded buffering or a thread per connection would show here.
MAX_PEAK_GROWTH_KIB = 64 * 1024

_SERVER = r"""
import socket, sys
from pathlib import Path
from modelsec.policy import PolicySet
from modelsec.webhook.review import DirectoryStore, Reviewer, WebhookConfig
from modelsec.webhook.server import build_server
cert, key, policy, store = sys.argv[1:5]
reviewer = Reviewer(PolicySet.from_file(Path(policy)), DirectoryStore(Path(store)),
                    WebhookConfig(deadline_seconds=float(sys.argv[5])))
server, _ = build_server(reviewer, Path(cert), Path(key), reload_interval=3600)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
server.run(sockets=[sock])
"""


def _vm_hwm_kib(pid: int) -> int:
    match = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert match
    return int(match.group(1))


def _slow_client(port: int, context: ssl.SSLContext, result: dict[str, object], stop: float) -> None:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    sock.sendall(
        b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000\r\n\r\n{"
    )
    opened = time.monotonic()
    sock.settimeout(0.2)
    received = b""
    try:
        while time.monotonic() < stop:
            try:
                sock.sendall(b" ")  # one byte of the body at a time
            except OSError:
                break
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                break
            if not data:
                break
            received += data
        else:
            result["open_at_stop"] = True
    finally:
        result["seconds"] = time.monotonic() - opened
        result["response"] = received
        sock.close()


@pytest.mark.slow
def test_slow_bodies_are_dropped_within_the_deadline_and_memory_stays_bounded(tmp_path: Path) -> None:
    ca = CA.create()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    policy = CORPUS / "ADM01-no-policy-match-default-deny" / "policy.json"
    (tmp_path / "store").mkdir()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SERVER,
            str(cert),
            str(key),
            str(policy),
            str(tmp_path / "store"),
            str(DEADLINE),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "MODELSEC_GUARD": "0"},
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        context = ca.client_context()
        for _ in range(100):  # wait until it answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        _healthz(port, context)
        idle_kib = _vm_hwm_kib(server.pid)

        stop = time.monotonic() + DEADLINE + 10
        results: list[dict[str, object]] = [{} for _ in range(SLOW_CONNECTIONS)]
        threads = [
            threading.Thread(target=_slow_client, args=(port, context, r, stop), daemon=True) for r in results
        ]
        for t in threads:
            t.start()
        time.sleep(DEADLINE / 2)
        during_kib = _vm_hwm_kib(server.pid)
        for t in threads:
            t.join(timeout=DEADLINE + 15)
        peak_kib = _vm_hwm_kib(server.pid)
        slowest = max(float(str(r["seconds"])) for r in results)
        print(
            f"webhook VmHWM: idle {idle_kib} KiB, with {SLOW_CONNECTIONS} slow bodies open {during_kib} KiB, "
            f"peak {peak_kib} KiB; dropped after {slowest:.2f} s at most"
        )
        assert not any(r.get("open_at_stop") for r in results), "a slow connection was never dropped"
        assert all(float(str(r["seconds"])) < DEADLINE + 3 for r in results)
        assert all(b"408" in bytes(r["response"]) for r in results)  # type: ignore[arg-type]
        assert peak_kib - idle_kib < MAX_PEAK_GROWTH_KIB
        _healthz(port, context)  # and the server still serves
    finally:
        server.terminate()
        server.wait(timeout=15)


def _healthz(port: int, context: ssl.SSLContext) -> None:
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
