"""The configuration models, checked in child processes: the published JSON Schemas are what the
generator script writes, and importing the policy module leaves pydantic unimported (moved from
tests/unit/config/test_config_models.py: unit tests stay in-process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.config.test_config_models import SCHEMAS

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


def test_regenerated_schemas_are_byte_identical(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "scripts" / "gen_schemas.py"), str(tmp_path)], check=True)
    for name, _ in SCHEMAS.values():
        assert (tmp_path / name).read_bytes() == (REPO / "schemas" / name).read_bytes(), name


def test_importing_the_policy_module_does_not_import_pydantic() -> None:
    """The runtime guard imports modelsec.policy in every process; pydantic only once a file is parsed."""
    code = "import sys, modelsec.policy; print('pydantic' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "False\n"
