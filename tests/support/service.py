"""Shared helpers for the gRPC service tests: configuration files and real servers.

Servers are real: `InThreadServer` runs `modelsec.service.server.start_server` on its own event loop in a
thread, bound to a loopback port; `spawn_cli_server` runs `modelsec serve` as a child process (for
SIGTERM and restart tests) and reads the bound port from its first stdout line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelsec.service.config import load_server_config
from modelsec.service.server import RunningServer, start_server
from tests.support.policies import write_policy


def write_server_config(directory: Path, key_dir: Path, **fields: Any) -> Path:
    """A ServerConfig (JSON is YAML) with the test keys as `ci-p256/1` and `ci-sm2/1`, open to `*`.

    Defaults: listen 127.0.0.1:0, anonymous plaintext, data dir `<directory>/data`, read roots `[/]`;
    `fields` override or add top-level fields (camelCase, as in the file); a field given as None is left out.
    """
    directory.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ServerConfig",
        "listen": "127.0.0.1:0",
        "dataDir": str(directory / "data"),
        "policy": str(fields.pop("policy", None) or write_policy(directory, key_dir)),
        "allowAnonymous": True,
        "keys": [
            {"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem"), "allow": ["*"]},
            {"name": "ci-sm2", "path": str(key_dir / "sm2.key.pem"), "allow": ["*"]},
        ],
        "access": {"putAttestation": ["*"], "verifyModel": ["*"], "watermark": ["*"], "robustness": ["*"]},
        "readRoots": ["/"],
        "writeRoots": ["/"],
    }
    if ("tls" in fields or "tokens" in fields) and "allowAnonymous" not in fields:
        del doc["allowAnonymous"]  # real authentication configured: no anonymous fallback
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not None}
    path = directory / "server.yaml"
    path.write_text(json.dumps(doc, indent=2))
    return path


class InThreadServer:
    """A real server on a loopback port, on its own event loop in a daemon thread."""

    def __init__(self, config_path: Path, **start: Any) -> None:
        """Start it; `start` are further keyword arguments of `start_server` (`readiness_interval`)."""
        self.config = load_server_config(config_path)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.running: RunningServer = self._run(start_server(self.config, **start))
        self.port = self.running.port
        self.target = f"127.0.0.1:{self.port}"

    def _run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=60)

    def stop(self, grace: float = 0.0) -> None:
        self._run(self.running.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> InThreadServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ChildServer:
    """`modelsec serve` in a child process."""

    process: subprocess.Popen[str]
    port: int
    metrics_port: int | None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM, wait; returns (exit code, stderr)."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            _, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        return self.process.returncode, err


def spawn_cli_server(
    config_path: Path, env: Mapping[str, str] | None = None, timeout: float = 60
) -> ChildServer:
    """Start `modelsec serve --config ...` and wait for its `serving modelsec.v1 on HOST:PORT` line."""
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"
    process = subprocess.Popen(
        [exe, "serve", "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)  # never hang on a server that hangs
    line = process.stdout.readline() if ready else ""
    if not line:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"modelsec serve did not start within {timeout} s: {err[-2000:]}")
    m = re.search(r"serving modelsec\.v1 on \S+:(\d+)(?: \(metrics on \S+:(\d+)\))?", line)
    assert m, line
    return ChildServer(process, int(m.group(1)), int(m.group(2)) if m.group(2) else None)
