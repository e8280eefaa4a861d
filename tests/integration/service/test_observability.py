"""What an operator of `modelsec serve` sees: /metrics as Prometheus text, JSON log lines, audit records.

A child process: the logging configuration of the `serve` process itself is under test.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelsec import __version__
from modelsec.attestations.predicates.oms import OMS_PREDICATE_TYPE
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.integration.service.test_grpc_service import _statement
from tests.support.service import spawn_cli_server, write_server_config

pytestmark = pytest.mark.integration


def _samples(port: int) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return out


@pytest.mark.slow
def test_serve_metrics_logs_and_signing_audit(tmp_path: Path, key_dir: Path) -> None:
    signed = write_tiny_model(tmp_path / "models" / "signed")
    sign_model(signed, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    unsigned = write_tiny_model(tmp_path / "models" / "unsigned", seed=3)
    config = write_server_config(
        tmp_path / "srv", key_dir, metricsListen="127.0.0.1:0", readRoots=[str(tmp_path / "models")]
    )
    server = spawn_cli_server(config)
    try:
        assert server.metrics_port is not None
        with ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=30)) as client:
            verified = client.verify_model(str(signed))
            assert verified.ok
            refused = client.verify_model(str(unsigned))
            assert not refused.ok
            response = client.sign_statement("ci-p256/1", _statement(signed))
        samples = _samples(server.metrics_port)
    finally:
        code, err = server.terminate()
    assert code == 0, err[-3000:]

    # Process and build-info series.
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert name in samples, sorted(samples)
    ((_, build, value),) = samples["modelsec_build_info"]
    assert (build["version"], build["component"], value) == (__version__, "serve", 1.0)
    # The verdicts by policy and reason, with their time.
    counts = {
        (labels["method"], labels["outcome"], labels["reason"]): (labels["policy"], v)
        for name, labels, v in samples["modelsec_grpc_decision_duration_seconds"]
        if name.endswith("_count")
    }
    policy, n = counts["VerifyModel", "allow", "verified"]
    assert policy and policy != "-" and n == 1.0
    ((method, outcome, reason),) = [k for k in counts if k[1] == "deny"]
    assert (method, outcome, reason) == ("VerifyModel", "deny", refused.error_kind)

    # Every stderr line is one JSON object with an RFC 3339 timestamp.
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert lines
    for line in lines:
        assert datetime.fromisoformat(line["time"]).tzinfo is not None, line
        assert line["level"] and line["logger"], line
    rpcs = [x for x in lines if x.get("event") == "rpc"]
    assert {x["method"].rsplit("/", 1)[-1] for x in rpcs} >= {"VerifyModel", "SignStatement"}
    # The signing audit record: caller, key, subject digest, predicate type, time.
    (audit,) = [x for x in lines if x.get("event") == "signature"]
    assert audit["logger"] == "modelsec.service.audit" and audit["method"] == "SignStatement"
    assert audit["caller"] == next(x["identity"] for x in rpcs if x["method"].endswith("SignStatement"))
    assert (audit["keyVersion"], audit["keyid"]) == ("ci-p256/1", response.key.keyid)
    assert audit["predicateType"] == OMS_PREDICATE_TYPE
    assert [s["digest"]["sha256"] for s in audit["subjects"]] == [verified.root_digest]
    datetime.fromisoformat(audit["time"])
