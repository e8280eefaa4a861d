"""The gRPC service on a real loopback port: signing, verification, the store, errors, limits, metrics."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.predicates.oms import manifest_statement
from modelsec.attestations.statement import serialize_statement
from modelsec.errors import (
    AuthenticationError,
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    NotFoundError,
    PermissionDeniedError,
    VerificationError,
)
from modelsec.policy import Policy
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.keys import load_trusted_key_file
from modelsec.signer.layout import MODEL_IGNORE_PATHS
from modelsec.signer.signing import compute_manifests
from modelsec.v1 import signing_pb2
from modelsec.verifier import verify_attestations, verify_bundle_signature, verify_model
from tests.conftest import write_tiny_model
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration


def _statement(model: Path, hash_type: HashAlgorithm = HashAlgorithm.SHA256) -> bytes:
    manifests = compute_manifests(model, [hash_type], ignore_paths=list(MODEL_IGNORE_PATHS))
    return serialize_statement(manifest_statement(manifests[hash_type]))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[tuple[InThreadServer, Path]]:
    d = tmp_path_factory.mktemp("svc")
    model = write_tiny_model(d / "model")
    # Its own server: role-restricted and unreachable keys, metrics, read roots limited to the model.
    config = write_server_config(
        d / "server",
        key_dir,
        keys=[
            {"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem"), "allow": ["*"]},
            {"name": "ci-sm2", "path": str(key_dir / "sm2.key.pem"), "allow": ["*"]},
            {
                "name": "gate-only",
                "path": str(key_dir / "ecdsa-p256.key.pem"),
                "roles": ["gate"],
                "allow": ["*"],
            },
            {"name": "nobody", "path": str(key_dir / "ecdsa-p384.key.pem"), "allow": ["someone-else"]},
        ],
        metricsListen="127.0.0.1:0",
        readRoots=[str(d)],
    )
    with InThreadServer(config) as server:
        yield server, model


@pytest.fixture
def client(setup: tuple[InThreadServer, Path]) -> Iterator[ModelsecClient]:
    with ModelsecClient(setup[0].target, ChannelOptions(plaintext=True, timeout=20)) as c:
        yield c


def test_remote_ecdsa_bundle_verifies_like_a_local_one(
    setup: tuple[InThreadServer, Path], client: ModelsecClient, key_dir: Path
) -> None:
    _, model = setup
    statement = _statement(model)
    response = client.sign_statement("ci-p256/1", statement)
    bundle = parse_bundle(response.bundle, source="remote")
    assert bundle.envelope.payload == statement  # the server signed exactly what was asked
    trusted = load_trusted_key_file(key_dir / "ecdsa-p256.pub.pem")
    assert verify_bundle_signature(bundle, [trusted]).keyid == response.key.keyid
    # The same model signed locally with the same key has the same payload; both verify the directory.
    local = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    assert parse_bundle((model / "model.sig").read_bytes(), source="local").envelope.payload == statement
    (model / "model.sig").write_bytes(response.bundle)
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    assert verify_model(model, policy).root_digest == local.root_digest
    with pytest.raises(VerificationError):  # another key does not verify the remote bundle
        verify_bundle_signature(bundle, [load_trusted_key_file(key_dir / "other.pub.pem")])


def test_remote_sm2_signs_the_sm3_manifest(
    setup: tuple[InThreadServer, Path], client: ModelsecClient, key_dir: Path
) -> None:
    statement = _statement(setup[1], HashAlgorithm.SM3)
    response = client.sign_statement("ci-sm2/1", statement)
    assert response.key.algorithm == signing_pb2.KeyVersion().algorithm.__class__(3)  # SM2
    bundle = parse_bundle(response.bundle, source="remote")
    key = verify_bundle_signature(bundle, [load_trusted_key_file(key_dir / "sm2.pub.pem")])
    assert key.algorithm is SignatureAlgorithm.SM2
    with pytest.raises(MalformedArtifactError, match="signs sm3 manifests; this one is sha256"):
        client.sign_statement("ci-sm2/1", _statement(setup[1]))
    with pytest.raises(MalformedArtifactError, match="signs sm3 manifests; this one is blake3"):
        client.sign_statement("ci-sm2/1", _statement(setup[1], HashAlgorithm.BLAKE3))


def test_remote_ecdsa_signs_a_blake3_manifest(
    setup: tuple[InThreadServer, Path], client: ModelsecClient, key_dir: Path
) -> None:
    """`sign --hash-type blake3 --server ...`: the service signs the BLAKE3 manifest an ECDSA key may sign."""
    model = setup[1]
    response = client.sign_statement("ci-p256/1", _statement(model, HashAlgorithm.BLAKE3))
    (model / "model.sig").write_bytes(response.bundle)
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    verify_model(model, policy)


def test_public_keys_and_listing(client: ModelsecClient, key_dir: Path) -> None:
    response = client.get_public_key("ci-p256/1")
    assert response.public_key_pem == (key_dir / "ecdsa-p256.pub.pem").read_bytes()
    names = [k.name for k in client.list_keys()]
    assert names == ["ci-p256/1", "ci-sm2/1", "gate-only/1"]  # `nobody/1` is not this caller's


@pytest.mark.parametrize(
    ("key_version", "statement", "error", "mentions"),
    [
        ("missing/1", None, NotFoundError, "NOT_FOUND.*'missing/1' does not exist"),
        ("k" * 20_000, None, MalformedArtifactError, "key_version is longer than 256 characters"),
        ("nobody/1", None, PermissionDeniedError, "PERMISSION_DENIED.*may not use key version"),
        ("gate-only/1", None, PermissionDeniedError, "may not sign predicateType.*its roles: gate"),
        ("ci-p256/1", b"{}", MalformedArtifactError, "INVALID_ARGUMENT.*_type"),
        ("ci-p256/1", b"\xff", MalformedArtifactError, "INVALID_ARGUMENT"),
        (
            "ci-p256/1",
            b'{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"m","digest":{"sha256":"'
            + b"a" * 64
            + b'"}}],"predicateType":"https://slsa.dev/provenance/v1","predicate":{}}',
            PermissionDeniedError,
            "may not sign predicateType 'https://slsa.dev/provenance/v1'",
        ),
    ],
)
def test_signing_refusals_map_to_status_codes(
    setup: tuple[InThreadServer, Path],
    client: ModelsecClient,
    key_version: str,
    statement: bytes | None,
    error: type[Exception],
    mentions: str,
) -> None:
    with pytest.raises(error, match=mentions):
        client.sign_statement(key_version, statement or _statement(setup[1]))


def test_huge_echoed_values_are_cut(client: ModelsecClient) -> None:
    """A diagnostic quoting a huge client value stays small (HTTP/2 trailers, log lines)."""
    statement = (
        b'{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"m","digest":{"sha256":"'
        + b"a" * 64
        + b'"}}],"predicateType":"https://x/'
        + b"p" * 100_000
        + b'","predicate":{}}'
    )
    with pytest.raises(PermissionDeniedError) as info:
        client.sign_statement("ci-p256/1", statement)
    assert "more characters)" in str(info.value) and len(str(info.value)) < 1200


def test_verify_bundle_verdicts(setup: tuple[InThreadServer, Path], client: ModelsecClient) -> None:
    _, model = setup
    p256 = client.sign_statement("ci-p256/1", _statement(model)).bundle
    sm2 = client.sign_statement("ci-sm2/1", _statement(model, HashAlgorithm.SM3)).bundle
    digest = json.loads(parse_bundle(p256, source="b").envelope.payload)["subject"][0]["digest"]["sha256"]
    response = client.verify_bundle(digest, [p256, sm2], require_signatures=True)
    assert response.verdict.ok and response.policy == "default"
    assert sorted(e.detail for e in response.verdict.evidence) == ["signature: ecdsa-p256", "signature: sm2"]
    # Untrusted and off-subject evidence is a verdict, not an RPC error.
    other = client.verify_bundle("f" * 64, [p256], require_signatures=True)
    assert not other.verdict.ok and "not " + "f" * 64 in " ".join(other.verdict.ignored)
    tampered = bytearray(p256)
    tampered[tampered.index(b'"sig": "') + 10] ^= 1
    bad = client.verify_bundle(digest, [bytes(tampered)], require_signatures=True)
    assert not bad.verdict.ok and bad.verdict.missing
    for wrong, mentions in [("A" * 64, "64 lowercase hex"), ("abc", "64 lowercase hex")]:
        with pytest.raises(MalformedArtifactError, match=mentions):
            client.verify_bundle(wrong, [p256])
    with pytest.raises(MalformedArtifactError, match="bundles is empty"):
        client.verify_bundle(digest, [])
    with pytest.raises(NotFoundError, match="policy 'nope'"):
        client.verify_bundle(digest, [p256], policy="nope")


def test_verify_model_on_server_paths(
    setup: tuple[InThreadServer, Path], client: ModelsecClient, key_dir: Path
) -> None:
    _, model = setup
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], force=True)
    local = verify_model(model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]))
    ok = client.verify_model(str(model))
    assert ok.ok and ok.policy == "default"
    assert (ok.root_digest, ok.files, ok.tensors) == (local.root_digest, local.files, local.tensors)
    shard = next(model.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    try:
        bad = client.verify_model(str(model))
        assert not bad.ok and bad.error_kind == "DigestMismatchError" and shard.name in bad.error
    finally:
        data[-1] ^= 1
        shard.write_bytes(bytes(data))
    with pytest.raises(PermissionDeniedError, match="outside the server's read roots"):
        client.verify_model("/etc")
    with pytest.raises(PermissionDeniedError, match="absolute path"):
        client.verify_model("model")
    with pytest.raises(PermissionDeniedError, match="outside"):
        client.verify_model(str(model / ".." / ".."))


def test_store_put_get_list(
    setup: tuple[InThreadServer, Path], client: ModelsecClient, key_dir: Path
) -> None:
    _, model = setup
    bundle = client.sign_statement("ci-p256/1", _statement(model)).bundle
    digest = json.loads(parse_bundle(bundle, source="b").envelope.payload)["subject"][0]["digest"]["sha256"]
    first = client.put_attestation(bundle)
    assert (
        first.created
        and first.attestation.root_digest == digest
        and first.attestation.stored_by == "anonymous"
    )
    assert not client.put_attestation(bundle).created
    got = client.get_attestations(digest)
    assert [g.bundle for g in got] == [bundle] and got[0].attestation.signer == "ecdsa-p256.pub.pem"
    listed = list(client.list_attestations(root_digest=digest, page_size=1))
    assert [r.id for r in listed] == [first.attestation.id]
    # What the store returns passes the same joint verification a webhook applies.
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    assert verify_attestations(digest, client.bundles(digest), policy).ok
    # A bundle no policy key verifies is not stored.
    other = sign_model(
        model, [load_private_key_file(key_dir / "other.key.pem")], signature_paths={0: model.parent / "x.sig"}
    )
    with pytest.raises(VerificationError, match=r"not stored.*not trusted"):
        client.put_attestation((model.parent / "x.sig").read_bytes())
    assert [g.bundle for g in client.get_attestations(other.root_digest)] == [bundle]
    with pytest.raises(MalformedArtifactError, match="INVALID_ARGUMENT"):
        client.put_attestation(b"not json")


def test_unauthenticated_and_unauthorised_calls(
    tmp_path: Path, key_dir: Path, setup: tuple[InThreadServer, Path]
) -> None:
    import hashlib

    # Its own server: bearer tokens only, and putAttestation for another identity.
    config = write_server_config(
        tmp_path,
        key_dir,
        tokens=[{"identity": "ci", "sha256": hashlib.sha256(b"s3cret").hexdigest()}],
        access={"putAttestation": ["release-bot"]},
    )
    with InThreadServer(config) as server:
        with ModelsecClient(server.target, ChannelOptions(plaintext=True)) as anonymous:
            with pytest.raises(AuthenticationError, match=r"UNAUTHENTICATED.*no credentials"):
                anonymous.list_keys()
        with ModelsecClient(server.target, ChannelOptions(plaintext=True, token="wrong")) as wrong:
            with pytest.raises(AuthenticationError, match="unknown bearer token"):
                wrong.list_keys()
        with ModelsecClient(server.target, ChannelOptions(plaintext=True, token="s3cret")) as ci:
            assert [k.name for k in ci.list_keys()] == ["ci-p256/1", "ci-sm2/1"]
            with pytest.raises(PermissionDeniedError, match="'ci' may not call putAttestation"):
                ci.put_attestation(b"{}")


def test_deadlines_and_message_limits(
    setup: tuple[InThreadServer, Path], client: ModelsecClient, key_dir: Path
) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    big = setup[1].parent / "big-model"
    big.mkdir(exist_ok=True)
    save_file({"w": np.ones((96, 1 << 18), dtype=np.float32)}, str(big / "model.safetensors"))  # 96 MiB
    sign_model(big, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    with pytest.raises(BackendUnavailableError, match="DEADLINE_EXCEEDED"):
        client.verify_model(str(big), timeout=0.02)
    assert client.verify_model(str(big), timeout=60).ok  # the server is fine afterwards
    with pytest.raises(Error, match=r"RESOURCE_EXHAUSTED.*larger than max") as too_big:
        client.sign_statement("ci-p256/1", b" " * (4 * 1024 * 1024 + 1))
    assert not too_big.value.retryable
    with pytest.raises(MalformedArtifactError, match="statement larger than 1048576 bytes"):
        client.sign_statement("ci-p256/1", b" " * (2 * 1024 * 1024))


def test_metrics_count_calls_by_method_and_code(
    setup: tuple[InThreadServer, Path], client: ModelsecClient
) -> None:
    server, _ = setup
    client.list_keys()
    with pytest.raises(NotFoundError):
        client.get_public_key("missing/1")
    port = server.running.metrics_port
    wanted = [
        'modelsec_grpc_requests_total{code="OK",method="/modelsec.v1.SigningService/ListKeys"}',
        'code="NOT_FOUND",method="/modelsec.v1.SigningService/GetPublicKey"',
    ]
    deadline = time.monotonic() + 5  # a call is counted when its handler returns, just after the client
    while True:  # has its answer: scrape until both appear
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        if all(w in text for w in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert all(w in text for w in wanted), text[-3000:]
    assert "modelsec_grpc_request_duration_seconds_bucket" in text
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read() == b"ok\n"


def _gate_bundle(model_digest: str, key_dir: Path, **changes: Any) -> bytes:
    from modelsec.attestations import Statement, Subject, sign_statement
    from modelsec.verifier.attestations import GATE_PREDICATE_TYPE
    from tests.unit.verifier.test_joint_verification import gate_predicate

    statement = Statement(
        (Subject("model", {"sha256": model_digest}),), GATE_PREDICATE_TYPE, gate_predicate(**changes)
    )
    return sign_statement(statement, load_private_key_file(key_dir / "ecdsa-p256.key.pem"))


def test_store_admits_only_acceptable_evidence(client: ModelsecClient, key_dir: Path) -> None:
    """The default policy requires no attestations; the store still refuses what would veto a model."""
    digest = "c" * 64
    for changes, mentions in [
        ({"gate.verdict": "FAILED"}, "verdict is 'FAILED'"),
        ({"sanity.checks": None}, "sanity.checks must be"),
        ({"results.robust.accuracy": "high"}, "results.robust.accuracy is not a number"),
    ]:
        with pytest.raises(VerificationError, match=mentions):
            client.put_attestation(_gate_bundle(digest, key_dir, **changes))
    assert client.get_attestations(digest) == []
    good = client.put_attestation(_gate_bundle(digest, key_dir))
    assert good.created and good.attestation.predicate_type.endswith("robustness-gate/v1")


def test_reformatted_replays_are_one_record(client: ModelsecClient, key_dir: Path) -> None:
    digest = "d" * 64
    bundle = _gate_bundle(digest, key_dir)
    first = client.put_attestation(bundle)
    doc = json.loads(bundle)
    doc["verificationMaterial"]["publicKey"]["hint"] = "0" * 64  # unsigned: changes nothing that counts
    variants = [
        bundle + b"\n" * 3,
        json.dumps(doc).encode(),
        json.dumps(json.loads(bundle), indent=7).encode(),
    ]
    for variant in variants:
        again = client.put_attestation(variant)
        assert not again.created and again.attestation.id == first.attestation.id
    (stored,) = client.get_attestations(digest)
    assert (
        json.loads(stored.bundle)["verificationMaterial"]["publicKey"]["hint"]
        == json.loads(bundle)["verificationMaterial"]["publicKey"]["hint"]
    )


def test_multi_subject_statements_are_not_stored(client: ModelsecClient, key_dir: Path) -> None:
    from modelsec.attestations import Statement, Subject, sign_statement
    from modelsec.verifier.attestations import GATE_PREDICATE_TYPE
    from tests.unit.verifier.test_joint_verification import gate_predicate

    subjects = (Subject("a", {"sha256": "e" * 64}), Subject("b", {"sha256": "f" * 64}))
    bundle = sign_statement(
        Statement(subjects, GATE_PREDICATE_TYPE, gate_predicate()),
        load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
    )
    with pytest.raises(MalformedArtifactError, match="exactly one subject"):
        client.put_attestation(bundle)
