"""SignStatement refuses gate and watermark statements whose numbers no verifier can use (issue 14).

Old code signed a gate statement with `"eps": 10**400` (and the verifier then crashed on it with
OverflowError, INTERNAL over gRPC) and one with `"eps": 1e300` (accepted as evidence by any minEps).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.attestations.predicates.gate import GATE_PREDICATE_TYPE
from modelsec.attestations.predicates.watermark import WATERMARK_PREDICATE_TYPE
from modelsec.errors import MalformedArtifactError
from modelsec.service.client import ChannelOptions, ModelsecClient
from tests.service_support import InThreadServer, write_server_config
from tests.unit.verifier.test_joint_verification import gate_predicate, watermark_predicate

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[ModelsecClient]:
    d = tmp_path_factory.mktemp("svc-bounded")
    config = write_server_config(
        d / "server",
        key_dir,
        # A key configured to sign client-made statements of every role (gate and watermark included).
        keys=[
            {
                "name": "any",
                "path": str(key_dir / "ecdsa-p256.key.pem"),
                "allow": ["*"],
                "operations": ["signStatement"],
            }
        ],
    )
    with (
        InThreadServer(config) as server,
        ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=20)) as c,
    ):
        yield c


def _statement(ptype: str, predicate: dict[str, object], *, raw_eps: str | None = None) -> bytes:
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "m", "digest": {"sha256": "a" * 64}}],
        "predicateType": ptype,
        "predicate": predicate,
    }
    text = json.dumps(doc)
    return (text.replace('"eps": 0.3', f'"eps": {raw_eps}') if raw_eps else text).encode()


@pytest.mark.parametrize(
    ("statement", "mentions"),
    [
        (_statement(GATE_PREDICATE_TYPE, gate_predicate(), raw_eps="1" + "0" * 400), "64-bit range"),
        (_statement(GATE_PREDICATE_TYPE, gate_predicate(**{"parameters.eps": 1e300})), "parameters.eps"),
        (_statement(GATE_PREDICATE_TYPE, gate_predicate(**{"results.robust.total": -1})), "robust.total"),
        (
            _statement(
                WATERMARK_PREDICATE_TYPE,
                {**watermark_predicate(), "detection": {"detected": True, "confidence": 1e300}},
            ),
            "detection.confidence",
        ),
    ],
)
def test_sign_statement_refuses_out_of_range_numbers(
    client: ModelsecClient, statement: bytes, mentions: str
) -> None:
    with pytest.raises(MalformedArtifactError, match=mentions):
        client.sign_statement("any/1", statement)


def test_sign_statement_signs_a_sane_gate_statement(client: ModelsecClient) -> None:
    response = client.sign_statement("any/1", _statement(GATE_PREDICATE_TYPE, gate_predicate()))
    assert response.bundle
