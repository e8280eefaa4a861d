"""Agreement with IBM ART's PGD: robust accuracy within max(1 pp, 3x our seed spread).

ART is installed with `pip install --no-deps adversarial-robustness-toolbox` plus its light runtime
dependencies (numpy, scipy, scikit-learn, six, tqdm); the test skips without it. ART draws its random start
from numpy and batches differently, so only the statistic can agree, not the bits.
"""

from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402

from modelsec.robustness import Dataset, GateConfig, SanityConfig, run_gate  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

EPS, STEP, STEPS = 0.1, 0.025, 10


def _ours(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> float:
    cfg = GateConfig(
        eps=EPS,
        step_size=STEP,
        steps=STEPS,
        seed=seed,
        min_robust_accuracy=0.0,
        min_samples=1,
        batch_size=128,
        sanity=SanityConfig(enabled=False),
    )
    return run_gate(model, Dataset(x, y, "ee" * 32, "digits", "loader"), cfg).robust.accuracy


def _art(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> float:
    evasion = pytest.importorskip("art.attacks.evasion")
    classification = pytest.importorskip("art.estimators.classification")
    classifier = classification.PyTorchClassifier(
        model=model,
        loss=torch.nn.CrossEntropyLoss(),
        input_shape=(1, 8, 8),
        nb_classes=10,
        clip_values=(0.0, 1.0),
        device_type="cpu",
    )
    np.random.seed(seed)
    attack = evasion.ProjectedGradientDescentPyTorch(
        classifier,
        norm=np.inf,
        eps=EPS,
        eps_step=STEP,
        max_iter=STEPS,
        num_random_init=1,
        batch_size=128,
        verbose=False,
    )
    xn, yn = x.numpy(), y.numpy()
    adv = attack.generate(x=xn, y=yn)
    clean_ok = classifier.predict(xn).argmax(1) == yn
    adv_ok = classifier.predict(adv).argmax(1) == yn
    assert float(np.abs(adv - xn).max()) <= EPS + 1e-6
    return float((clean_ok & adv_ok).mean())


@pytest.mark.slow  # 7 attacks on the 397 test digits: fewer digits or seeds widen the tolerance (3 sd)
def test_robust_accuracy_agrees_with_art_pgd() -> None:
    pytest.importorskip(
        "art",
        reason="pip install --no-deps adversarial-robustness-toolbox (+ six, tqdm, scipy, scikit-learn)",
    )
    torch.set_num_threads(1)
    model = h.trained_cnn().requires_grad_(False)
    _, _, x, y = h.digits()
    ours = [_ours(model, x, y, seed) for seed in range(5)]
    art = [_art(model, x, y, seed) for seed in range(2)]
    spread = statistics.stdev(ours)
    tolerance = max(0.01, 3 * spread)
    mean_ours, mean_art = statistics.fmean(ours), statistics.fmean(art)
    print(
        f"ART agreement: ours {mean_ours:.4f} (seeds {ours}, sd {spread:.4f}), ART {mean_art:.4f} ({art}); "
        f"|diff| {abs(mean_ours - mean_art):.4f} <= {tolerance:.4f}"
    )
    assert 0.1 < mean_ours < 0.95, "pick eps so that the comparison is informative"
    assert abs(mean_ours - mean_art) <= tolerance
