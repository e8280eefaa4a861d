"""Python modules are refused by name in any spelling Python imports: `.PY`, `.pyc`, `.pyo` (user trial 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.errors import PolicyViolationError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.signing import unverifiable_files
from modelsec.verifier import verify_model

CODE_NAMES = [
    "modeling.py",
    "modeling.PY",
    "modeling.Py",
    "modeling.pyc",
    "sub/__pycache__/m.cpython-312.pyc",
    "m.PYO",
]


@pytest.mark.parametrize("name", CODE_NAMES)
def test_signed_code_file_is_refused_unless_remote_code_is_allowed(
    tiny_model: Path, key_dir: Path, name: str
) -> None:
    (tiny_model / name).parent.mkdir(parents=True, exist_ok=True)
    (tiny_model / name).write_bytes(b"\x00 any bytes: a sourceless module imports as well")
    sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    trusted = [key_dir / "ecdsa-p256.pub.pem"]
    with pytest.raises(PolicyViolationError, match="remote code is refused") as info:
        verify_model(tiny_model, Policy.from_key_files(trusted))
    assert name in str(info.value)
    with pytest.raises(PolicyViolationError, match="remote code is refused"):
        verify_model(tiny_model, Policy.from_key_files(trusted), files=[name])
    verify_model(tiny_model, Policy.from_key_files(trusted, allow_remote_code=True))


def test_sign_reports_the_same_names_verify_refuses() -> None:
    names = [*CODE_NAMES, "model.safetensors", "notes.pyx", "python.txt", "w.BIN"]
    assert unverifiable_files(names) == [
        *(f"{n} (remote code)" for n in CODE_NAMES),
        "w.BIN (pickle format)",
    ]


def test_file_names_are_not_part_of_the_root_digest(tiny_model: Path, key_dir: Path) -> None:
    """Documented (verifying.md): renaming a signed file keeps the OMS root digest (its names are signed)."""
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    roots = set()
    for name in ("modeling.py", "modeling.PY", "modeling.pyc"):
        for stale in tiny_model.glob("modeling.*"):
            stale.unlink()
        (tiny_model / name).write_text("x = 1\n")
        roots.add(sign_model(tiny_model, [key], force=True).root_digest)
    assert len(roots) == 1
