"""OpenTelemetry spans of the servers' decisions (the `otel` extra, off by default; issue 31).

With `$MODELSEC_OTEL=1`, each verdict of the gRPC service (`modelsec.grpc.decision`) and each admission review
of the webhook (`modelsec.webhook.decision`) is one span with the policy, outcome and reason;
without it, none.
The spans are read with the SDK's in-memory exporter on this process's tracer provider: the gRPC server runs
in a thread here, and the webhook's ASGI application is called in-process with a real AdmissionReview body
(the corpus' ADM01 policy and request).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.integration.test_webhook_https import ADM01
from tests.support.asgi import asgi_post
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spans() -> Iterator[Any]:
    """The in-memory exporter of this process's tracer provider (set once: OpenTelemetry allows one)."""
    pytest.importorskip("opentelemetry.sdk", reason="pip install 'modelsec[otel]' (opentelemetry-sdk)")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter


def _verify_twice(tmp_path: Path, key_dir: Path) -> None:
    """One allowed and one refused VerifyModel on a server of its own (read roots for the two models)."""
    pytest.importorskip("grpc")
    from modelsec.service.client import ChannelOptions, ModelsecClient

    signed = write_tiny_model(tmp_path / "models" / "signed")
    sign_model(signed, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    unsigned = write_tiny_model(tmp_path / "models" / "unsigned", seed=5)
    config = write_server_config(tmp_path / "srv", key_dir, readRoots=[str(tmp_path / "models")])
    with InThreadServer(config) as server:
        with ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=30)) as client:
            assert client.verify_model(str(signed)).ok
            assert not client.verify_model(str(unsigned)).ok


def test_grpc_decisions_are_spans_when_tracing_is_on(
    spans: Any, tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans.clear()
    monkeypatch.setenv("MODELSEC_OTEL", "1")
    _verify_twice(tmp_path, key_dir)
    decisions = [s for s in spans.get_finished_spans() if s.name == "modelsec.grpc.decision"]
    outcomes = sorted((s.attributes["modelsec.method"], s.attributes["modelsec.outcome"]) for s in decisions)
    assert outcomes == [("VerifyModel", "allow"), ("VerifyModel", "deny")]
    for span in decisions:
        assert span.attributes["modelsec.policy"] and span.attributes["modelsec.reason"]
        assert span.end_time >= span.start_time


def test_no_span_without_the_setting(
    spans: Any, tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans.clear()
    monkeypatch.delenv("MODELSEC_OTEL", raising=False)
    _verify_twice(tmp_path, key_dir)
    assert [s.name for s in spans.get_finished_spans() if s.name.startswith("modelsec.")] == []


def test_webhook_reviews_are_spans_when_tracing_is_on(spans: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("starlette")
    from modelsec.policy import PolicySet
    from modelsec.webhook.review import Reviewer, WebhookConfig
    from modelsec.webhook.server import create_app

    spans.clear()
    monkeypatch.setenv("MODELSEC_OTEL", "1")
    app = create_app(Reviewer(PolicySet.from_file(ADM01 / "policy.json"), None, WebhookConfig()))
    body = json.loads((ADM01 / "requests" / "unmatched_registry.json").read_text())
    body["request"]["uid"] = "uid-traced"
    status, answer = asyncio.run(asgi_post(app, "/validate", json.dumps(body).encode()))
    assert status == 200
    allowed = json.loads(answer)["response"]["allowed"]
    (span,) = [s for s in spans.get_finished_spans() if s.name == "modelsec.webhook.decision"]
    assert span.attributes["modelsec.uid"] == "uid-traced"
    assert span.attributes["modelsec.outcome"] == ("allow" if allowed else "deny")
    assert span.attributes["modelsec.reason"]
