"""Walking a model directory and the resource-name rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.model_files import validate_resource_name, walk_model
from modelsec.signer.layout import DEFAULT_IGNORE_PATHS


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a\\b",
        "a\x00b",
        "./a",
        "a//b",
        "a/",
        "%2e%2e/x",
        "a/./b",
        "a\nb",
    ],
)
def test_unclean_names_refused(name: str) -> None:
    with pytest.raises(MalformedArtifactError):
        validate_resource_name(name, what="m")


@pytest.mark.parametrize(
    "name", ["config.json", "1_Pooling/config.json", "README_modèle.md", ".hidden", "a b/c"]
)
def test_clean_names_accepted(name: str) -> None:
    assert validate_resource_name(name, what="m") == name


def test_walk_sorted_ignores_top_level_only(tmp_path: Path) -> None:
    for rel in ["b.txt", "a/c.txt", ".git/HEAD", "sub/.git/HEAD", ".gitattributes", "model.sig"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
    names = [f.name for f in walk_model(tmp_path, ignore_paths=[*DEFAULT_IGNORE_PATHS, "model.sig"])]
    assert names == ["a/c.txt", "b.txt", "sub/.git/HEAD"]


def test_case_and_normalisation_duplicates_refused(tmp_path: Path) -> None:
    (tmp_path / "Config.json").write_text("1")
    (tmp_path / "config.json").write_text("2")
    with pytest.raises(MalformedArtifactError, match="ambiguous"):
        walk_model(tmp_path, ignore_paths=[])


def test_nfc_nfd_duplicates_refused(tmp_path: Path) -> None:
    (tmp_path / "mod\u00e8le").write_text("1")
    (tmp_path / "mode\u0300le").write_text("2")
    with pytest.raises(MalformedArtifactError, match="ambiguous"):
        walk_model(tmp_path, ignore_paths=[])


def test_special_files_and_links_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PolicyViolationError, match="not a regular file"):
        walk_model(tmp_path, ignore_paths=[])
    os.unlink(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path)
    with pytest.raises(PolicyViolationError, match="symlink"):
        walk_model(tmp_path, ignore_paths=[])


def test_limits(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_text("x")
    with pytest.raises(MalformedArtifactError, match="more than 3 files"):
        walk_model(tmp_path, ignore_paths=[], limits=Limits(max_files=3))
    deep = tmp_path / "d"
    for i in range(5):
        deep = deep / str(i)
    deep.mkdir(parents=True)
    with pytest.raises(MalformedArtifactError, match="deeper"):
        walk_model(tmp_path, ignore_paths=[], limits=Limits(max_depth=3))


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(MalformedArtifactError, match="not a directory"):
        walk_model(_file(tmp_path), ignore_paths=[])
    with pytest.raises(MalformedArtifactError, match="cannot read"):
        walk_model(tmp_path / "nope", ignore_paths=[])


def _file(tmp_path: Path) -> Path:
    p = tmp_path / "file"
    p.write_text("x")
    return p
