"""Paths cannot be raced: what is checked is what is read, and a server path cannot be redirected.

Each race is made deterministic: a test hook runs the attacker's step (an atomic directory exchange,
`renameat2(RENAME_EXCHANGE)`) exactly between the check and the use that the old code separated.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.modelformat import openat2
from modelsec.policy import Policy
from modelsec.service import state as service_state
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verification, verify_model
from tests.conftest import write_tiny_model
from tests.race_support import exchange
from tests.service_support import InThreadServer, write_server_config

P256 = SignatureAlgorithm.ECDSA_P256.value


@pytest.fixture(params=["openat2", "walk"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each race with openat2 and with the component-by-component O_NOFOLLOW walk."""
    if request.param == "openat2" and openat2._unavailable:
        pytest.skip("openat2 is unavailable here")
    monkeypatch.setattr(openat2, "FORCE_FALLBACK", request.param == "walk")
    return str(request.param)


def _signed(path: Path, key_dir: Path, seed: int) -> Path:
    write_tiny_model(path, seed=seed)
    sign_model(path, [load_private_key_file(key_dir / f"{P256}.key.pem")])
    return path


def test_walked_directory_is_hashed_directory(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch, resolution: str
) -> None:
    """The model directory exchanged for another after the walk: the hashed files are the walked ones."""
    policy = Policy.from_key_files([key_dir / f"{P256}.pub.pem"])
    model = _signed(tmp_path / "model", key_dir, seed=0)
    expected = verify_model(model, policy).root_digest
    other = _signed(tmp_path / "other", key_dir, seed=1)  # same names, other bytes
    real = verification.check_file_set

    def walk_then_swap(*args: Any, **kwargs: Any) -> list[str]:
        names = real(*args, **kwargs)
        exchange(model, other)
        return names

    monkeypatch.setattr(verification, "check_file_set", walk_then_swap)
    # The old code walked `model` by name, then opened it again by name to hash: it hashed `other`
    # against the bundles read from `model` (DigestMismatchError), i.e. a directory it never walked.
    assert verify_model(model, policy).root_digest == expected


@pytest.fixture
def read_root(tmp_path: Path, key_dir: Path) -> Iterator[tuple[InThreadServer, Path, Path]]:
    root = tmp_path / "root"
    inside = _signed(root / "team" / "model", key_dir, seed=0)
    _signed(tmp_path / "outside" / "model", key_dir, seed=1)
    config = write_server_config(tmp_path / "server", key_dir, readRoots=[str(root)])
    with InThreadServer(config) as server:
        yield server, inside, tmp_path


def test_verify_model_directory_exchange_race(
    read_root: tuple[InThreadServer, Path, Path],
    key_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    resolution: str,
) -> None:
    """`root/team` exchanged for a link to a model outside the read roots between the check and the open."""
    server, inside, tmp = read_root
    policy = Policy.from_key_files([key_dir / f"{P256}.pub.pem"])
    outside_digest = verify_model(tmp / "outside" / "model", policy).root_digest
    (tmp / "link").symlink_to(tmp / "outside")
    swapped: list[object] = []

    def attacker(where: service_state.ServerPath) -> None:
        exchange(inside.parent, tmp / "link")  # root/team is now a link to outside/
        swapped.append(where)

    monkeypatch.setattr(service_state, "path_hook", attacker, raising=False)
    with ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=30)) as client:
        answer = client.verify_model(str(inside))
    assert len(swapped) == 1
    # The old code verified outside/model and answered ok with its digest.
    assert answer.root_digest != outside_digest
    assert not answer.ok and answer.error_kind == "PolicyViolationError", answer
    assert "symlink" in answer.error


def test_verify_model_refuses_links_below_the_root(
    read_root: tuple[InThreadServer, Path, Path], resolution: str
) -> None:
    """A link inside the read root is refused, not resolved (it could be swapped after any check)."""
    server, inside, _ = read_root
    (inside.parent / "alias").symlink_to(inside)
    (inside.parent.parent / "team-alias").symlink_to(inside.parent)
    with ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=30)) as client:
        assert client.verify_model(str(inside)).ok
        for path in (inside.parent / "alias", inside.parent.parent / "team-alias" / "model"):
            answer = client.verify_model(str(path))
            assert not answer.ok and answer.error_kind == "PolicyViolationError", (path, answer)
        missing = client.verify_model(str(inside.parent / "nope"))
        assert not missing.ok and missing.error_kind == "MalformedArtifactError"


def test_verify_model_through_the_descriptor_after_a_rename(tmp_path: Path, key_dir: Path) -> None:
    """`dir_fd`: once the parent is open, renaming the path away changes nothing about what is verified."""
    import os

    policy = Policy.from_key_files([key_dir / f"{P256}.pub.pem"])
    model = _signed(tmp_path / "a" / "model", key_dir, seed=0)
    expected = verify_model(model, policy).root_digest
    fd = os.open(model.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        shutil.move(tmp_path / "a", tmp_path / "moved")
        _signed(tmp_path / "a" / "model", key_dir, seed=1)
        assert verify_model(model, policy, dir_fd=fd).root_digest == expected
    finally:
        os.close(fd)
