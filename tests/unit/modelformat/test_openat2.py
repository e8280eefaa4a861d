"""`open_beneath_fd`: openat2 and the forced O_NOFOLLOW walk give the same answers; errors name the path."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.modelformat import openat2
from modelsec.modelformat.model_files import open_dir_beneath, walk_model


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2" and openat2._unavailable:
        pytest.skip("openat2 is unavailable here")
    monkeypatch.setattr(openat2, "FORCE_FALLBACK", request.param == "walk")
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "r" / "d").mkdir(parents=True)
    (tmp_path / "r" / "d" / "f").write_bytes(b"x")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "f").write_bytes(b"secret")
    (tmp_path / "r" / "link").symlink_to(tmp_path / "out")
    (tmp_path / "r" / "d" / "flink").symlink_to("f")
    fd = os.open(tmp_path / "r", os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


@pytest.mark.parametrize(
    ("path", "flags", "err"),
    [
        ("link/f", os.O_RDONLY, errno.ELOOP),
        ("link", os.O_RDONLY | os.O_DIRECTORY, errno.ELOOP),
        ("d/flink", os.O_RDONLY, errno.ELOOP),
        ("../r/d/f", os.O_RDONLY, errno.EXDEV),
        ("d/missing", os.O_RDONLY, errno.ENOENT),
        ("d/f/x", os.O_RDONLY, errno.ENOTDIR),
    ],
)
def test_refusals_agree(tree: int, mode: str, path: str, flags: int, err: int) -> None:
    with pytest.raises(OSError) as caught:
        os.close(openat2.open_beneath_fd(tree, path, flags))
    assert caught.value.errno == err


def test_opens(tree: int, mode: str) -> None:
    fd = openat2.open_beneath_fd(tree, "d/f", os.O_RDONLY)
    try:
        assert os.read(fd, 10) == b"x"
    finally:
        os.close(fd)
    assert openat2.openat2_available() is (mode == "openat2")


def test_modelsec_errors(tree: int, mode: str) -> None:
    with pytest.raises(PolicyViolationError, match=r"'link/sub' is .*symlink"):
        open_dir_beneath(tree, "link/sub", what="root")
    with pytest.raises(MalformedArtifactError, match="cannot open 'nope'"):
        open_dir_beneath(tree, "nope", what="root")


def test_walk_refuses_links_in_both_modes(tmp_path: Path, mode: str) -> None:
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "sub" / "a.json").write_text("{}")
    assert [f.name for f in walk_model(tmp_path / "m", ignore_paths=())] == ["sub/a.json"]
    (tmp_path / "m" / "sub" / "b.json").symlink_to(tmp_path / "m" / "sub" / "a.json")
    with pytest.raises(PolicyViolationError, match="symlink"):
        walk_model(tmp_path / "m", ignore_paths=())
