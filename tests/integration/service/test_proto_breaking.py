"""`buf breaking` against the committed baseline (proto/baseline/): today passes, a breaking edit fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BUF = Path(os.environ.get("MODELSEC_BUF", REPO / ".venv" / "buf" / "node_modules" / ".bin" / "buf"))
BASELINE = REPO / "proto" / "baseline" / "modelsec-v1.binpb"

pytestmark = pytest.mark.skipif(
    not BUF.exists(), reason="buf is installed by `make test` (npm @bufbuild/buf)"
)


def _breaking(proto_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), "breaking", "--against", str(BASELINE)],
        cwd=proto_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_api_is_compatible_with_the_baseline() -> None:
    result = _breaking(REPO / "proto")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_deleted_field_and_a_renumbered_field_are_breaking(tmp_path: Path) -> None:
    proto = tmp_path / "proto"
    shutil.copytree(REPO / "proto", proto, ignore=shutil.ignore_patterns("*.py", "*.pyi", "baseline"))
    common = proto / "modelsec" / "v1" / "common.proto"
    text = common.read_text()
    assert "  string detail = 4;\n" in text and "  bool ok = 1;\n" in text
    common.write_text(text.replace("  string detail = 4;\n", "").replace("  bool ok = 1;", "  bool ok = 9;"))
    result = _breaking(proto)
    assert result.returncode != 0
    assert (
        'Previously present field "4" with name "detail" on message "Evidence" was deleted' in result.stdout
    )
    assert '"1" with name "ok" on message "AttestationVerdict" was deleted' in result.stdout
