"""Verification needs no torch; loading says it does (a child process where `import torch` fails; moved
from tests/unit/verifier/test_loader.py: unit tests stay in-process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.signer import load_private_key_file, sign_model

pytestmark = pytest.mark.integration


def test_verifier_works_without_torch(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    code = f"""
import sys
sys.modules["torch"] = None  # import torch now fails
from pathlib import Path
from modelsec.policy import Policy
from modelsec.verifier import verify_model, load_model
from modelsec.errors import BackendUnavailableError
p = Policy.from_key_files([Path({str(key_dir / "ecdsa-p256.pub.pem")!r})])
print(verify_model(Path({str(tiny_model)!r}), p).files)
try:
    load_model(Path({str(tiny_model)!r}), p)
except BackendUnavailableError as e:
    print("needs torch")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["6", "needs", "torch"]
