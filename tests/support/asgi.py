"""One HTTP request through an ASGI application, as uvicorn hands it over (no socket, no TLS)."""

from __future__ import annotations

from typing import Any


async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    """POST `body` to `path` of `app` over HTTPS as seen by the application; its status and response body."""
    received = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return received.pop(0) if received else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"modelsec-webhook")],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8443),
    }  # fmt: skip
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
