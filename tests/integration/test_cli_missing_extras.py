"""Without an optional extra, every command ends in one line naming the extra to install, exit 1 (issue 19).

A bare `pip install .` is simulated in a subprocess: a `sitecustomize` on PYTHONPATH installs a meta-path
finder that raises ModuleNotFoundError for every module an extra installs (torch, numpy, scipy, grpc,
protobuf, prometheus_client, uvicorn, starlette, psycopg), as an interpreter without them would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.signer import generate_private_key_pem

pytestmark = pytest.mark.integration

EXTRA_MODULES = (
    "torch,numpy,scipy,grpc,grpc_health,grpc_reflection,google,prometheus_client,uvicorn,starlette,pkcs11,"
    "psycopg"
)
BLOCKER = """
import importlib.abc, os, sys

_BLOCKED = frozenset(os.environ["MODELSEC_TEST_BLOCKED_MODULES"].split(","))


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Blocker())
"""


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a model, keys, configs, and the import blocker; commands run from there."""
    from tests.conftest import write_tiny_model

    root = tmp_path_factory.mktemp("bare")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(BLOCKER)
    write_tiny_model(root / "model")
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (root / "ci.key.pem").write_bytes(private)
    (root / "ci.pub.pem").write_bytes(public)
    (root / "server.yaml").write_text("{}\n")
    (root / "gate.yaml").write_text(
        "architecture: pkg.mod:factory\ndata: data.npz\neps: 0.03\nminRobustAccuracy: 0.5\n"
        "stepSize: 0.01\nsteps: 2\n"
    )
    r = run_bare(root, "watermark", "keygen", "-o", "wm.key")  # needs no extra
    assert r.returncode == 0, r.stderr
    return root


def run_bare(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_")}
    env["PYTHONPATH"] = str(root / "site")
    env["MODELSEC_TEST_BLOCKED_MODULES"] = EXTRA_MODULES
    return subprocess.run(
        [exe, *args], cwd=root, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env
    )


SERVER = ["--server", "localhost:1", "--plaintext"]
CASES = {
    "sign --server": (["sign", "model", *SERVER, "--key-version", "ci/1"], "grpc"),
    "serve": (["serve", "--config", "server.yaml"], "grpc"),
    "sign": (["sign", "model", "--signing-key", "pkcs11:object=ci?module-path=/x.so&pin-source=env:PIN"],
    "pkcs11"),
    "attest pull": (["attest", "pull", "ab" * 32, *SERVER], "grpc"),
    "attest push": (["attest", "push", "ci.pub.pem", *SERVER], "grpc"),
    "attest put": (
        ["attest", "put", "--store", "postgresql://modelsec@127.0.0.1:1/db", "ci.pub.pem"],
        "postgres",
    ),
    "webhook serve": (
        ["webhook", "serve", "--policy", "gate.yaml", "--store", "st", "--tls-cert", "c.pem",
            "--tls-key", "k.pem"],
        "webhook",
    ),
    "watermark embed": (
        ["watermark", "embed", "model", "--watermark-key", "wm.key", "-m", "hi", "-o", "marked"],
        "watermark",
    ),
    "watermark detect": (["watermark", "detect", "model", "--watermark-key", "wm.key", "-m", "hi"],
    "watermark"),
    "gate pgd": (
        [
            "gate",
            "pgd",
            "model",
            "--arch",
            "pkg.mod:factory",
            "--data",
            "data.npz",
            "--eps",
            "0.03",
            "--min-robust-accuracy",
            "0.5",
            "--signing-key",
            "ci.key.pem",
            "--trusted-key",
            "ci.pub.pem",
            "-o",
            "gate.sig",
        ],
        "torch",
    ),
    "release": (
        [
            "release",
            "model",
            "-o",
            "released",
            "--signing-key",
            "ci.key.pem",
            "--watermark-key",
            "wm.key",
            "-m",
            "hi",
            "--gate-config",
            "gate.yaml",
        ],
        "watermark",
    ),
}


def test_blocker_leaves_the_base_commands_working(bare: Path) -> None:
    r = run_bare(bare, "sign", "model", "-q", "--signing-key", "ci.key.pem", "--signature", "base.sig")
    assert r.returncode == 0, r.stderr
    r = run_bare(bare, "verify", "model", "-q", "--trusted-key", "ci.pub.pem", "--signature", "base.sig")
    assert r.returncode == 0, r.stderr
    # And the blocker does block: the extras' modules cannot be imported in that interpreter.
    probe = subprocess.run(
        [sys.executable, "-c", "import numpy"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(bare / "site"), "MODELSEC_TEST_BLOCKED_MODULES": EXTRA_MODULES},
    )
    assert probe.returncode == 1 and "No module named 'numpy'" in probe.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_missing_extra_is_one_line_exit_1(bare: Path, case: str) -> None:
    args, extra = CASES[case]
    r = run_bare(bare, *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"modelsec: error: modelsec {case.removesuffix(' --server')} needs ")
    assert lines[0].endswith(f"pip install 'modelsec[{extra}]'")
    assert not (bare / "released").exists() and not (bare / "marked").exists()


def test_missing_extra_under_json(bare: Path) -> None:
    r = run_bare(bare, "watermark", "detect", "model", "--watermark-key", "wm.key", "-m", "hi", "--json")
    assert r.returncode == 1 and r.stderr == ""
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["error"]["kind"] == "MissingExtraError"
    assert out["error"]["extra"] == "watermark" and "modelsec[watermark]" in out["error"]["message"]


def test_missing_extra_mapping() -> None:
    from modelsec.lazy import missing_extra

    assert missing_extra("google.protobuf", "sign") == "grpc"
    assert missing_extra("numpy", "gate") == "torch"
    assert missing_extra("numpy", "watermark") == "watermark"
    assert missing_extra("prometheus_client", "webhook") == "webhook"
    assert missing_extra("prometheus_client", "serve") == "grpc"
    assert missing_extra("cryptography", "sign") is None  # a base dependency: a broken install, not an extra
