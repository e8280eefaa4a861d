"""Keys in CI without a terminal (issue 19): shared and per-key password sources, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery"


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI with no terminal (empty stdin) and no inherited password variable."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("MODELSEC_")}
    return run_cli(*args, env={**unset, **(env or {})})


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelsec: error:"), r.stderr
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr
    return lines[0]


@pytest.fixture
def ci_keys(tmp_path: Path) -> Path:
    """ci-p256 unencrypted, ci-sm2 encrypted: the documented release keys, made without a terminal."""
    assert run("keygen", "-o", tmp_path / "ci-p256").returncode == 0
    r = run(
        "keygen", "-a", "sm2", "-o", tmp_path / "ci-sm2", "--encrypt", env={"MODELSEC_KEY_PASSWORD": PASSWORD}
    )
    assert r.returncode == 0, r.stderr
    assert b"ENCRYPTED PRIVATE KEY" in (tmp_path / "ci-sm2.key.pem").read_bytes()
    assert b"ENCRYPTED" not in (tmp_path / "ci-p256.key.pem").read_bytes()
    return tmp_path


def verify_both(model: Path, keys: Path) -> None:
    r = run(
        "verify", model, "--trusted-key", keys / "ci-p256.pub.pem", "--trusted-key", keys / "ci-sm2.pub.pem",
        "--require", "ecdsa-p256,sm2", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True


def test_shared_password_applies_only_to_encrypted_keys(tiny_model: Path, ci_keys: Path) -> None:
    r = run(
        "sign", tiny_model, "--signing-key", ci_keys / "ci-p256.key.pem", "--signing-key",
        ci_keys / "ci-sm2.key.pem", "-q",
        env={"MODELSEC_KEY_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    verify_both(tiny_model, ci_keys)


@pytest.mark.parametrize("kind", ["env", "file"])
def test_per_key_password_source(tiny_model: Path, ci_keys: Path, kind: str) -> None:
    sm2_key = ci_keys / "ci-sm2.key.pem"
    if kind == "env":
        source, env = "env:SM2_KEY_PASSWORD", {"SM2_KEY_PASSWORD": PASSWORD}
    else:
        (ci_keys / "sm2.pass").write_text(PASSWORD + "\n")  # as `echo` or a mounted secret writes it
        source, env = f"file:{ci_keys / 'sm2.pass'}", {}
    # A shared password that is wrong for this key does not override its own source.
    env["MODELSEC_KEY_PASSWORD"] = "not the sm2 password"
    r = run(
        "sign", tiny_model, "--signing-key", ci_keys / "ci-p256.key.pem", "--signing-key", sm2_key,
        "--key-password", f"{sm2_key}={source}", "-q", env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    verify_both(tiny_model, ci_keys)


def test_wrong_per_key_password_is_one_line(tiny_model: Path, ci_keys: Path) -> None:
    sm2_key = ci_keys / "ci-sm2.key.pem"
    r = run("sign", tiny_model, "--signing-key", sm2_key, "--key-password", f"{sm2_key}=env:P",
        env={"P": "wrong"})
    assert "ci-sm2.key.pem" in one_error_line(r)


def test_encrypted_key_without_password_or_terminal(tiny_model: Path, ci_keys: Path) -> None:
    r = run("sign", tiny_model, "--signing-key", ci_keys / "ci-p256.key.pem", "--signing-key",
        ci_keys / "ci-sm2.key.pem")
    line = one_error_line(r)
    assert str(ci_keys / "ci-sm2.key.pem") in line
    assert "MODELSEC_KEY_PASSWORD" in line and "=env:VAR" in line and "=file:PATH" in line
    assert not (tiny_model / "model.sig").exists()  # nothing signed before every key was loaded


def test_unset_source_variable_and_missing_file(tiny_model: Path, ci_keys: Path) -> None:
    sm2_key = ci_keys / "ci-sm2.key.pem"
    line = one_error_line(run("sign", tiny_model, "--signing-key", sm2_key, "--key-password",
        f"{sm2_key}=env:NOPE"))
    assert "$NOPE is not set" in line
    missing = ci_keys / "missing.pass"
    line = one_error_line(
        run("sign", tiny_model, "--signing-key", sm2_key, "--key-password", f"{sm2_key}=file:{missing}")
    )
    assert str(missing) in line


def test_key_password_misuse(tiny_model: Path, ci_keys: Path) -> None:
    p256 = ci_keys / "ci-p256.key.pem"
    line = one_error_line(
        run("sign", tiny_model, "--signing-key", p256, "--key-password", f"{p256}=env:P", env={"P": "x"})
    )
    assert "not encrypted" in line
    r = run("sign", tiny_model, "--signing-key", p256, "--key-password", f"{ci_keys / 'other.pem'}=env:P")
    assert r.returncode == 2 and "not a private key of this command" in r.stderr
    # A password typed where a source belongs is refused and never echoed.
    r = run("sign", tiny_model, "--signing-key", p256, "--key-password", f"{p256}=hunter2=x")
    assert r.returncode == 2 and "hunter2" not in r.stderr + r.stdout


def test_keygen_encrypt_without_terminal(tmp_path: Path) -> None:
    line = one_error_line(run("keygen", "-a", "sm2", "-o", tmp_path / "k", "--encrypt"))
    assert "MODELSEC_KEY_PASSWORD" in line and "--key-password" in line
    assert not list(tmp_path.iterdir())
    (tmp_path / "pass").write_text(PASSWORD + "\n")
    r = run(
        "keygen",
        "-a",
        "ecdsa-p384",
        "-o",
        tmp_path / "k",
        "--encrypt",
        "--key-password",
        f"file:{tmp_path / 'pass'}",
    )
    assert r.returncode == 0, r.stderr
    from modelsec.signer import load_private_key_file

    assert (
        load_private_key_file(tmp_path / "k.key.pem", password=PASSWORD.encode()).algorithm.value
        == "ecdsa-p384"
    )


def test_public_key_given_to_sign(tiny_model: Path, ci_keys: Path) -> None:
    line = one_error_line(run("sign", tiny_model, "--signing-key", ci_keys / "ci-p256.pub.pem"))
    assert "is a public key" in line
