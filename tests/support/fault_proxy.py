"""A TLS proxy on loopback in front of the test registry that fails the requests a test chooses.

Real sockets on both sides: the client speaks HTTPS/1.1 with keep-alive to the proxy (its certificate is the
session `tls` fixture's `server`, for 127.0.0.1), and each request it lets through is sent on to the registry
over HTTPS (the registry's own CA). The `Host` header is passed through, so the upload `Location`s the
registry returns point at the proxy. Bodies are whole in memory: for test-sized blobs only.

A fault is `(method, path pattern, action, times)`: the first `times` requests that match get `action`:
`"503"` (an answer `503 Service Unavailable`), `"drop"` (the request is read, then the connection closed
without an answer), `"cut"` (forwarded, then the connection is closed half-way through the answer's body) or
`"no-range"` (forwarded without its `Range` header, as a registry that ignores ranges answers: 200, whole).
Every request is logged in `seen` with what happened to it.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["FaultProxy", "Seen", "fault_proxy"]

_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "proxy-connection",
    "te",
    "upgrade",
}


@dataclass(frozen=True)
class Seen:
    """One request the proxy received: method, path (with query), request headers, body size, outcome."""

    method: str
    path: str
    headers: dict[str, str]
    body_bytes: int
    outcome: str  # "forwarded", "503", "drop", "cut", "no-range"


@dataclass
class FaultProxy:
    """The running proxy: its `host:port`, the faults still to apply, and the log of requests."""

    address: str
    upstream: tuple[str, int]
    upstream_ca: Path
    delay: float = 0.0  # seconds each blob-upload or blob-download request is held, so transfers overlap
    faults: list[list[object]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, method: str, pattern: str, action: str, times: int = 1) -> None:
        """The next `times` `method` requests whose path matches `pattern` (a regex) get `action`."""
        with self.lock:
            self.faults.append([method, re.compile(pattern), action, times])

    def reset(self) -> None:
        """Forget the log, the faults and the peak."""
        with self.lock:
            self.faults.clear()
            self.seen.clear()
            self.peak = 0

    def _take(self, method: str, path: str) -> str | None:
        with self.lock:
            for fault in self.faults:
                if fault[0] == method and fault[1].search(path) and int(fault[3]) > 0:  # type: ignore[union-attr,call-overload]
                    fault[3] = int(fault[3]) - 1  # type: ignore[call-overload]
                    return str(fault[2])
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _any(self) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        action = proxy._take(self.command, self.path)
        headers = {k: v for k, v in self.headers.items()}
        proxy.seen.append(Seen(self.command, self.path, headers, len(body), action or "forwarded"))
        if action == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "503":
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with proxy.lock:
            proxy.in_flight += 1
            proxy.peak = max(proxy.peak, proxy.in_flight)
        try:
            if proxy.delay and "/blobs/" in self.path and self.command in ("GET", "PATCH", "PUT"):
                time.sleep(proxy.delay)
            status, reason, answer_headers, data = self._forward(body, drop_range=action == "no-range")
        finally:
            with proxy.lock:
                proxy.in_flight -= 1
        self.send_response_only(status, reason)
        for name, value in answer_headers:
            if name.lower() not in _HOP or (self.command == "HEAD" and name.lower() == "content-length"):
                self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if action == "cut":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def _forward(
        self, body: bytes, *, drop_range: bool = False
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        proxy = self.server.proxy
        context = ssl.create_default_context(cafile=str(proxy.upstream_ca))
        upstream = http.client.HTTPSConnection(*proxy.upstream, context=context, timeout=30)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP and not (drop_range and name.lower() == "range"):
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy


@contextlib.contextmanager
def fault_proxy(upstream: str, upstream_ca: Path, cert: Path, key: Path) -> Iterator[FaultProxy]:
    """Serve a `FaultProxy` for the registry at `upstream` (`host:port`) on a free loopback port."""
    server = _Server(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    host, port = upstream.rsplit(":", 1)
    server.proxy = FaultProxy(f"127.0.0.1:{server.server_address[1]}", (host, int(port)), upstream_ca)
    thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
    thread.start()
    try:
        yield server.proxy
    finally:
        server.shutdown()
        server.server_close()
