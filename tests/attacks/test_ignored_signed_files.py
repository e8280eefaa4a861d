"""A manifest whose ignore list names a file it also signs is refused when the bundle is parsed (issue 27, 8).

Such a manifest contradicts itself: modelsec checks every listed resource, another verifier could skip the
file the list ignores. A signer that writes its own manifest can produce it; the verifier refuses it as
malformed, naming the ignored path and the signed file, before any model file is hashed. The same holds for
a folder that holds a signed file, and for a name that is the signed one on a case-insensitive or
normalising file system.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.bundle import sign_statement
from modelsec.attestations.predicates.oms import build_manifest, manifest_statement
from modelsec.errors import MalformedArtifactError
from modelsec.modelformat.hashing import hash_files
from modelsec.modelformat.model_files import open_model_root
from modelsec.signer import load_private_key_file
from modelsec.signer.layout import DEFAULT_IGNORE_PATHS, SIGNATURE_FILE_NAMES, write_bundle_file
from modelsec.verifier import verify_model
from tests.conftest import run_cli, write_tiny_model
from tests.support.policies import key_policy

SIGNED = ["config.json", "sub/extra.json", "model-00001-of-00002.safetensors"]


def _sign_with_ignore_list(model: Path, key_dir: Path, ignored: list[str]) -> None:
    """Hash every file and sign a manifest whose ignore list is `ignored` (`sign_model` never writes one)."""
    names = sorted(
        str(p.relative_to(model))
        for p in model.rglob("*")
        if p.is_file() and p.name not in SIGNATURE_FILE_NAMES
    )
    root_fd = open_model_root(model)
    try:
        digests = hash_files(
            root_fd, names, algorithms=[HashAlgorithm.SHA256], tensor_hash=None, model=str(model)
        )
    finally:
        os.close(root_fd)
    manifest = build_manifest(
        model.name,
        digests,
        hash_type=HashAlgorithm.SHA256,
        ignore_paths=[*DEFAULT_IGNORE_PATHS, *SIGNATURE_FILE_NAMES, *ignored],
        tensor_hash=None,
    )
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    write_bundle_file(model / "model.sig", sign_statement(manifest_statement(manifest), signer))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    root = write_tiny_model(tmp_path / "m")
    (root / "sub").mkdir()
    (root / "sub" / "extra.json").write_text('{"a": 1}')
    return root


@pytest.mark.parametrize(
    ("ignored", "signed"),
    [
        ("config.json", "config.json"),
        ("sub/extra.json", "sub/extra.json"),
        ("sub", "sub/extra.json"),  # a folder: OMS ignores everything below it
        ("CONFIG.JSON", "config.json"),  # one file on a case-insensitive file system
        ("model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors"),
    ],
)
def test_an_ignored_signed_file_is_refused(model: Path, key_dir: Path, ignored: str, signed: str) -> None:
    _sign_with_ignore_list(model, key_dir, [ignored])
    with pytest.raises(MalformedArtifactError) as e:
        verify_model(model, key_policy(key_dir))
    message = str(e.value)
    assert message.startswith(f"{model / 'model.sig'}: ")
    assert f"ignore_paths names {ignored!r}, but the manifest signs {signed!r}" in message
    r = run_cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json")
    assert r.returncode == 1
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "MalformedArtifactError" and repr(ignored) in error["message"]


def test_an_ignore_list_of_unsigned_names_still_verifies(model: Path, key_dir: Path) -> None:
    """The control: the same hand-signed layout ignoring names it does not sign (nor a prefix of one)."""
    _sign_with_ignore_list(model, key_dir, ["notes.txt", "su", "config"])
    assert verify_model(model, key_policy(key_dir)).files == len(list(model.rglob("*.json"))) + 2
    assert all((model / name).is_file() for name in SIGNED)
