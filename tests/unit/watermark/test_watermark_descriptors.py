"""embed_model reads the directory it walked and writes beneath the parent it opened (issue 14, item 2's
leftover): a path swapped meanwhile redirects neither the read nor the write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from modelsec.watermark import WatermarkKey, embed_model
from modelsec.watermark import embed as embed_module

MSG = b"acme/toy v1"


def test_a_model_directory_swapped_after_the_walk_is_not_read(
    toy_model: Path, wm_key: WatermarkKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code: the writer reopened the model by name and copied the swapped-in directory's side files."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "model.safetensors").write_bytes((toy_model / "model.safetensors").read_bytes())
    os.utime(decoy / "model.safetensors", ns=(os.stat(toy_model / "model.safetensors").st_mtime_ns,) * 2)
    (decoy / "config.json").write_text('{"auto_map": "evil.Model"}')
    run = embed_module._Writer.run

    def swap_then_run(self: Any) -> None:
        os.rename(toy_model, tmp_path / "original")
        os.rename(decoy, toy_model)
        run(self)

    monkeypatch.setattr(embed_module._Writer, "run", swap_then_run)
    embed_model(toy_model, tmp_path / "out", wm_key, MSG)
    assert (tmp_path / "out" / "config.json").read_text() == "{}"


def test_an_output_parent_swapped_after_it_was_opened_is_not_written(
    toy_model: Path, wm_key: WatermarkKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    opened = embed_module._open_out_parent

    def open_then_swap(out_dir: Path) -> int:
        fd = opened(out_dir)
        os.rename(parent, tmp_path / "parent-moved")
        os.symlink(elsewhere, parent)
        return fd

    monkeypatch.setattr(embed_module, "_open_out_parent", open_then_swap)
    embed_model(toy_model, parent / "out", wm_key, MSG)
    assert (tmp_path / "parent-moved" / "out" / "model.safetensors").is_file()
    assert list(elsewhere.iterdir()) == []
