"""The SM2 backends, imported in a fresh interpreter, do not import modelsec.signer.sm2 (moved from
tests/unit/signer/test_sm2.py: unit tests stay in-process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_backends_do_not_import_the_sm2_module() -> None:
    code = (
        "import sys, modelsec.signer._sm2_openssl, modelsec.signer._sm2_gmssl;"
        "sys.exit('modelsec.signer.sm2' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
