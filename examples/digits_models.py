"""Small classifiers for scikit-learn's 8x8 `load_digits` (inputs (N, 1, 8, 8) float in [0, 1], 10 logits).

Architecture factories for `modelsec gate pgd --arch digits_models:digits_cnn` (this folder on PYTHONPATH);
the tests train them in a second and gate them at eps = 0.03.
"""

from __future__ import annotations

from torch import nn


def digits_mlp() -> nn.Module:
    """64-64-10 MLP: `0` Flatten, `1` Linear(64, 64), `2` ReLU, `3` Linear(64, 10)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def digits_cnn() -> nn.Module:
    """Two 3x3 convolutions (16, 32 channels), a 2x2 max-pool and a linear layer to 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


def digits_softmax_mlp() -> nn.Module:
    """The MLP with a softmax on top: returns probabilities, which the gate must refuse (sanity check)."""
    return nn.Sequential(digits_mlp(), nn.Softmax(dim=1))
