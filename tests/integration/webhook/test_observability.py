"""What an operator of `modelsec webhook serve` sees: /metrics parsed as Prometheus text, JSON log lines.

A child process: the logging configuration of the `webhook serve` process itself is under test.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from prometheus_client.parser import text_string_to_metric_families

from modelsec import __version__
from tests.integration.test_webhook_https import ADM01, CA

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(port: int, context: ssl.SSLContext, method: str, path: str, body: bytes | None = None) -> bytes:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, data
        return data
    finally:
        conn.close()


@pytest.mark.slow
def test_webhook_metrics_and_json_logs(tmp_path: Path) -> None:
    ca = CA.create()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    (tmp_path / "store").mkdir()
    port = _free_port()
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"
    # The corpus policy names its trusted key relative to its own directory.
    process = subprocess.Popen(
        [
            exe,
            "webhook",
            "serve",
            "--policy",
            str(ADM01 / "policy.json"),
            "--store",
            str(tmp_path / "store"),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    context = ssl.create_default_context(cadata=ca.cert.public_bytes(serialization.Encoding.PEM).decode())
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _request(port, context, "GET", "/healthz")
                break
            except (OSError, ssl.SSLError):
                assert process.poll() is None and time.monotonic() < deadline, "webhook did not start"
                time.sleep(0.1)
        body = json.loads((ADM01 / "requests" / "unmatched_registry.json").read_text())
        # Matched by the corpus policy; its registry cannot be reached here, so it is denied (fail closed).
        body["request"]["uid"] = "uid-matched"
        body["request"]["object"]["metadata"]["annotations"]["modelsec.dev/models"] = (
            f"oci://registry.internal/models/x@sha256:{'ab' * 32}"
        )
        answer = json.loads(_request(port, context, "POST", "/validate", json.dumps(body).encode()))
        assert answer["response"]["allowed"] is False, answer
        _request(
            port, context, "POST", "/validate", (ADM01 / "requests" / "unmatched_registry.json").read_bytes()
        )
        text = _request(port, context, "GET", "/metrics").decode()
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)

    samples = {
        f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)
    }
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert name in samples, sorted(samples)
    ((_, build, value),) = samples["modelsec_build_info"]
    assert (build["version"], build["component"], value) == (__version__, "webhook", 1.0)
    counts = {
        (labels["outcome"], labels["reason"]): (labels["policy"], v)
        for name, labels, v in samples["modelsec_webhook_decision_seconds"]
        if name.endswith("_count")
    }
    assert counts["deny", "no-policy"] == ("-", 1.0)

    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert lines
    for line in lines:
        assert datetime.fromisoformat(line["time"]).tzinfo is not None, line
    decisions = {x["uid"]: x for x in lines if x.get("event") == "admission-decision"}
    matched = decisions["uid-matched"]
    assert matched["logger"] == "modelsec.webhook.audit"
    # The histogram names the policy that decided and the reason, as the audit line does.
    policy = json.loads((ADM01 / "policy.json").read_text())["policies"][0]["name"]
    assert matched["references"][0]["policy"] == policy
    assert counts["deny", matched["reason"]] == (policy, 1.0)
