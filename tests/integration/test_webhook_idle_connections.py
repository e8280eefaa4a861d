"""Idle and slow clients cannot take the API server's place at the webhook (issue 27, item 4).

Before, uvicorn armed no timer before a connection's first request and counted idle connections against its
limit of 128: 128 idle TLS connections made every review a 503, and with `failurePolicy: Fail` every workload
was denied. Now a request's headers are due within `ConnectionLimits.header_timeout` of the accept (the TLS
handshake included), and each client keeps at most `max_idle_per_client` idle connections (the server
`max_idle`): the oldest beyond are closed. Real TLS sockets to the real server on loopback; the idle clients
connect from other loopback addresses (127.0.0.2, ...) than the reviews (127.0.0.1), as the API server is
another host than an attacker.
"""

from __future__ import annotations

import json
import resource
import select
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")


from modelsec.policy import PolicySet
from modelsec.webhook.review import DirectoryStore, Reviewer, WebhookConfig
from modelsec.webhook.server import ConnectionLimits
from tests.integration.test_webhook_https import ADM01, CA, running
from tests.support.stores import signed_model_store

pytestmark = pytest.mark.integration

IDLE_CONNECTIONS = 1000
IDLE_CLIENTS = 10  # source addresses 127.0.0.2 ... 127.0.0.11
APISERVER_TIMEOUT = 10.0  # the API server's default webhook timeoutSeconds


@dataclass
class Setup:
    reviewer: Reviewer
    cert: Path
    key: Path
    client_context: ssl.SSLContext
    digest: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("webhook-idle")
    ca = CA.create()
    cert, key = root / "tls.crt", root / "tls.key"
    ca.issue(cert, key)
    digest, store = signed_model_store(root, ADM01 / "trust" / "trusted-p256.TESTONLY.key.pem")
    reviewer = Reviewer(
        PolicySet.from_file(ADM01 / "policy.json"), DirectoryStore(store), WebhookConfig(deadline_seconds=8)
    )
    return Setup(reviewer, cert, key, ca.client_context(), digest)


@pytest.fixture(autouse=True)
def _enough_file_descriptors() -> Iterator[None]:
    """Both ends of every connection live in this process: 2,000 descriptors and more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * IDLE_CONNECTIONS + 1024
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _review_body(models: str, uid: str) -> bytes:
    body = json.loads((ADM01 / "requests" / "unmatched_registry.json").read_text())
    body["request"]["uid"] = uid
    body["request"]["object"]["metadata"]["annotations"]["modelsec.dev/models"] = models
    return json.dumps(body).encode()


def _review(port: int, context: ssl.SSLContext, body: bytes) -> tuple[int, dict[str, Any], float]:
    """One review as the API server sends it, from 127.0.0.1: (HTTP status, JSON reply, seconds taken)."""
    import http.client

    started = time.monotonic()
    conn = http.client.HTTPSConnection(
        "127.0.0.1", port, context=context, timeout=APISERVER_TIMEOUT, source_address=("127.0.0.1", 0)
    )
    try:
        conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    reply = json.loads(data) if response.status == 200 else {"raw": data.decode(errors="replace")}
    return response.status, reply, time.monotonic() - started


def _idle_tls(port: int, context: ssl.SSLContext, source: str) -> ssl.SSLSocket:
    """A TLS connection that completes its handshake and then sends nothing."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset), without waiting."""
    poller = select.poll()  # not select(): descriptors here go past FD_SETSIZE
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    if not poller.poll(0):
        return False
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (ssl.SSLWantReadError, BlockingIOError):
        return False  # only TLS 1.3 session tickets were waiting
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def _closed_after(sock: socket.socket, opened: float, limit: float) -> float | None:
    """Seconds from `opened` until the server closed `sock`, or None if still open after `limit` seconds."""
    while time.monotonic() - opened < limit:
        if _closed(sock):
            return time.monotonic() - opened
        time.sleep(0.02)
    return None


