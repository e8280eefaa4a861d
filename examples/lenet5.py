"""advertorch's MNIST LeNet5, rebuilt with the same parameter names (architecture factory for the PGD gate).

`import advertorch` fails on current torch, so the gate cannot take its class; this module defines the same
layers under the same parameter names as advertorch's `advertorch/test_utils.py::LeNet5` (so its checkpoints
load with `strict=True`): conv1 32x1x3x3, conv2 64x32x3x3, linear1 200x3136, linear2 10x200; raw [0, 1]
pixels in, logits out. The ReLUs are not in-place (autograd-friendly; the values are the same).

Use: `modelsec gate pgd MODEL_DIR --arch lenet5:lenet5 ...` with this folder on PYTHONPATH.
"""

from __future__ import annotations

import torch
from torch import nn


class LeNet5(nn.Module):
    """MNIST LeNet5 as in advertorch: input (N, 1, 28, 28) float in [0, 1], output (N, 10) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1, stride=1)
        self.relu1 = nn.ReLU()
        self.maxpool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1, stride=1)
        self.relu2 = nn.ReLU()
        self.maxpool2 = nn.MaxPool2d(2)
        self.linear1 = nn.Linear(7 * 7 * 64, 200)
        self.relu3 = nn.ReLU()
        self.linear2 = nn.Linear(200, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.maxpool1(self.relu1(self.conv1(x)))
        out = self.maxpool2(self.relu2(self.conv2(out)))
        out = out.reshape(out.size(0), -1)
        out = self.relu3(self.linear1(out))
        return self.linear2(out)


def lenet5() -> nn.Module:
    """Factory for `--arch lenet5:lenet5` (randomly initialised; the gate loads the verified weights)."""
    return LeNet5()
