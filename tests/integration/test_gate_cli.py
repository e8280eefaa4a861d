"""`modelsec gate pgd` end to end, in-process: verdicts and exit codes, the attestation on disk, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from click.testing import CliRunner, Result  # noqa: E402

from modelsec.attestations import parse_bundle, parse_statement  # noqa: E402
from modelsec.cli.main import main  # noqa: E402
from modelsec.limits import Limits  # noqa: E402
from modelsec.policy import Policy  # noqa: E402
from modelsec.robustness import PREDICATE_TYPE  # noqa: E402
from modelsec.verifier import read_bundle, verify_bundle_signature, verify_model  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

pytestmark = pytest.mark.integration
torch.set_num_threads(1)


def gate_cli(*args: str | Path) -> Result:
    """`modelsec gate pgd ARGS` in-process; examples/ (the factories) is on sys.path through `_helpers`."""
    return CliRunner().invoke(main, ["gate", "pgd", *map(str, args)])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate-cli")
    model = h.signed_model_dir(
        root / "digits-cnn", h.trained_cnn().state_dict(), key_dir / "ecdsa-p256.key.pem"
    )
    _, _, x, y = h.digits()
    data = root / "digits.npz"
    np.savez(data, inputs=x[:120].numpy(), labels=y[:120].numpy())
    return {"root": root, "model": model, "data": data}


def _args(s: dict[str, Path], key_dir: Path, out: Path, *extra: str | Path) -> list[str | Path]:
    return [
        s["model"],
        "--arch",
        "digits_models:digits_cnn",
        "--data",
        s["data"],
        "--eps",
        "0.03",
        "--step-size",
        "0.0075",
        "--steps",
        "10",
        "--min-samples",
        "100",
        "--sanity-samples",
        "60",
        "--batch-size",
        "64",
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--trusted-key",
        key_dir / "ecdsa-p256.pub.pem",
        "--out",
        out,
        *extra,
    ]


def test_pass_writes_a_verifiable_attestation(setup: dict[str, Path], key_dir: Path) -> None:
    out = setup["root"] / "pass.sig"
    r = gate_cli(*_args(setup, key_dir, out, "--min-robust-accuracy", "0.5", "--json"))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["verdict"] == "PASSED" and doc["attestation"] == str(out)
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    root = verify_model(setup["model"], policy).root_digest
    assert doc["rootDigest"] == f"sha256:{root}"
    bundle = read_bundle(out, Limits())
    verify_bundle_signature(bundle, policy.keys, role="gate")
    statement = parse_statement(bundle.envelope.payload, what=str(out), predicate_type=PREDICATE_TYPE)
    assert dict(statement.subjects[0].digest) == {"sha256": root}
    assert statement.predicate["results"] == doc["result"]["results"]
    assert statement.predicate["gate"]["verdict"] == "PASSED"


def test_fail_exits_1_and_still_attests(setup: dict[str, Path], key_dir: Path) -> None:
    out = setup["root"] / "fail.sig"
    r = gate_cli(*_args(setup, key_dir, out, "--min-robust-accuracy", "0.99", "--rule", "strict"))
    assert r.exit_code == 1
    assert r.stdout.startswith("FAILED: robust accuracy")
    assert "[ok] eps_zero" in r.stdout and "below the threshold" in r.stderr
    statement = parse_statement(parse_bundle(out.read_bytes(), source="x").envelope.payload, what="x")
    assert (
        statement.predicate["gate"]["verdict"] == "FAILED" and statement.predicate["gate"]["rule"] == "strict"
    )


def test_tampered_weights_exit_1_without_running_the_gate(
    setup: dict[str, Path], key_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "tampered"
    shutil.copytree(setup["model"], model)
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x40
    weights.write_bytes(bytes(data))
    out = tmp_path / "never.sig"
    args = _args({**setup, "model": model}, key_dir, out, "--min-robust-accuracy", "0.5", "--json")
    r = gate_cli(*args)
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    error = {"kind": "DigestMismatchError", "message": doc["error"]["message"]}
    assert doc == {"ok": False, "command": "gate pgd", "error": error}
    assert "model.safetensors" in doc["error"]["message"]
    assert not out.exists()


def test_usage_errors_exit_2(setup: dict[str, Path], key_dir: Path, tmp_path: Path) -> None:
    r = gate_cli(
        *_args(setup, key_dir, tmp_path / "o.sig", "--min-robust-accuracy", "0.5", "--rule", "lenient")
    )
    assert r.exit_code == 2
    r = gate_cli(setup["model"], "--arch", "x:y")
    assert r.exit_code == 2 and "Missing option" in r.stderr