@pytest.mark.slow
def test_reviews_are_answered_while_1000_idle_tls_connections_are_open(setup: Setup) -> None:
    limits = ConnectionLimits()  # what `modelsec webhook serve` runs with
    signed = _review_body(f"oci://registry.internal/models/x@sha256:{setup.digest}", "uid-signed")
    unsigned = _review_body("oci://registry.internal/models/x@sha256:" + "0" * 64, "uid-unsigned")
    with running(setup.reviewer, setup.cert, setup.key) as (port, _):
        sockets: dict[str, list[ssl.SSLSocket]] = {}
        try:
            for i in range(IDLE_CONNECTIONS):
                source = f"127.0.0.{2 + i % IDLE_CLIENTS}"
                sockets.setdefault(source, []).append(_idle_tls(port, setup.client_context, source))

            status, out, seconds = _review(port, setup.client_context, signed)
            assert status == 200, out
            assert out["response"]["uid"] == "uid-signed" and out["response"]["allowed"] is True
            assert seconds < APISERVER_TIMEOUT / 4
            status, out, seconds = _review(port, setup.client_context, unsigned)
            assert status == 200, out
            assert out["response"]["uid"] == "uid-unsigned" and out["response"]["allowed"] is False
            assert seconds < APISERVER_TIMEOUT / 4
            print(f"with {IDLE_CONNECTIONS} idle TLS connections open, a review took {seconds:.3f} s")

            # The idle connections beyond each client's cap (and beyond the server's) were closed.
            time.sleep(0.5)
            still_open = {source: [s for s in socks if not _closed(s)] for source, socks in sockets.items()}
            assert all(len(socks) <= limits.max_idle_per_client for socks in still_open.values())
            assert sum(len(socks) for socks in still_open.values()) <= limits.max_idle
        finally:
            for socks in sockets.values():
                for s in socks:
                    s.close()


def test_a_clients_oldest_idle_connections_beyond_its_cap_are_closed(setup: Setup) -> None:
    # A header deadline far away, so that only the per-client cap closes anything here.
    limits = ConnectionLimits(header_timeout=60, max_idle_per_client=8)
    extra = 5
    with running(setup.reviewer, setup.cert, setup.key, limits=limits) as (port, _):
        flood = [
            _idle_tls(port, setup.client_context, "127.0.0.2") for _ in range(limits.max_idle_per_client)
        ]
        other = [
            _idle_tls(port, setup.client_context, "127.0.0.3") for _ in range(limits.max_idle_per_client)
        ]
        try:
            time.sleep(0.3)
            assert not any(_closed(s) for s in flood + other)  # at the cap: nothing closed
            flood += [_idle_tls(port, setup.client_context, "127.0.0.2") for _ in range(extra)]
            time.sleep(0.3)
            assert [_closed(s) for s in flood] == [True] * extra + [False] * limits.max_idle_per_client
            assert not any(_closed(s) for s in other)  # another client keeps its own
            status, out, _ = _review(
                port, setup.client_context, _review_body("oci://elsewhere/x@sha256:" + "0" * 64, "u")
            )
            assert status == 200 and out["response"]["allowed"] is False
        finally:
            for s in flood + other:
                s.close()


@pytest.mark.slow
def test_headers_not_complete_within_the_header_timeout_close_the_connection(setup: Setup) -> None:
    limits = ConnectionLimits(header_timeout=1.0)
    margin = 1.5
    with running(setup.reviewer, setup.cert, setup.key, limits=limits) as (port, _):
        # No TLS handshake at all: the deadline runs from the accept.
        opened = time.monotonic()
        silent = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
        # A handshake, then headers a byte at a time (slowloris).
        trickle = _idle_tls(port, setup.client_context, "127.0.0.3")
        trickle.sendall(b"POST /validate HTTP/1.1\r\nHost: webhook\r\n")
        trickled: float | None = None
        while time.monotonic() - opened < limits.header_timeout + margin:
            try:
                trickle.sendall(b"X")
            except OSError:
                trickled = time.monotonic() - opened
                break
            if _closed(trickle):
                trickled = time.monotonic() - opened
                break
            time.sleep(0.1)
        silent_closed = _closed_after(silent, opened, limits.header_timeout + margin)
        try:
            assert trickled is not None, "a connection trickling its headers stayed open"
            assert limits.header_timeout * 0.9 <= trickled < limits.header_timeout + margin
            assert silent_closed is not None, "a connection without a TLS handshake stayed open"
            assert silent_closed < limits.header_timeout + margin

            # After a response, the next request's headers are due within the same time.
            import http.client

            conn = http.client.HTTPSConnection("127.0.0.1", port, context=setup.client_context, timeout=10)
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b"ok\n"
            answered = time.monotonic()
            assert conn.sock is not None
            conn.sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the rest
            kept = _closed_after(conn.sock, answered, limits.header_timeout + margin)
            assert kept is not None and kept < limits.header_timeout + margin
            conn.close()
        finally:
            silent.close()
            trickle.close()
