"""Unicode-ambiguous resource names are refused from the signed manifest, not only by the directory walk.

A signer that writes its own manifest (or a directory signed on a case-sensitive, non-normalising file
system) can list `café.json` twice, as NFC and as NFD, or `Config.json` next to `config.json`. On macOS or
Windows both names are one file, so which bytes a single-file verify or load checked would depend on the
checkout. Each entry point refuses such a manifest before opening any file.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import pytest

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.attestations.bundle import sign_statement
from modelsec.attestations.predicates.oms import build_manifest, manifest_statement
from modelsec.errors import MalformedArtifactError
from modelsec.modelformat.hashing import hash_files
from modelsec.modelformat.model_files import open_model_root
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file
from modelsec.signer.layout import DEFAULT_IGNORE_PATHS, SIGNATURE_FILE_NAMES, write_bundle_file
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model

NFC = unicodedata.normalize("NFC", "café.json")
NFD = unicodedata.normalize("NFD", "café.json")
SHARD = "model-00001-of-00002.safetensors"


def _sign_by_hand(model: Path, key_dir: Path) -> None:
    """Hash every file and sign the manifest directly: `sign_model`'s walk would refuse the names."""
    names = sorted(
        (n for n in os.listdir(model) if n not in SIGNATURE_FILE_NAMES), key=lambda n: n.encode("utf-8")
    )
    root_fd = open_model_root(model)
    try:
        digests = hash_files(
            root_fd,
            names,
            algorithms=[HashAlgorithm.SHA256],
            tensor_hash=HashAlgorithm.BLAKE3,
            model=str(model),
        )
    finally:
        os.close(root_fd)
    manifest = build_manifest(
        model.name,
        digests,
        hash_type=HashAlgorithm.SHA256,
        ignore_paths=[*DEFAULT_IGNORE_PATHS, *SIGNATURE_FILE_NAMES],
        tensor_hash=HashAlgorithm.BLAKE3,
    )
    signer = load_private_key_file(key_dir / f"{SignatureAlgorithm.ECDSA_P256.value}.key.pem")
    write_bundle_file(model / "model.sig", sign_statement(manifest_statement(manifest), signer))


@pytest.fixture(params=[(NFC, NFD), ("Config.json", "config.json")], ids=["nfc-nfd", "case"])
def ambiguous_model(request: pytest.FixtureRequest, tmp_path: Path, key_dir: Path) -> tuple[Path, str, str]:
    first, second = request.param
    model = write_tiny_model(tmp_path / "m")
    (model / first).write_text('{"a": 1}')
    (model / second).write_text('{"a": 2}')
    listed = os.listdir(model)
    assert first in listed and second in listed  # both spellings exist here (Linux: names are bytes)
    _sign_by_hand(model, key_dir)
    return model, first, second


def _policy(key_dir: Path) -> Policy:
    return Policy.from_key_files([key_dir / f"{SignatureAlgorithm.ECDSA_P256.value}.pub.pem"])


def _names_both(e: pytest.ExceptionInfo[MalformedArtifactError], first: str, second: str) -> None:
    message = str(e.value)
    assert repr(first) in message and repr(second) in message and "ambiguous" in message


def test_single_file_verify_refuses_ambiguous_manifest(
    ambiguous_model: tuple[Path, str, str], key_dir: Path
) -> None:
    model, first, second = ambiguous_model
    for target in (model / SHARD, model / first, model / second, model):
        with pytest.raises(MalformedArtifactError) as e:
            verify_model(target, _policy(key_dir))
        _names_both(e, first, second)


def test_single_shard_load_refuses_ambiguous_manifest(
    ambiguous_model: tuple[Path, str, str], key_dir: Path
) -> None:
    pytest.importorskip("torch").set_num_threads(1)
    from modelsec.verifier import load_model, open_model

    model, first, second = ambiguous_model
    with pytest.raises(MalformedArtifactError) as e:
        load_model(model / SHARD, _policy(key_dir))
    _names_both(e, first, second)
    with pytest.raises(MalformedArtifactError) as e:
        open_model(model / SHARD, _policy(key_dir))
    _names_both(e, first, second)


def test_distinct_names_still_verify(tmp_path: Path, key_dir: Path) -> None:
    """The control: the same hand-signed layout with two unrelated names verifies."""
    model = write_tiny_model(tmp_path / "m")
    (model / NFC).write_text('{"a": 1}')
    (model / "other.json").write_text('{"a": 2}')
    _sign_by_hand(model, key_dir)
    assert verify_model(model, _policy(key_dir)).files == 8
    assert verify_model(model / NFC, _policy(key_dir)).files == 1
