"""`modelsec gate pgd` in-process (click's runner): each refusal maps to exit 1 and a specific error kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from modelsec.cli.main import main  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("cli-gate")
    return h.signed_model_dir(
        root / "digits-cnn", h.trained_cnn().state_dict(), key_dir / "ecdsa-p256.key.pem"
    )


def _args(model: Path, data: Path, key_dir: Path, out: Path) -> list[str]:
    return [
        "gate",
        "pgd",
        str(model),
        "--arch",
        "digits_models:digits_cnn",
        "--data",
        str(data),
        "--eps",
        "0.03",
        "--steps",
        "3",
        "--min-robust-accuracy",
        "0.5",
        "--min-samples",
        "5",
        "--sanity-samples",
        "10",
        "--signing-key",
        str(key_dir / "ecdsa-p256.key.pem"),
        "--trusted-key",
        str(key_dir / "ecdsa-p256.pub.pem"),
        "--out",
        str(out),
    ]


def _replace(args: list[str], option: str, value: str) -> list[str]:
    i = args.index(option)
    return [*args[: i + 1], value, *args[i + 2 :]]


def _run(
    model: Path, data: Path, key_dir: Path, out: Path, *extra: str
) -> tuple[int, dict[str, object], str]:
    result = CliRunner().invoke(main, [*_args(model, data, key_dir, out), *extra])
    doc = json.loads(result.stdout) if "--json" in extra and result.stdout.strip() else {}
    return result.exit_code, doc, result.output


@pytest.mark.parametrize(
    "case,kind,message",
    [
        ("no-labels", "MalformedArtifactError", "lacks the tensor(s) labels"),
        ("bad-label", "MalformedArtifactError", "label 12 is out of range"),
        ("float-labels", "MalformedArtifactError", "integer class indices"),
        ("out-of-range", "MalformedArtifactError", "outside the valid range"),
        ("wrong-shape", "PolicyError", "cannot run on dataset inputs of shape"),
        ("untrusted", "UntrustedSignerError", "no trusted key"),
        ("bad-arch", "PolicyError", "does not match the verified weights"),
        ("missing-key", "KeyMaterialError", "cannot read the key file"),
        ("bad-eps", "UsageError", "Invalid value for '--eps': -1.0 is not in the range x>=0"),
    ],
)
def test_refusals_name_a_specific_error(
    model: Path, key_dir: Path, tmp_path: Path, case: str, kind: str, message: str
) -> None:
    _, _, x, y = h.digits()
    xs, ys = x[:10].numpy(), y[:10].numpy()
    data = tmp_path / "d.npz"
    arrays = {"inputs": xs, "labels": ys}
    extra: list[str] = ["--json"]
    if case == "no-labels":
        del arrays["labels"]
    elif case == "bad-label":
        arrays["labels"] = np.where(np.arange(10) == 4, 12, ys)
    elif case == "float-labels":
        arrays["labels"] = ys.astype(np.float32)
    elif case == "out-of-range":
        arrays["inputs"] = xs * 255
    elif case == "wrong-shape":
        arrays["inputs"] = np.zeros((10, 1, 7, 7), dtype=np.float32)
    elif case == "bad-eps":
        extra += ["--eps", "-1"]
    np.savez(data, **arrays)
    out = tmp_path / "o.sig"
    args = _args(model, data, key_dir, out)
    if case == "untrusted":
        args = _replace(args, "--trusted-key", str(key_dir / "other.pub.pem"))
    elif case == "bad-arch":
        args = _replace(args, "--arch", "digits_models:digits_mlp")
    elif case == "missing-key":
        args = _replace(args, "--signing-key", str(tmp_path / "absent.pem"))
    result = CliRunner().invoke(main, [*args, *extra])
    code, doc, output = result.exit_code, json.loads(result.stdout), result.output
    assert code == (2 if kind == "UsageError" else 1), output  # a value wrong by itself is a usage error
    error = doc["error"]
    assert doc["ok"] is False and error["kind"] == kind and message in error["message"]  # type: ignore[index]
    assert not out.exists()


def test_human_output_and_exit_codes(model: Path, key_dir: Path, tmp_path: Path) -> None:
    _, _, x, y = h.digits()
    data = tmp_path / "d.npz"
    np.savez(data, inputs=x[:20].numpy(), labels=y[:20].numpy())
    code, _, output = _run(model, data, key_dir, tmp_path / "ok.sig", "--quiet")
    assert code == 0, output
    assert output.startswith("PASSED: robust accuracy") and "[ok] frozen" in output
    assert (tmp_path / "ok.sig").exists()
    code, _, output = _run(model, data, key_dir, tmp_path / "no.sig", "--min-samples", "21")
    assert code == 1 and "fewer than the required 21" in output
