"""Importing the watermark package and its CLI module, in a fresh interpreter, loads no numeric library
(moved from tests/unit/watermark/test_watermark_scheme.py: unit tests stay in-process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_import_is_light() -> None:
    code = (
        "import sys, modelsec.watermark as w, modelsec.cli.watermark\n"
        "w.detect, w.embed_model, w.WatermarkKey\n"
        "print(sorted(m for m in ('torch', 'numpy', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
