"""`modelsec sign --server`, `modelsec attest push|pull` against a real server on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.policy import Policy
from modelsec.verifier import verify_attestations
from tests.conftest import run_cli, write_tiny_model
from tests.support.service import InThreadServer

pytestmark = pytest.mark.integration
MS = shutil.which("model_signing", path=str(Path(sys.executable).parent))


@pytest.mark.slow
def test_remote_signing_is_verified_like_local_signing(
    tmp_path: Path, grpc_server: InThreadServer, key_dir: Path
) -> None:
    remote = write_tiny_model(tmp_path / "remote" / "model")  # same name: the subject names the directory
    local = write_tiny_model(tmp_path / "local" / "model")
    r = run_cli(
        "sign", remote, "--server", grpc_server.target, "--plaintext", "--key-version", "ci-p256/1",
        "--key-version", "ci-sm2/1", "--pin-key", key_dir / "ecdsa-p256.pub.pem",
        "--pin-key", key_dir / "sm2.pub.pem", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    signed = json.loads(r.stdout)
    assert [b["algorithm"] for b in signed["bundles"]] == ["ecdsa-p256", "sm2"]
    r = run_cli(
        "sign", local, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--signing-key",
        key_dir / "sm2.key.pem", "--json"
    )
    assert json.loads(r.stdout)["rootDigest"] == signed["rootDigest"]
    for model in (remote, local):
        r = run_cli(
            "verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key",
            key_dir / "sm2.pub.pem",
            "--require", "ecdsa-p256,sm2", "--json",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["rootDigest"] == signed["rootDigest"]
    # Same statement bytes; only the (randomised) signatures differ.
    for name in ("model.sig", "model.sm2.sig"):
        remote_doc = json.loads((remote / name).read_text())
        local_doc = json.loads((local / name).read_text())
        assert remote_doc["dsseEnvelope"]["payload"] == local_doc["dsseEnvelope"]["payload"]
        assert remote_doc["verificationMaterial"] == local_doc["verificationMaterial"]
    if MS is not None:  # model_signing (installed by the test extra) accepts the remote ECDSA bundle
        ms = [MS, "verify", "key", str(remote), "--signature", str(remote / "model.sig")]
        result = subprocess.run(
            [*ms, "--public_key", str(key_dir / "ecdsa-p256.pub.pem")], capture_output=True, text=True
        )
        assert result.returncode == 0 and "Verification succeeded" in result.stdout, result.stderr
        result = subprocess.run(
            [*ms, "--public_key", str(key_dir / "other.pub.pem")], capture_output=True, text=True
        )
        assert result.returncode != 0


def test_pinning_a_different_key_refuses_to_sign(
    tmp_path: Path, grpc_server: InThreadServer, key_dir: Path
) -> None:
    model = write_tiny_model(tmp_path / "m")
    r = run_cli(
        "sign", model, "--server", grpc_server.target, "--plaintext", "--key-version", "ci-p256/1",
        "--pin-key", key_dir / "other.pub.pem",
    )  # fmt: skip
    assert r.returncode == 1 and "is not the pinned public key" in r.stderr, r.stderr
    assert not (model / "model.sig").exists()


def test_a_bad_pin_key_is_refused_before_any_server_call(tmp_path: Path, key_dir: Path) -> None:
    """The pin is read like every key file (a FIFO never blocks) and must be a public key; the server
    address is unreachable, so reaching it would fail with BackendUnavailableError instead."""
    import os

    model = write_tiny_model(tmp_path / "m")
    os.mkfifo(tmp_path / "pin.fifo")  # no writer: the old read_bytes() hung here
    cases = [
        (tmp_path / "pin.fifo", "not a regular file (a FIFO or pipe)"),
        (key_dir / "ecdsa-p256.key.pem", "is a private key"),
        (tmp_path / "missing.pem", "cannot read the pinned public key file"),
    ]
    for pin, message in cases:
        r = run_cli(
            "sign", model, "--server", "127.0.0.1:1", "--plaintext", "--key-version", "ci-p256/1",
            "--pin-key", pin, "--json",
        )  # fmt: skip
        assert r.returncode == 1, r.stderr
        error = json.loads(r.stdout)["error"]
        assert error["kind"] == "KeyMaterialError" and message in error["message"], error
        assert not (model / "model.sig").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key-version", "ci-p256/1"], "--key-version needs --server"),
        ([], "give --signing-key, or --server with --key-version"),
        (
            ["--server", "x:1", "--key-version", "a/1", "--pin-key", "p", "--pin-key", "q"],
            "one --pin-key per",
        ),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = run_cli("sign", write_tiny_model(tmp_path / "m"), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_unknown_key_version_and_unreachable_server(tmp_path: Path, grpc_server: InThreadServer) -> None:
    model = write_tiny_model(tmp_path / "m")
    r = run_cli("sign", model, "--server", grpc_server.target, "--plaintext", "--key-version", "nope/1")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and "'nope/1' does not exist" in r.stderr
    r = run_cli(
        "sign", model, "--server", "127.0.0.1:1", "--plaintext", "--key-version", "ci-p256/1", "--json"
    )
    assert r.returncode == 1
    assert json.loads(r.stdout)["error"]["kind"] == "BackendUnavailableError"


def test_attest_push_and_pull(tmp_path: Path, grpc_server: InThreadServer, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m", seed=31)  # a model of its own: the server's store is shared
    r = run_cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json")
    digest = json.loads(r.stdout)["rootDigest"].removeprefix("sha256:")
    r = run_cli("attest", "push", model / "model.sig", "--server", grpc_server.target, "--plaintext")
    assert r.returncode == 0 and r.stdout.startswith("stored "), r.stderr
    r = run_cli(
        "attest", "push", model / "model.sig", "--server", grpc_server.target, "--plaintext", "--json"
    )
    assert json.loads(r.stdout)["stored"][0]["created"] is False
    run_cli("sign", model, "--signing-key", key_dir / "other.key.pem", "--signature",
        tmp_path / "untrusted.sig")
    r = run_cli("attest", "push", tmp_path / "untrusted.sig", "--server", grpc_server.target, "--plaintext")
    assert r.returncode == 1 and "untrusted.sig" in r.stderr and "not stored" in r.stderr, r.stderr
    out = tmp_path / "pulled"
    r = run_cli(
        "attest", "pull", f"sha256:{digest}", "--server", grpc_server.target, "--plaintext",
        "--out", out, "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["bundles"]
    pulled = Path(row["path"])
    assert (
        pulled.parent == out / "sha256" / digest and pulled.read_bytes() == (model / "model.sig").read_bytes()
    )
    assert verify_attestations(digest, [pulled], Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])).ok
    r = run_cli("attest", "pull", "0" * 64, "--server", grpc_server.target, "--plaintext")
    assert r.returncode == 0 and "no stored bundles" in r.stderr
    r = run_cli("attest", "pull", "xyz", "--server", grpc_server.target, "--plaintext")
    assert r.returncode == 2 and "'xyz' is not a model root digest [sha256:]<64 hex>" in r.stderr  # usage
