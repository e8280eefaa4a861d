"""The gate: accuracies and intervals, rules, configuration errors, and sanity checks that must trip."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from modelsec.errors import GateFailedError, MalformedArtifactError, PolicyError  # noqa: E402
from modelsec.robustness import Dataset, GateConfig, SanityConfig, run_gate, wilson_interval  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

digits_models = h.digits_models

torch.set_num_threads(1)


def _test_set(n: int = 200) -> Dataset:
    _, _, x, y = h.digits()
    return Dataset(x[:n], y[:n], "ab" * 32, "sklearn-digits", "loader")


def _cfg(**kw: object) -> GateConfig:
    base: dict[str, object] = {
        "eps": 0.03,
        "step_size": 0.0075,
        "steps": 10,
        "min_robust_accuracy": 0.5,
        "min_samples": 50,
        "batch_size": 100,
        "sanity": SanityConfig(samples=100),
    }
    base.update(kw)
    return GateConfig(**base)  # type: ignore[arg-type]


def _check(result: object, name: str) -> bool:
    return next(c.passed for c in result.checks if c.name == name)  # type: ignore[attr-defined]


def test_small_cnn_on_digits_at_eps_0_03() -> None:
    """The eps = 0.03 setting of the issue, on a CNN trained in the test on scikit-learn digits."""
    data = _test_set()
    result = run_gate(h.trained_cnn(), data, _cfg(min_robust_accuracy=0.5))
    assert all(c.passed for c in result.checks), [c for c in result.checks if not c.passed]
    assert result.clean.total == result.robust.total == 200
    assert 0.85 <= result.clean.accuracy <= 1.0
    assert 0.0 < result.robust.accuracy <= result.clean.accuracy
    assert result.verdict == "PASSED" and result.passed and not result.reasons
    lo, hi = result.robust.wilson95
    assert (lo, hi) == wilson_interval(result.robust.correct, 200)
    assert lo < result.robust.accuracy < hi
    # The same run against a threshold above its robust accuracy fails, and raises on request.
    high = run_gate(
        h.trained_cnn(),
        data,
        _cfg(min_robust_accuracy=min(1.0, result.robust.accuracy + 0.01), sanity=SanityConfig(enabled=False)),
    )
    assert high.robust == result.robust
    assert high.verdict == "FAILED" and any("below the threshold" in r for r in high.reasons)
    with pytest.raises(GateFailedError, match="FAILED"):
        high.raise_for_verdict()
    result.raise_for_verdict()


def test_strict_rule_uses_the_wilson_lower_bound() -> None:
    data = _test_set(100)
    point = run_gate(
        h.trained_mlp(), data, _cfg(eps=0.0, min_robust_accuracy=0.0, sanity=SanityConfig(enabled=False))
    )
    acc = point.robust.accuracy
    lo = point.robust.wilson95[0]
    between = (acc + lo) / 2
    assert run_gate(
        h.trained_mlp(),
        data,
        _cfg(eps=0.0, min_robust_accuracy=between, rule="point", sanity=SanityConfig(enabled=False)),
    ).passed
    strict = run_gate(
        h.trained_mlp(),
        data,
        _cfg(eps=0.0, min_robust_accuracy=between, rule="strict", sanity=SanityConfig(enabled=False)),
    )
    assert not strict.passed and "Wilson" in strict.reasons[0]
    assert strict.metric == pytest.approx(lo)


def test_too_few_samples_fail() -> None:
    result = run_gate(h.trained_mlp(), _test_set(20), _cfg(min_samples=21, min_robust_accuracy=0.0))
    assert not result.passed and "fewer than the required 21" in result.reasons[0]


def test_restarts_never_raise_robust_accuracy() -> None:
    data = _test_set(100)
    one = run_gate(
        h.trained_mlp(), data, _cfg(eps=0.08, step_size=0.02, restarts=1, sanity=SanityConfig(enabled=False))
    )
    three = run_gate(
        h.trained_mlp(), data, _cfg(eps=0.08, step_size=0.02, restarts=3, sanity=SanityConfig(enabled=False))
    )
    assert three.robust.correct <= one.robust.correct
    assert three.clean == one.clean


def test_result_json_is_complete_and_serialisable() -> None:
    result = run_gate(h.trained_mlp(), _test_set(60), _cfg(min_samples=10, sanity=SanityConfig(samples=30)))
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["attack"] == "pgd-linf"
    assert doc["parameters"] == {
        "norm": "Linf",
        "eps": 0.03,
        "stepSize": 0.0075,
        "steps": 10,
        "restarts": 1,
        "randomStart": True,
        "loss": "cross-entropy",
        "seed": 0,
        "inputRange": [0.0, 1.0],
        "batchSize": 100,
    }
    assert doc["dataset"] == {
        "digest": {"sha256": "ab" * 32},
        "samples": 60,
        "source": "sklearn-digits",
        "format": "loader",
    }
    assert set(doc["results"]) == {"clean", "robust"}
    assert doc["gate"]["rule"] == "point" and doc["gate"]["verdict"] in ("PASSED", "FAILED")
    assert [c["name"] for c in doc["sanity"]["checks"]] == [
        "eval_mode",
        "logits",
        "eps_zero",
        "monotone",
        "large_eps",
        "fgsm_weaker",
        "frozen",
    ]
    env = doc["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["deterministic"] is True
    assert env["dtypes"] == {
        "inputs": "float32",
        "parameters": "float32",
        "compute": "float32",
        "projection": "float32",
    }
    assert env["fastPaths"] == {"channelsLast": False, "bf16Autocast": False, "torchCompile": False}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["finishedAt"])
    assert doc["elapsedSeconds"] >= 0


# --- sanity checks that must trip ---------------------------------------------------------------------------


def test_softmax_outputs_fail_the_logits_check() -> None:
    model = nn.Sequential(h.trained_mlp(), nn.Softmax(dim=1))
    result = run_gate(
        model, _test_set(100), _cfg(min_robust_accuracy=0.0, sanity=SanityConfig(enabled=False))
    )
    assert not _check(result, "logits")
    assert not result.passed and any("probabilities" in r for r in result.reasons)


def test_log_softmax_outputs_are_accepted_as_logits() -> None:
    model = nn.Sequential(h.trained_mlp(), nn.LogSoftmax(dim=1))
    result = run_gate(
        model,
        _test_set(60),
        _cfg(min_robust_accuracy=0.0, min_samples=10, sanity=SanityConfig(enabled=False)),
    )
    assert _check(result, "logits")


class _AlwaysDropout(nn.Module):
    """Dropout hard-wired on (ignores eval mode): the forward is random."""

    def __init__(self) -> None:
        super().__init__()
        self.net = h.trained_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(nn.functional.dropout(x, 0.5, training=True))


def test_dropout_left_on_fails_eval_mode_and_eps_zero() -> None:
    torch.manual_seed(0)
    result = run_gate(
        _AlwaysDropout(), _test_set(100), _cfg(min_robust_accuracy=0.0, sanity=SanityConfig(samples=100))
    )
    assert not _check(result, "eval_mode")
    assert not _check(result, "eps_zero")
    assert not result.passed


class _StubbornTrain(nn.Module):
    """A module whose `train(False)` is ignored: it stays in training mode, with batch-norm updating."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(1)
        self.net = h.trained_mlp()

    def train(self, mode: bool = True) -> _StubbornTrain:
        super().train(True)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(x))


