"""A file that vanishes or changes type while a model is walked or hashed is a modelsec error naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import MalformedArtifactError
from modelsec.modelformat import model_files
from modelsec.modelformat.hashing import hash_files
from modelsec.modelformat.model_files import open_model_root, walk_model
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model

P256 = SignatureAlgorithm.ECDSA_P256.value


def _delete_when_seen(monkeypatch: pytest.MonkeyPatch, victim: Path) -> None:
    """Delete `victim` right after the walk listed it, before its stat (the name check runs in between)."""
    real = model_files.ambiguity_key

    def key(name: str) -> str:
        if name == victim.name and victim.exists():
            victim.unlink()
        return real(name)

    monkeypatch.setattr(model_files, "ambiguity_key", key)


def test_file_vanishing_during_walk(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _delete_when_seen(monkeypatch, tiny_model / "tokenizer.json")
    with pytest.raises(MalformedArtifactError, match=r"'tokenizer\.json' vanished"):
        walk_model(tiny_model, ignore_paths=())


def test_file_vanishing_during_verify(
    tiny_model: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sign_model(tiny_model, [load_private_key_file(key_dir / f"{P256}.key.pem")])
    _delete_when_seen(monkeypatch, tiny_model / "config.json")
    with pytest.raises(MalformedArtifactError, match=r"'config\.json' vanished"):
        verify_model(tiny_model, Policy.from_key_files([key_dir / f"{P256}.pub.pem"]))


def test_file_vanishing_before_hashing(tiny_model: Path) -> None:
    names = [f.name for f in walk_model(tiny_model, ignore_paths=())]
    (tiny_model / "config.json").unlink()
    root_fd = open_model_root(tiny_model)
    try:
        with pytest.raises(MalformedArtifactError, match=r"config\.json"):
            hash_files(root_fd, names, algorithms=[HashAlgorithm.SHA256], model=str(tiny_model))
    finally:
        os.close(root_fd)
