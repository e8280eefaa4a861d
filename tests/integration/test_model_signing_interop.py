"""Interop with PyPI `model-signing` 1.1.1 (the OMS reference), both directions, through both CLIs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_tiny_model

pytestmark = pytest.mark.integration
MS = shutil.which("model_signing", path=str(Path(sys.executable).parent))
needs_ms = pytest.mark.skipif(MS is None, reason="model_signing CLI not installed (pip install --group test)")


def _ms(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert MS
    return subprocess.run([MS, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@needs_ms
def test_model_signing_verifies_our_bundle(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    r = run_cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem")
    assert r.returncode == 0, r.stderr
    r = _ms(
        "verify",
        "key",
        model,
        "--signature",
        model / "model.sig",
        "--public_key",
        key_dir / "ecdsa-p256.pub.pem",
    )
    assert r.returncode == 0 and "Verification succeeded" in r.stdout, r.stdout + r.stderr
    # ... and it refuses a tampered shard, so the acceptance above is meaningful.
    shard = model / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    r = _ms(
        "verify",
        "key",
        model,
        "--signature",
        model / "model.sig",
        "--public_key",
        key_dir / "ecdsa-p256.pub.pem",
    )
    assert r.returncode != 0


@needs_ms
def test_we_verify_model_signing_bundle(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    r = _ms(
        "sign",
        "key",
        model,
        "--signature",
        model / "model.sig",
        "--private_key",
        key_dir / "ecdsa-p256.key.pem",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json")
    assert r.returncode == 0, r.stderr
    assert '"tensorDigests": 0' in r.stdout  # plain OMS bundle: whole files verified
    r = run_cli("verify", model, "--trusted-key", key_dir / "other.pub.pem")
    assert r.returncode == 1 and "signature" in r.stderr


@needs_ms
def test_p384_both_directions(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    r = run_cli(
        "sign", model, "--signing-key", key_dir / "ecdsa-p384.key.pem", "--signature", tmp_path / "p384.sig"
    )
    assert r.returncode == 0, r.stderr
    r = _ms(
        "verify",
        "key",
        model,
        "--signature",
        tmp_path / "p384.sig",
        "--public_key",
        key_dir / "ecdsa-p384.pub.pem",
        "--ignore-paths",
        tmp_path / "p384.sig",
    )
    assert r.returncode == 0, r.stdout + r.stderr
