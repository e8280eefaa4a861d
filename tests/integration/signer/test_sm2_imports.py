"""The SM2 backends, imported in a fresh interpreter, do not import the SM2 API module (`sm2.api`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_backends_do_not_import_the_sm2_module() -> None:
    code = (
        "import sys, modelsec.signer.schemes.sm2._openssl, modelsec.signer.schemes.sm2._gmssl;"
        "sys.exit('modelsec.signer.schemes.sm2.api' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
