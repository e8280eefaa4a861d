"""`modelsec verify --expected-digest` / `$MODELSEC_MODEL_DIGEST`: an older signed release is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration


@pytest.fixture
def rolled_back(tiny_model: Path, key_dir: Path, tmp_path: Path) -> tuple[Path, str, str]:
    """A model put back to its old signed release after a newer one was signed: (model, old, new digest)."""
    key = key_dir / "ecdsa-p256.key.pem"
    assert run_cli("sign", tiny_model, "--signing-key", key, "-q").returncode == 0
    old = json.loads(run_cli("digest", tiny_model, "--json").stdout)["rootDigest"]
    shutil.copy(tiny_model / "model.sig", tmp_path / "old.sig")
    shutil.copy(tiny_model / "config.json", tmp_path / "old.json")
    (tiny_model / "config.json").write_text('{"hidden": 999}')
    assert run_cli("sign", tiny_model, "--signing-key", key, "-q", "--force").returncode == 0
    new = run_cli("digest", tiny_model).stdout.strip()
    shutil.copy(tmp_path / "old.sig", tiny_model / "model.sig")
    shutil.copy(tmp_path / "old.json", tiny_model / "config.json")
    assert old != new
    return tiny_model, old, new


def test_rollback_verifies_without_a_pin(rolled_back: tuple[Path, str, str], key_dir: Path) -> None:
    model, _, _ = rolled_back
    assert run_cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem").returncode == 0


def test_expected_digest_refuses_the_rollback(rolled_back: tuple[Path, str, str], key_dir: Path) -> None:
    model, old, new = rolled_back
    pub = key_dir / "ecdsa-p256.pub.pem"
    r = run_cli("verify", model, "--trusted-key", pub, "--expected-digest", new, "--json")
    assert r.returncode == 1
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "DigestMismatchError"
    assert new in error["message"] and old in error["message"]
    r = run_cli("verify", model, "--trusted-key", pub, "--expected-digest", new, "--expected-digest", old)
    assert r.returncode == 0, r.stderr
    r = run_cli("verify", model, "--trusted-key", pub, "--expected-digest", old, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["rootDigest"] == old


def test_model_digest_env_pins_as_the_guard_does(rolled_back: tuple[Path, str, str], key_dir: Path) -> None:
    model, old, new = rolled_back
    pub = key_dir / "ecdsa-p256.pub.pem"
    r = run_cli("verify", model, "--trusted-key", pub, env={"MODELSEC_MODEL_DIGEST": new})
    assert r.returncode == 1 and "pinned" in r.stderr and new in r.stderr, r.stderr
    annotation = f"file://{model.resolve()}@{old},oci://reg/other@{new}"
    r = run_cli("verify", model, "--trusted-key", pub, env={"MODELSEC_MODEL_DIGEST": annotation})
    assert r.returncode == 0, r.stderr
    # Both pins apply: the option cannot widen what the environment allows.
    r = run_cli(
        "verify", model, "--trusted-key", pub, "--expected-digest", new, env={"MODELSEC_MODEL_DIGEST": old}
    )
    assert r.returncode == 1 and "in common" in r.stderr


@pytest.mark.parametrize("bad", ["sha256:zz", "sha256:" + "A" * 64, ""])
def test_malformed_expected_digest_is_refused(tiny_model: Path, key_dir: Path, bad: str) -> None:
    assert run_cli("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    r = run_cli(
        "verify", tiny_model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--expected-digest", bad
    )
    # A malformed pin is the command line's mistake: a usage error (exit 2) naming the option.
    assert r.returncode == 2 and "expected model digest" in r.stderr and "Traceback" not in r.stderr
    assert "'--expected-digest'" in r.stderr
