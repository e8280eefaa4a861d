"""The wheel installs exactly the `modelsec` namespace with every subpackage (DESIGN.md, Layout)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration
SUBPACKAGES = ["attestations", "signer", "verifier", "watermark", "robustness", "v1", "service", "webhook"]


def test_wheel_contains_every_subpackage_and_nothing_else(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("modelsec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"modelsec"}, top
    for sub in SUBPACKAGES:
        assert f"modelsec/{sub}/__init__.py" in names, sub
    assert "modelsec/errors.py" in names and "modelsec/py.typed" in names
    for stub in ("signing_pb2.py", "signing_pb2.pyi", "signing_pb2_grpc.py", "signing.proto"):
        assert f"modelsec/v1/{stub}" in names, stub
    assert not any(n.startswith("modelsec/tests") for n in names)


def test_verifier_imports_without_torch_and_grpc() -> None:
    code = (
        "import sys; import modelsec.verifier, modelsec.signer, modelsec.attestations, modelsec._cli;"
        "heavy = {'torch', 'grpc', 'numpy', 'rich'};"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
