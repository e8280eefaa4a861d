"""DeleteAttestation and SupersedeAttestation on a real loopback server, through the client and the store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from modelsec.errors import MalformedArtifactError, NotFoundError, PermissionDeniedError
from modelsec.policy import Policy
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_attestations
from modelsec.verifier.stores import StoreOptions, open_store
from tests.conftest import write_tiny_model
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration

TOKENS = {"ci": "ci-secret", "ops": "ops-secret", "retire": "retire-secret"}


def _token(identity: str) -> dict[str, str]:
    return {"identity": identity, "sha256": hashlib.sha256(TOKENS[identity].encode()).hexdigest()}


def test_withdrawing_evidence_is_authorised_and_readers_stop_seeing_it(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "model", shards=1)
    digest = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]).root_digest
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    # Its own server: identities by bearer token, each allowed a different withdrawal call.
    config = write_server_config(
        tmp_path / "server",
        key_dir,
        tokens=[_token(name) for name in TOKENS],
        access={
            "putAttestation": ["ci"],
            "deleteAttestation": ["ops"],
            "supersedeAttestation": ["ops", "retire"],
        },
    )
    with InThreadServer(config) as server:

        def store(identity: str):  # what `attest delete grpc://…` and a verifier open
            channel = ChannelOptions(plaintext=True, token=TOKENS[identity], timeout=10)
            return open_store(f"grpc://{server.target}", StoreOptions(channel=channel))

        with store("ci") as ci, store("ops") as ops, store("retire") as retire:
            entry, created = ci.put((model / "model.sig").read_bytes())
            assert created and verify_attestations(digest, ci.entries(digest), policy).ok
            # Not granted: the default is nobody, and each operation has its own permission.
            with pytest.raises(PermissionDeniedError, match="'ci' may not call supersedeAttestation"):
                ci.supersede(digest, entry.id)
            with pytest.raises(PermissionDeniedError, match="'retire' may not call deleteAttestation"):
                retire.delete(digest, entry.id)
            assert [e.id for e in ops.entries(digest)] == [entry.id]  # nothing changed

            retire.supersede(digest, entry.id)
            assert ci.entries(digest) == []  # withdrawn from readers: the model is no longer attested
            assert not verify_attestations(digest, ci.entries(digest), policy).ok
            with ModelsecClient(server.target, ChannelOptions(plaintext=True, token=TOKENS["ci"])) as c:
                assert list(c.list_attestations(root_digest=digest)) == []
            with pytest.raises(NotFoundError, match="NOT_FOUND"):
                retire.supersede(digest, entry.id)  # already superseded
            # A superseded record is kept: putting it again does not bring it back, deleting forgets it.
            assert ci.put((model / "model.sig").read_bytes())[1] is False
            assert ci.entries(digest) == []
            ops.delete(digest, entry.id)
            with pytest.raises(NotFoundError, match="NOT_FOUND"):
                ops.delete(digest, entry.id)
            again, created = ci.put((model / "model.sig").read_bytes())
            assert created and again.id == entry.id and [e.id for e in ci.entries(digest)] == [entry.id]
            ops.delete(digest, entry.id)
            assert ci.entries(digest) == []


def test_withdraw_requests_are_checked(grpc_server: InThreadServer) -> None:
    with ModelsecClient(grpc_server.target, ChannelOptions(plaintext=True)) as client:
        for call in (client.delete_attestation, client.supersede_attestation):
            with pytest.raises(MalformedArtifactError, match=r"INVALID_ARGUMENT.*root_digest"):
                call("ab", "cd" * 32)
            with pytest.raises(MalformedArtifactError, match=r"INVALID_ARGUMENT.*record id"):
                call("ab" * 32, "../x")
            with pytest.raises(NotFoundError, match="no bundle"):
                call("ab" * 32, "cd" * 32)