def test_training_mode_and_changing_buffers_fail() -> None:
    result = run_gate(
        _StubbornTrain(),
        _test_set(60),
        _cfg(min_robust_accuracy=0.0, min_samples=10, sanity=SanityConfig(enabled=False)),
    )
    assert not _check(result, "eval_mode")
    assert not _check(result, "frozen")
    assert not result.passed


class _Quantised(nn.Module):
    """Input quantisation with a zero gradient (gradient masking, Athalye et al. 2018 sec. 4.1)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = h.trained_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.round(x * 4) / 4)  # round() has a zero gradient everywhere


def test_gradient_masking_is_caught_by_the_large_eps_check() -> None:
    result = run_gate(
        _Quantised(),
        _test_set(100),
        _cfg(eps=0.05, step_size=0.01, min_robust_accuracy=0.0, sanity=SanityConfig(samples=100)),
    )
    assert not _check(result, "large_eps")
    assert not result.passed and any("large_eps" in r for r in result.reasons)


class _WeakAttackModel(nn.Module):
    """Gradient points the wrong way (a sign flip): PGD walks away from the boundary, FGSM-like luck wins."""

    def __init__(self) -> None:
        super().__init__()
        self.net = h.trained_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flipped = 2 * x.detach() - x  # value x, gradient -1
        return self.net(flipped)


def test_reversed_gradients_trip_sanity_checks() -> None:
    result = run_gate(
        _WeakAttackModel(),
        _test_set(100),
        _cfg(eps=0.15, step_size=0.03, min_robust_accuracy=0.0, sanity=SanityConfig(samples=100)),
    )
    assert not result.passed
    assert not _check(result, "large_eps")


class _WrongOnCleanInputs(nn.Module):
    """Negated logits on the clean 1/16 pixel grid, true logits off it: accuracy *rises* with eps."""

    def __init__(self) -> None:
        super().__init__()
        self.net = h.trained_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        on_grid = ((x * 16 - torch.round(x * 16)).abs().flatten(1).amax(1) < 1e-4)[:, None]
        logits = self.net(x)
        return torch.where(on_grid, -logits, logits)


def test_accuracy_rising_with_eps_fails_the_monotone_check() -> None:
    result = run_gate(
        _WrongOnCleanInputs(),
        _test_set(100),
        _cfg(eps=0.02, step_size=0.001, steps=2, min_robust_accuracy=0.0, sanity=SanityConfig(samples=100)),
    )
    assert not _check(result, "monotone")
    assert not result.passed


def test_an_attack_weaker_than_fgsm_fails() -> None:
    """Two tiny steps cannot leave the random start: FGSM at the full radius is stronger (setup mistake)."""
    result = run_gate(
        h.trained_mlp(),
        _test_set(100),
        _cfg(eps=0.15, step_size=0.001, steps=2, min_robust_accuracy=0.0, sanity=SanityConfig(samples=100)),
    )
    assert not _check(result, "fgsm_weaker")
    assert not result.passed


def test_labels_beyond_the_class_count_are_refused() -> None:
    _, _, x, y = h.digits()
    y = y[:20].clone()
    y[3] = 10
    with pytest.raises(MalformedArtifactError, match="label 10 is out of range"):
        run_gate(h.trained_mlp(), Dataset(x[:20], y, "00" * 32, "bad", "loader"), _cfg())


def test_inputs_that_do_not_fit_the_architecture_are_a_setup_error() -> None:
    data = Dataset(torch.rand(10, 1, 9, 9), torch.zeros(10, dtype=torch.int64), "00" * 32, "9x9", "loader")
    with pytest.raises(PolicyError, match="cannot run on dataset inputs of shape"):
        run_gate(digits_models.digits_mlp(), data, _cfg())


def test_non_classifier_outputs_are_refused() -> None:
    data = _test_set(10)
    with pytest.raises(PolicyError, match=r"\(N, classes\)"):
        run_gate(nn.Flatten(0), data, _cfg())
    with pytest.raises(PolicyError, match="at least 2"):
        run_gate(nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), data, _cfg())


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"eps": -0.1}, "eps must be"),
        ({"eps": float("nan")}, "eps must be"),
        ({"step_size": 0.0}, "step size"),
        ({"steps": 0}, "steps must be"),
        ({"restarts": 0}, "restarts must be"),
        ({"min_robust_accuracy": 1.5}, "threshold"),
        ({"rule": "lenient"}, "rule must be"),
        ({"min_samples": 0}, "min samples"),
        ({"clip": (1.0, 0.0)}, "lo < hi"),
        ({"batch_size": 0}, "batch size"),
        ({"device": "tpu"}, "device must be"),
        ({"sanity": SanityConfig(samples=0)}, "sanity samples"),
    ],
)
def test_invalid_configuration_is_a_policy_error(kw: dict[str, object], match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        _cfg(**kw)


def test_cuda_without_cuda_is_backend_unavailable() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from modelsec.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="CUDA"):
        run_gate(h.trained_mlp(), _test_set(10), _cfg(device="cuda"))


@pytest.mark.gpu
def test_cuda_fast_paths_agree_with_fp32() -> None:
    from modelsec.robustness import FastPaths

    data = _test_set(200)
    base = _cfg(device="cuda", eps=0.03, min_robust_accuracy=0.0)
    ref = run_gate(h.trained_cnn(), data, base)
    fast = run_gate(
        h.trained_cnn(),
        data,
        GateConfig(
            **{
                **{f: getattr(base, f) for f in base.__dataclass_fields__},
                "fast": FastPaths(channels_last=True, bf16_autocast=True, compile=False),
            }
        ),
    )
    assert fast.environment["fastPaths"] == {
        "channelsLast": True,
        "bf16Autocast": True,
        "torchCompile": False,
    }
    assert fast.environment["dtypes"]["compute"] == "bfloat16"  # type: ignore[index]
    assert fast.clean == ref.clean
    assert abs(fast.robust.accuracy - ref.robust.accuracy) <= 0.03
    assert all(c.passed for c in fast.checks)


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_compile_path() -> None:
    from modelsec.robustness import FastPaths

    cfg = _cfg(device="cuda", fast=FastPaths(channels_last=True, compile=True), min_robust_accuracy=0.0)
    result = run_gate(h.trained_cnn(), _test_set(200), cfg)
    assert result.environment["fastPaths"]["torchCompile"] is True  # type: ignore[index]
    assert all(c.passed for c in result.checks)
