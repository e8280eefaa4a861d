"""ML-DSA through the gRPC service: a server-held ML-DSA key signs, VerifyModel reports a hybrid model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.policy import Policy
from modelsec.service.client import ChannelOptions, ModelsecClient, RemoteSigner
from modelsec.signer import load_private_key_file, sign_model
from modelsec.v1 import common_pb2
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration


def _hybrid_policy(directory: Path, key_dir: Path) -> Path:
    path = directory / "policy.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "apiVersion": "modelsec.dev/v1alpha1",
                "kind": "ModelPolicy",
                "policies": [
                    {
                        "name": "pq-hybrid",
                        "match": ["file:///**"],
                        "keys": [str(key_dir / "ecdsa-p256.pub.pem"), str(key_dir / "ml-dsa-65.pub.pem")],
                        "requireAlgorithms": ["ecdsa-p256", "ml-dsa-65"],
                    }
                ],
            }
        )
    )
    return path


def test_server_held_ml_dsa_key_signs_and_verify_model_reports_the_hybrid(
    tmp_path: Path, key_dir: Path
) -> None:
    model = write_tiny_model(tmp_path / "model", shards=1)
    # Its own server: an ML-DSA key and a hybrid policy.
    config = write_server_config(
        tmp_path / "server",
        key_dir,
        policy=_hybrid_policy(tmp_path / "server", key_dir),
        keys=[{"name": "ci-mldsa", "path": str(key_dir / "ml-dsa-65.key.pem"), "allow": ["*"]}],
        readRoots=[str(tmp_path)],
    )
    with InThreadServer(config) as server, ModelsecClient(server.target, ChannelOptions(plaintext=True)) as c:
        (key,) = c.list_keys()
        assert key.name == "ci-mldsa/1" and key.algorithm == common_pb2.SIGNATURE_ALGORITHM_ML_DSA_65
        assert c.get_public_key("ci-mldsa/1").key.algorithm == common_pb2.SIGNATURE_ALGORITHM_ML_DSA_65
        remote = RemoteSigner(
            c, "ci-mldsa/1", expected_public_key_pem=(key_dir / "ml-dsa-65.pub.pem").read_bytes()
        )
        assert remote.algorithm is SignatureAlgorithm.ML_DSA_65
        # ECDSA signed here, ML-DSA by the server's key: the hybrid policy needs both.
        signed = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem"), remote])
        hybrid = Policy.from_key_files(
            [key_dir / "ecdsa-p256.pub.pem", key_dir / "ml-dsa-65.pub.pem"],
            require=(SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.ML_DSA_65),
        )
        assert verify_model(model, hybrid).root_digest == signed.root_digest  # verifies locally too

        answer = c.verify_model(str(model))
        assert answer.ok, answer.error
        assert answer.policy == "pq-hybrid" and answer.root_digest == signed.root_digest
        assert sorted(answer.algorithms) == [
            common_pb2.SIGNATURE_ALGORITHM_ECDSA_P256,
            common_pb2.SIGNATURE_ALGORITHM_ML_DSA_65,
        ]
        # The store records the ML-DSA bundle with its algorithm (the record's enum value, not a crash).
        stored = c.put_attestation((model / "model.ml-dsa-65.sig").read_bytes()).attestation
        assert stored.algorithm == common_pb2.SIGNATURE_ALGORITHM_ML_DSA_65
        assert [r.algorithm for r in c.list_attestations(root_digest=signed.root_digest)] == [
            stored.algorithm
        ]
        # Without the ML-DSA bundle the hybrid requirement refuses the model (a verdict, not a crash).
        (model / "model.ml-dsa-65.sig").unlink()
        refused = c.verify_model(str(model))
        assert not refused.ok and "ml-dsa-65" in refused.error


def test_every_signature_algorithm_has_a_wire_value() -> None:
    from modelsec.service.convert import algorithm_from_proto, algorithm_to_proto

    values = [algorithm_to_proto(a) for a in SignatureAlgorithm]
    assert len(set(values)) == len(values) and common_pb2.SIGNATURE_ALGORITHM_UNSPECIFIED not in values
    assert [algorithm_from_proto(v) for v in values] == list(SignatureAlgorithm)
    # Appended, never renumbered: clients built against the first version keep their meaning.
    assert (common_pb2.SIGNATURE_ALGORITHM_ECDSA_P256, common_pb2.SIGNATURE_ALGORITHM_SM2) == (1, 3)
