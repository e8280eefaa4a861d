"""The modelsec.v1 API: committed stubs are fresh, and the .proto files pass buf lint (STANDARD)."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PROTO_DIR = REPO / "proto" / "modelsec" / "v1"
_ENV = {**os.environ, "PYTHON": sys.executable}  # the generators of the environment running the tests
BUF = Path(os.environ.get("MODELSEC_BUF", REPO / ".venv" / "buf" / "node_modules" / ".bin" / "buf"))


def test_committed_stubs_match_make_proto(tmp_path: Path) -> None:
    """Regenerating with the pinned generators yields the committed files byte for byte (else: make proto)."""
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, timeout=120, env=_ENV
    )
    generated = sorted(p.name for p in (tmp_path / "modelsec" / "v1").iterdir())
    committed = sorted(p.name for p in PROTO_DIR.iterdir() if "_pb2" in p.name)
    assert generated == committed, "stub files added or removed: run `make proto` and commit"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "modelsec" / "v1", PROTO_DIR, generated, shallow=False)
    assert not mismatch and not errors, f"stale stubs {mismatch + errors}: run `make proto` and commit"


def test_a_changed_proto_makes_the_stubs_stale(tmp_path: Path) -> None:
    """The freshness check can fail: one added field changes the generated code."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "proto", copy / "proto")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    signing = copy / "proto" / "modelsec" / "v1" / "signing.proto"
    signing.write_text(
        signing.read_text().replace(
            "message ListKeysRequest {}", "message ListKeysRequest {\n  string x = 1;\n}"
        )
    )
    out = tmp_path / "out"
    subprocess.run(
        ["bash", str(copy / "scripts" / "gen_proto.sh"), str(out)],
        check=True,
        timeout=120,
        cwd=copy,
        env=_ENV,
    )
    assert not filecmp.cmp(
        out / "modelsec" / "v1" / "signing_pb2.py", PROTO_DIR / "signing_pb2.py", shallow=False
    )


@pytest.mark.skipif(not BUF.exists(), reason="buf is installed by `make test` (npm @bufbuild/buf)")
def test_buf_lint_standard() -> None:
    result = subprocess.run(
        [str(BUF), "lint"], cwd=REPO / "proto", capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_service_is_generated_and_described() -> None:
    """Each service of the API has a servicer base, a stub and a reflection-visible descriptor."""
    from modelsec.v1 import (
        attestation_pb2,
        robustness_pb2,
        signing_pb2,
        verification_pb2,
        watermark_pb2,
    )

    names = {
        s.full_name
        for m in (attestation_pb2, robustness_pb2, signing_pb2, verification_pb2, watermark_pb2)
        for s in m.DESCRIPTOR.services_by_name.values()
    }
    assert names == {
        "modelsec.v1.AttestationService",
        "modelsec.v1.RobustnessService",
        "modelsec.v1.SigningService",
        "modelsec.v1.VerificationService",
        "modelsec.v1.WatermarkService",
    }
