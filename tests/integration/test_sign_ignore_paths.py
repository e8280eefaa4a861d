"""`sign --ignore-paths` resolves paths as model_signing's CLI does, and refuses what would ignore nothing;
`digest` as `sign`, `verify` refuses only a path outside the model (an ignored file may be absent).

User trial 11: `modelsec sign s1 --ignore-paths config.json`, run from the parent directory, signed
config.json anyway without a word (the path resolved to ./config.json, outside the model, and was dropped).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_tiny_model

pytestmark = pytest.mark.integration

HAS_MS = importlib.util.find_spec("model_signing") is not None


def _run(exe: str, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`modelsec` in-process; model_signing's CLI (the reference) in a process of its own."""
    if exe == "modelsec":
        return run_cli(*args, cwd=cwd)
    assert exe == "model_signing", exe
    return subprocess.run(
        [sys.executable, "-m", "model_signing", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _predicate(bundle: Path) -> dict[str, object]:
    envelope = json.loads(bundle.read_text())["dsseEnvelope"]
    predicate: dict[str, object] = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    return predicate


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ("config.json", "outside the model directory m"),  # ./config.json: the trial's mistake
        ("../elsewhere.txt", "outside the model directory m"),
        ("m/nope.txt", "does not exist"),
        ("m/notes/../nope", "does not exist"),
    ],
)
def test_a_path_that_ignores_nothing_is_a_usage_error(
    tmp_path: Path, key_dir: Path, given: str, needle: str
) -> None:
    model = write_tiny_model(tmp_path / "m")
    (model / "notes").mkdir()
    (tmp_path / "config.json").write_text("{}")  # exists, but is not the model's
    r = _run(
        "modelsec",
        "sign",
        "m",
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--ignore-paths",
        given,
        cwd=tmp_path,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"'{given}'" in r.stderr and needle in r.stderr and "Traceback" not in r.stderr
    assert not (model / "model.sig").exists()
    if given == "config.json":
        assert "'m/config.json'" in r.stderr  # says what to write instead


def test_relative_to_the_current_directory_as_model_signing(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    (model / "notes").mkdir()
    (model / "notes" / "a.txt").write_text("draft")
    key = key_dir / "ecdsa-p256.key.pem"
    ours = tmp_path / "ours.sig"
    r = _run(
        "modelsec", "sign", "m", "--signing-key", key, "--ignore-paths", "m/notes/", "-s", ours, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    predicate = _predicate(ours)
    assert "notes" in predicate["serialization"]["ignore_paths"]  # type: ignore[index]
    assert "notes/a.txt" not in [x["name"] for x in predicate["resources"]]  # type: ignore[attr-defined]
    # From inside the model, the model-relative spelling resolves the same way.
    r = _run(
        "modelsec",
        "sign",
        ".",
        "--signing-key",
        key,
        "--ignore-paths",
        "notes",
        "-s",
        tmp_path / "in.sig",
        cwd=model,
    )
    assert r.returncode == 0, r.stderr
    assert _predicate(tmp_path / "in.sig")["resources"] == predicate["resources"]
    if not HAS_MS:
        pytest.skip("model_signing not installed (pip install --group test)")
    theirs = tmp_path / "theirs.sig"
    r = _run(
        "model_signing", "sign", "key", "m", "--private_key", key, "--signature", theirs,
        "--ignore-paths", "m/notes/", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert _predicate(theirs)["resources"] == predicate["resources"]


@pytest.mark.parametrize(
    ("command", "given", "needle"),
    [
        ("digest", "config.json", "outside the model directory m"),
        ("digest", "m/nope.txt", "does not exist"),
        ("verify", "config.json", "outside the model directory m"),
        ("verify", "../elsewhere.txt", "outside the model directory m"),
    ],
)
def test_digest_and_verify_refuse_a_path_outside_the_model(
    tmp_path: Path, key_dir: Path, command: str, given: str, needle: str
) -> None:
    """They dropped it without a word: `digest` then printed a root `sign` would never produce."""
    model = write_tiny_model(tmp_path / "m")
    (tmp_path / "config.json").write_text("{}")
    r = _run("modelsec", "sign", "m", "--signing-key", key_dir / "ecdsa-p256.key.pem", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    extra = ["--trusted-key", key_dir / "ecdsa-p256.pub.pem"] if command == "verify" else []
    r = _run("modelsec", command, "m", *extra, "--ignore-paths", given, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"--ignore-paths: ignore path '{given}'" in r.stderr and needle in r.stderr
    assert model.joinpath("model.sig").exists()


def test_verify_accepts_an_ignore_path_that_does_not_exist(tmp_path: Path, key_dir: Path) -> None:
    write_tiny_model(tmp_path / "m")
    r = _run("modelsec", "sign", "m", "--signing-key", key_dir / "ecdsa-p256.key.pem", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _run(
        "modelsec",
        "verify",
        "m",
        "--trusted-key",
        key_dir / "ecdsa-p256.pub.pem",
        "--ignore-paths",
        "m/.cache",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
