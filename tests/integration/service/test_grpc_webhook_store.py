"""The admission webhook with the gRPC AttestationService as its store (what `--store grpc://` builds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.policy import PolicySet
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.service.grpc_store import GrpcAttestationStore
from modelsec.signer import load_private_key_file, sign_model
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.service_support import InThreadServer, write_server_config
from tests.unit.webhook.test_review import REGISTRY, answer, review_body

pytestmark = pytest.mark.integration


def test_webhook_admits_from_the_grpc_store_and_fails_closed_without_it(
    tmp_path: Path, key_dir: Path
) -> None:
    model = write_tiny_model(tmp_path / "model", shards=1)
    digest = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]).root_digest
    policies = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [{"name": "internal", "match": [f"{REGISTRY}/**"], "keys": ["ecdsa-p256.pub.pem"]}],
        },
        base_dir=key_dir,
        source="test-policy",
    )
    server = InThreadServer(write_server_config(tmp_path / "server", key_dir))
    target = server.target
    client = ModelsecClient(target, ChannelOptions(plaintext=True, timeout=5))
    try:
        store = GrpcAttestationStore(client, f"grpc://{target}")  # what `--store grpc://` opens
        reviewer = Reviewer(policies, store, WebhookConfig(cache_ttl_seconds=0), generation="g")
        body = review_body("Pod", f"{REGISTRY}/tiny@sha256:{digest}")
        assert answer(reviewer, body)["allowed"] is False  # nothing stored yet
        client.put_attestation((model / "model.sig").read_bytes())
        assert answer(reviewer, body)["allowed"] is True
        unsigned = answer(reviewer, review_body("Pod", f"{REGISTRY}/tiny@sha256:{'ab' * 32}"))
        assert unsigned["allowed"] is False
    finally:
        server.stop()
    denied = answer(reviewer, body)  # the store is gone: an outage denies
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    client.close()


def test_webhook_store_spec_is_checked(tmp_path: Path, key_dir: Path) -> None:
    from tests.conftest import run_cli
    from tests.service_support import write_policy

    policy = write_policy(tmp_path, key_dir)
    args = ["webhook", "serve", "--policy", policy, "--tls-cert", tmp_path / "c", "--tls-key", tmp_path / "k"]
    r = run_cli(*args, "--store", "ftp://store:1")
    assert r.returncode == 2 and "use a directory, grpcs://HOST:PORT or grpc://HOST:PORT" in r.stderr, (
        r.stderr
    )
