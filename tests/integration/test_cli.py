"""The `modelsec` command line as a user runs it: outputs, --json, exit codes, refusals.

The commands run in-process (`run_cli`); one smoke test runs the installed console script itself and checks
that it answers as the in-process runner does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_cli_process

pytestmark = pytest.mark.integration


def test_keygen_sign_verify_digest_round_trip(tiny_model: Path, tmp_path: Path) -> None:
    for alg in ("ecdsa-p256", "sm2"):
        r = run_cli("keygen", "-a", alg, "-o", tmp_path / alg)
        assert r.returncode == 0, r.stderr
        assert oct((tmp_path / f"{alg}.key.pem").stat().st_mode & 0o777) == "0o600"
    r = run_cli(
        "sign", tiny_model, "--signing-key", tmp_path / "ecdsa-p256.key.pem", "--signing-key",
        tmp_path / "sm2.key.pem", "--json"
    )
    assert r.returncode == 0, r.stderr
    signed = json.loads(r.stdout)
    assert {b["algorithm"] for b in signed["bundles"]} == {"ecdsa-p256", "sm2"}
    r = run_cli(
        "verify",
        tiny_model,
        "--trusted-key",
        tmp_path / "ecdsa-p256.pub.pem",
        "--trusted-key",
        tmp_path / "sm2.pub.pem",
        "--require",
        "ecdsa-p256,sm2",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    verified = json.loads(r.stdout)
    assert verified["ok"] and verified["rootDigest"] == signed["rootDigest"]
    assert verified["files"] == 6 and verified["tensors"] == 6
    r = run_cli("digest", tiny_model)
    assert r.returncode == 0 and r.stdout.strip() == signed["rootDigest"]


def test_keygen_refuses_overwrite(tmp_path: Path) -> None:
    assert run_cli("keygen", "-o", tmp_path / "k").returncode == 0
    r = run_cli("keygen", "-o", tmp_path / "k")
    assert r.returncode == 2 and "exists" in r.stderr


def test_keygen_force_keeps_the_private_key_private_and_errors_are_diagnostics(tmp_path: Path) -> None:
    (tmp_path / "k.key.pem").write_text("old")
    (tmp_path / "k.key.pem").chmod(0o644)
    assert run_cli("keygen", "-o", tmp_path / "k", "--force").returncode == 0
    assert (tmp_path / "k.key.pem").stat().st_mode & 0o777 == 0o600
    r = run_cli("keygen", "-o", tmp_path / "missing" / "k")
    assert (
        r.returncode == 1
        and r.stderr.startswith("modelsec: error:")
        and "cannot write the key file" in r.stderr
    )


def test_encrypted_key_via_environment(tiny_model: Path, tmp_path: Path) -> None:
    env = {"MODELSEC_KEY_PASSWORD": "correct horse"}
    for alg in ("ecdsa-p384", "sm2"):
        assert run_cli("keygen", "-a", alg, "-o", tmp_path / alg, "--encrypt", env=env).returncode == 0
        assert b"ENCRYPTED PRIVATE KEY" in (tmp_path / f"{alg}.key.pem").read_bytes()
        r = run_cli("sign", tiny_model, "--signing-key", tmp_path / f"{alg}.key.pem", env=env)
        assert r.returncode == 0, r.stderr
        r = run_cli(
            "sign", tiny_model, "--signing-key", tmp_path / f"{alg}.key.pem",
            env={"MODELSEC_KEY_PASSWORD": "wrong"}
        )
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        ("wrong_key", "signature"),
        ("missing_signature", "no signature bundle.*give --signature"),
        ("malformed_pem", "PEM"),
        ("unsupported_algorithm", "not supported"),
        ("file_outside_signed_model", "no signature bundle.*give --signature"),
        ("empty_dir", "no signature bundle.*give --signature"),
        ("missing_dir", "cannot read"),
        ("private_key_as_trust", "private key"),
    ],
)
def test_clear_refusals(setup: str, match: str, tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    run_cli("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem")
    target, key = tiny_model, key_dir / "ecdsa-p256.pub.pem"
    if setup == "wrong_key":
        key = key_dir / "other.pub.pem"
    elif setup == "missing_signature":
        (tiny_model / "model.sig").unlink()
    elif setup == "malformed_pem":
        key = tmp_path / "bad.pem"
        key.write_text("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n")
    elif setup == "unsupported_algorithm":
        key = tmp_path / "rsa.pem"
        key.write_bytes(
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    elif setup == "file_outside_signed_model":
        target = tmp_path / "stray.txt"
        target.write_text("x")
    elif setup == "empty_dir":
        target = tmp_path / "empty"
        target.mkdir()
    elif setup == "missing_dir":
        target = tmp_path / "nope"
    elif setup == "private_key_as_trust":
        key = key_dir / "ecdsa-p256.key.pem"
    r = run_cli("verify", target, "--trusted-key", key)
    assert r.returncode == 1, r.stdout
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelsec: error:"), r.stderr
    import re

    assert re.search(match, lines[0]), lines[0]
    r = run_cli("verify", target, "--trusted-key", key, "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["error"]["kind"].endswith("Error")


def test_a_fifo_policy_is_refused_at_once(tiny_model: Path, tmp_path: Path) -> None:
    """User trial finding 4: `verify --policy FIFO` blocked in open() until killed."""
    import os

    fifo = tmp_path / "fifo.sig"
    os.mkfifo(fifo)
    r = run_cli("verify", tiny_model, "--policy", fifo)
    assert r.returncode == 1, r.stdout
    assert r.stderr.splitlines() == [
        f"modelsec: error: {fifo}: the policy file is not a regular file (a FIFO or pipe)"
    ]


def test_usage_errors_exit_2(tiny_model: Path, key_dir: Path) -> None:
    assert run_cli("verify", tiny_model).returncode == 2  # --key missing
    assert (
        run_cli("verify", tiny_model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--require",
            "rsa").returncode
        == 2
    )
    assert run_cli("keygen", "-a", "ed25519", "-o", "x").returncode == 2
    assert run_cli("frobnicate").returncode == 2


def test_help_explains() -> None:
    r = run_cli("verify", "--help")
    assert r.returncode == 0
    for word in ("--trusted-key", "--signature", "--require", "--json", "Exit 0", "Pickle"):
        assert word in r.stdout, word
    assert run_cli("--version").stdout.startswith("modelsec, version ")


def test_tamper_then_refuse(tiny_model: Path, key_dir: Path) -> None:
    assert run_cli("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    shard = tiny_model / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = run_cli("verify", tiny_model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem")
    assert r.returncode == 1
    assert "model-00001-of-00002.safetensors" in r.stderr and "expected" in r.stderr


def test_sign_json_reports_the_bundles_own_hint_for_ml_dsa(tiny_model: Path, key_dir: Path) -> None:
    r = run_cli("sign", tiny_model, "--signing-key", key_dir / "ml-dsa-65.key.pem", "--json")
    assert r.returncode == 0, r.stderr
    (reported,) = json.loads(r.stdout)["bundles"]
    hint = json.loads((tiny_model / "model.ml-dsa-65.sig").read_bytes())["verificationMaterial"]["publicKey"][
        "hint"
    ]
    assert hint.startswith("ML_DSA_65:") and reported["keyid"] == hint


@pytest.mark.slow
def test_the_console_script_answers_as_the_in_process_runner(tiny_model: Path, key_dir: Path) -> None:
    """Smoke test of the real process: its exit codes 0, 1 and 2 and its outputs are the in-process ones."""
    assert run_cli("sign", tiny_model, "-q", "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    commands = [
        ("--version",),  # 0
        ("verify", tiny_model, "-q", "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json"),  # 0
        ("verify", tiny_model, "-q", "--trusted-key", key_dir / "other.pub.pem"),  # 1: one line on stderr
        ("verify", tiny_model, "--no-such-option"),  # 2: click's usage error
        ("verify", tiny_model, "--no-such-option", "--json"),  # 2: the JSON reply
    ]
    codes = []
    for args in commands:
        real, here = run_cli_process(*args), run_cli(*args)
        assert (real.returncode, real.stdout, real.stderr) == (here.returncode, here.stdout, here.stderr)
        codes.append(real.returncode)
    assert codes == [0, 0, 1, 2, 2]


def test_the_in_process_runner_gives_the_process_state_back(tmp_path: Path) -> None:
    """What a call sets (environment, directory, logging) does not outlive it, and exit codes are click's."""
    import logging
    import os

    before = (dict(os.environ), os.getcwd(), list(logging.getLogger("modelsec.audit").handlers))
    r = run_cli("keygen", "-o", "ci", "--encrypt", env={"MODELSEC_KEY_PASSWORD": "pw"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ci.key.pem").is_file()
    assert (dict(os.environ), os.getcwd(), list(logging.getLogger("modelsec.audit").handlers)) == before
    r = run_cli("keygen", "-o", tmp_path / "ci")  # exists: click's usage error
    assert r.returncode == 2 and "--force" in r.stderr and r.stdout == ""
