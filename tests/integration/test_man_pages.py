"""The committed man pages (docs/man) are the ones `scripts/gen_man.py` writes from today's click commands."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAN = REPO / "docs" / "man"


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_man", REPO / "scripts" / "gen_man.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_man_pages_are_current() -> None:
    pages: dict[str, str] = _generator().generate()  # type: ignore[attr-defined]
    committed = {p.name: p.read_text() for p in MAN.glob("*.1")}
    stale = sorted(n for n in pages.keys() | committed.keys() if pages.get(n) != committed.get(n))
    assert not stale, f"run `make man` and commit docs/man: {stale} differ"
    # Every command and subcommand has a page, and the main page documents shell completion.
    assert {"modelsec.1", "modelsec-verify.1", "modelsec-attest-list.1", "modelsec-gate-pgd.1"} <= set(pages)
    assert "_MODELSEC_COMPLETE=bash_source modelsec" in pages["modelsec.1"]


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_a_page_renders_with_its_options() -> None:
    shown = subprocess.run(
        ["groff", "-man", "-Tascii", "-P-cbou", "-rLL=200n", "-ww", str(MAN / "modelsec-release.1")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--gate-config PATH" in shown.stdout and "MODELSEC-RELEASE(1)" in shown.stdout
    assert shown.stderr == ""  # no groff warning
