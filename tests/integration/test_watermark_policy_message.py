"""`modelsec watermark embed -m X` then `modelsec verify --policy`: the policy's `message` must be X.

As an operator runs it: keygen, embed with a signed attestation, sign the marked weights, verify with a policy
file whose `attestations.watermark` names the key file and the release's message.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.unit.watermark._helpers import save_state
from tests.unit.watermark.conftest import mlp_state

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Path:
    """A marked model (message `release-2`) with its weights signature and `model.watermark.sig`, made once
    (the tests only read it); `wm.key` lies beside it, where each test writes its policy file."""
    tmp_path = tmp_path_factory.mktemp("released")
    model = save_state(mlp_state(), tmp_path / "model")
    assert run_cli("watermark", "keygen", "-o", tmp_path / "wm.key").returncode == 0
    marked, att = tmp_path / "marked", tmp_path / "wm.sig"
    r = run_cli(
        "watermark",
        "embed",
        model,
        "--watermark-key",
        tmp_path / "wm.key",
        "-m",
        "release-2",
        "--out",
        marked,
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--attestation",
        att,
    )
    assert r.returncode == 0, r.stderr
    r = run_cli("sign", marked, "--signing-key", key_dir / "ecdsa-p256.key.pem")
    assert r.returncode == 0, r.stderr
    shutil.copyfile(att, marked / "model.watermark.sig")
    return marked


def _policy(name: str, model: Path, key_dir: Path, watermark: str) -> Path:
    """A policy file beside `model` (so that `keyFile: wm.key` names the released key), one per test."""
    path = model.parent / f"policy-{name}.yaml"
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n  - name: prod\n"
        f"    match: ['file://{model.resolve()}']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
        f"    attestations:\n      watermark: {watermark}\n"
    )
    return path


@pytest.mark.parametrize(
    ("watermark", "ok"),
    [
        ("{keyFile: wm.key}", True),  # no message required: any message of the key passes
        ("{keyFile: wm.key, message: release-2}", True),
        ("{keyFile: wm.key, message: 'hex:72656c656173652d32'}", True),  # embed -m's hex form of release-2
        ("{keyFile: wm.key, message: release-1}", False),
    ],
)
def test_verify_requires_the_embedded_message(
    released: Path, tmp_path: Path, key_dir: Path, watermark: str, ok: bool
) -> None:
    policy = _policy(tmp_path.name, released, key_dir, watermark)
    r = run_cli("verify", released, "--policy", policy)
    if ok:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        assert "no watermark attestation" in r.stderr
        assert "attestations.watermark.message" in r.stderr


def test_message_without_key_file_is_a_policy_error(released: Path, tmp_path: Path, key_dir: Path) -> None:
    policy = _policy(tmp_path.name, released, key_dir, "{message: release-2}")
    r = run_cli("verify", released, "--policy", policy)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "attestations.watermark: message needs keyFile" in r.stderr
