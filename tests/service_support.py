"""Shared helpers for the gRPC service tests: a throwaway CA, configuration files, real servers.

Servers are real: `InThreadServer` runs `modelsec.service.server.start_server` on its own event loop in a
thread, bound to a loopback port; `spawn_cli_server` runs `modelsec serve` as a child process (for
SIGTERM and restart tests) and reads the bound port from its first stdout line.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
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

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modelsec.service.config import load_server_config
from modelsec.service.server import RunningServer, start_server


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class TestCA:
    """A throwaway certificate authority (P-256), valid for one hour."""

    __test__ = False  # not a pytest test class

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path

    @classmethod
    def create(cls, directory: Path, name: str = "modelsec-test-ca") -> TestCA:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(key, hashes.SHA256())
        )
        path = directory / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(key, cert, path)

    def issue(
        self,
        directory: Path,
        stem: str,
        *,
        cn: str,
        dns: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        """Issue a leaf certificate; returns (cert path, key path)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.UniformResourceIdentifier(u) for u in uris]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        return cert_path, key_path

    def issue_server(self, directory: Path, stem: str = "server") -> tuple[Path, Path]:
        """A serving certificate for `localhost` and 127.0.0.1."""
        return self.issue(
            directory, stem, cn="localhost", dns=("localhost",), ips=("127.0.0.1",), server=True
        )


def write_policy(directory: Path, key_dir: Path, *, match: str = "file:///**", extra: str = "") -> Path:
    """A ModelPolicy trusting the P-256 and SM2 test keys for every role (plus `extra` YAML lines)."""
    path = directory / "policy.yaml"
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: default\n    match: [{json.dumps(match)}]\n"
        f"    keys: [{json.dumps(str(key_dir / 'ecdsa-p256.pub.pem'))}, "
        f"{json.dumps(str(key_dir / 'sm2.pub.pem'))}]\n" + extra
    )
    return path


def write_server_config(directory: Path, key_dir: Path, **fields: Any) -> Path:
    """A ServerConfig (JSON is YAML) with the test keys as `ci-p256/1` and `ci-sm2/1`, open to `*`.

    Defaults: listen 127.0.0.1:0, anonymous plaintext, data dir `<directory>/data`, read roots `[/]`;
    `fields` override or add top-level fields (camelCase, as in the file).
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
    path = directory / "server.yaml"
    path.write_text(json.dumps(doc, indent=2))
    return path


class InThreadServer:
    """A real server on a loopback port, on its own event loop in a daemon thread."""

    def __init__(self, config_path: Path) -> None:
        self.config = load_server_config(config_path)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.running: RunningServer = self._run(start_server(self.config))
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
