"""One store protocol chosen by URI: directory, SQLite (and gRPC, tested with the service) behave alike."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.cli.main import main
from modelsec.errors import (
    BackendUnavailableError,
    MalformedArtifactError,
    NotFoundError,
    PolicyError,
)
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file
from modelsec.verifier import verify_model
from modelsec.verifier.stores import StoreOptions, open_store
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.verifier.stores.sqlite import SqliteAttestationStore
from tests.unit.verifier.test_joint_verification import gate_predicate, setup, watermark_predicate  # noqa: F401


@pytest.mark.parametrize("kind", ["plain", "file", "sqlite"])
def test_every_local_store_files_and_reads_back_by_digest(
    setup: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    kind: str,
) -> None:
    reference = {
        "plain": str(tmp_path / "dir"),
        "file": f"file://{tmp_path / 'dir'}",
        "sqlite": f"sqlite://{tmp_path / 'store.db'}",
    }[kind]
    gate = setup["attest"]("gate", gate_predicate())
    wm = setup["attest"]("watermark", watermark_predicate())
    store = open_store(reference, StoreOptions(must_exist=False))
    assert isinstance(store, SqliteAttestationStore if kind == "sqlite" else DirectoryStore)
    first, created = store.put(gate)
    assert created and store.put(gate) == (first, False)  # idempotent
    store.put(wm)
    assert sorted(store.bundles(setup["root"])) == sorted([gate, wm])
    assert store.get(setup["root"], first.id).data == gate
    with pytest.raises(NotFoundError):
        store.get(setup["root"], "0" * 64)
    assert store.bundles("cd" * 32) == []
    with pytest.raises(MalformedArtifactError):
        store.put(b"not a bundle")
    store.check()
    store.close()
    # A policy naming the store finds the attestations there (weights signatures next to the model).
    policy = dataclasses.replace(setup["policy"], attestation_store=reference)
    assert verify_model(setup["model"], policy).files == 6


def test_open_store_refuses_unknown_schemes_and_empty_targets() -> None:
    with pytest.raises(PolicyError, match="unknown scheme 'ftp'"):
        open_store("ftp://host/x")
    with pytest.raises(PolicyError, match="names no"):
        open_store("sqlite://")


def test_directory_store_missing_root_is_an_outage_unless_optional(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailableError):
        open_store(str(tmp_path / "nope")).bundles("ab" * 32)
    with pytest.raises(BackendUnavailableError):
        open_store(str(tmp_path / "nope")).check()
    assert open_store(str(tmp_path / "nope"), StoreOptions(must_exist=False)).bundles("ab" * 32) == []


def test_one_limit_on_bundles_per_digest(setup: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    """Over the limit the newest are read and the rest listed unread (old code: an error, i.e. a veto)."""
    store = open_store(str(tmp_path / "dir"), StoreOptions(max_bundles=1, must_exist=False))
    gate, _ = store.put(setup["attest"]("gate", gate_predicate()))
    wm, _ = store.put(setup["attest"]("watermark", watermark_predicate()))
    os.utime(gate.source, ns=(10**18, 10**18))  # the gate is the newest file
    os.utime(wm.source, ns=(10**17, 10**17))
    assert store.bundles(setup["root"]) == [gate.data]
    read, unread = store.entries(setup["root"])
    assert read.data == gate.data and not read.note
    assert unread.id == wm.id and unread.data == b"" and "not read" in unread.note


def _policy_doc(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [{"name": "p", "match": ["file:///**"], "keys": ["ecdsa-p256.pub.pem"], **fields}],
    }


def test_policy_store_reference_and_its_older_name(key_dir: Path) -> None:
    def store_of(**fields: Any) -> str | None:
        return (
            PolicySet.from_mapping(_policy_doc(**fields), base_dir=key_dir, source="t")
            .policies[0]
            .attestation_store
        )

    assert store_of(attestationDir="att") == str(key_dir / "att")
    assert store_of(attestationStore="att") == str(key_dir / "att")
    assert store_of(attestationStore="sqlite://s.db") == f"sqlite://{key_dir / 's.db'}"
    assert store_of(attestationStore="grpcs://store.internal:443") == "grpcs://store.internal:443"
    assert store_of() is None
    with pytest.raises(PolicyError, match="not both"):
        store_of(attestationDir="a", attestationStore="b")
    with pytest.raises(PolicyError, match="attestationDir must be a path"):
        store_of(attestationDir="sqlite://s.db")


def test_attest_list_refuses_an_unknown_predicate_type_like_the_verifier(
    tiny_model: Path, key_dir: Path
) -> None:
    """Old code: `attest list --key` verified an unknown predicate type under the `weights` role and listed it
    as signed, while `verify_attestations` refuses the same bundle."""
    statement = Statement((Subject("m", {"sha256": "ab" * 32}),), "https://example.com/other/v1", {"x": 1})
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    (tiny_model / "model.gate.sig").write_bytes(sign_statement(statement, signer))
    key = str(key_dir / "ecdsa-p256.pub.pem")
    result = CliRunner().invoke(main, ["attest", "list", str(tiny_model), "--trusted-key", key, "--json"])
    assert result.exit_code == 1, result.output
    assert "unknown predicateType 'https://example.com/other/v1'" in result.output
    # Without keys nothing is verified, and the listing says so.
    result = CliRunner().invoke(main, ["attest", "list", str(tiny_model), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["bundles"]
    assert row["signer"] is None
