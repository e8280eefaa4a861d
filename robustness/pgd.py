"""Projected gradient descent under an L-infinity bound (Madry et al. 2018), and FGSM.

Sources: A. Madry, A. Makelov, L. Schmidt, D. Tsipras, A. Vladu, "Towards Deep Learning Models Resistant to
Adversarial Attacks", ICLR 2018 (PGD with a uniform random start and sign-gradient steps); I. Goodfellow,
J. Shlens, C. Szegedy, "Explaining and Harnessing Adversarial Examples", ICLR 2015 (FGSM).

The attack is untargeted: it ascends the mean cross-entropy of the model's logits for the true labels. On
CPU, with the same model, batch and random generator state, `pgd_attack` returns tensors bit-identical to
`torchattacks.PGD` 3.5.1 (`random_start=True`): the same random draw
(`torch.empty_like(x).uniform_(-eps, eps)`), the same clamp order after the start
(`clamp(x + u, lo, hi)`) and after each step (`x' = x_adv + alpha * sign(g)`, then
`clamp(x + clamp(x' - x, -eps, eps), lo, hi)`), the same mean-reduced loss. The test suite checks this bit
for bit.

What is *not* done here: the model is not put into eval mode and its parameters are not frozen (the gate
does that once, `modelsec.robustness.gate`); the inputs are not range-checked (the dataset loader does).
Inputs must be in the model's native range; any normalisation lives inside the model.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["FastPaths", "Forward", "batch_seed", "fgsm_attack", "make_generator", "pgd_attack"]

Forward = Callable[[torch.Tensor], torch.Tensor]
"""A model forward: inputs (N, ...) float32 -> logits (N, classes)."""


@dataclass(frozen=True, slots=True)
class FastPaths:
    """Speed-ups that keep the attack correct but not bit-identical; each is switchable and reported.

    All are off by default (the CPU reference path). On CUDA the CLI turns on `channels_last`.

    Attributes:
        channels_last: Convert the model and 4-D inputs to `torch.channels_last` (NHWC) memory format, which
            lets cuDNN pick tensor-core convolution kernels. Values are unchanged up to kernel rounding.
        bf16_autocast: Run the forward and backward passes under `torch.autocast(dtype=torch.bfloat16)`.
            The loss is computed from fp32-cast logits, the gradient arrives in fp32 (the adversarial input
            is an fp32 leaf), and the step, the projection and the final accuracy count stay fp32.
        compile: Use `torch.compile(model)` for the forward (and its AOT-autograd backward).
    """

    channels_last: bool = False
    bf16_autocast: bool = False
    compile: bool = False

    def to_json(self) -> dict[str, bool]:
        """`{"channelsLast", "bf16Autocast", "torchCompile"}`."""
        return {
            "channelsLast": self.channels_last,
            "bf16Autocast": self.bf16_autocast,
            "torchCompile": self.compile,
        }


def batch_seed(seed: int, batch: int, restart: int) -> int:
    """The random-start seed of one batch and restart, independent of how batches are spread over ranks.

    `int.from_bytes(SHA-256(f"modelsec-pgd:{seed}:{batch}:{restart}")[:8], "big") & (2**63 - 1)`. Deriving
    each batch's seed from its global index (instead of drawing from one stream) makes a data-parallel run
    on any number of processes reproduce the single-process result exactly on CPU.

    Args:
        seed: The user's seed (recorded in the attestation).
        batch: Global batch index (batch `b` holds examples `[b * batch_size, (b + 1) * batch_size)`).
        restart: Restart index, from 0.

    Returns:
        A seed in [0, 2**63).
    """
    digest = hashlib.sha256(f"modelsec-pgd:{seed}:{batch}:{restart}".encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A fresh generator on `device` seeded with `seed`.

    On CPU, `make_generator(cpu, s)` draws the same numbers as the global generator after
    `torch.manual_seed(s)` (both are the same Mersenne Twister), which is how the tests reproduce
    torchattacks' draws.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


@contextlib.contextmanager
def _autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield


def _input_gradient(forward: Forward, x: torch.Tensor, labels: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The gradient of the mean cross-entropy with respect to `x` (fp32, shape of `x`)."""
    x.requires_grad_(True)
    with _autocast(x.device, bf16):
        logits = forward(x)
    loss = F.cross_entropy(logits.float(), labels)
    (grad,) = torch.autograd.grad(loss, x)
    return grad


def pgd_attack(
    forward: Forward,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    eps: float,
    step_size: float,
    steps: int,
    clip: tuple[float, float] = (0.0, 1.0),
    random_start: bool = True,
    generator: torch.Generator | None = None,
    start_noise: torch.Tensor | None = None,
    bf16_autocast: bool = False,
) -> torch.Tensor:
    """Untargeted PGD under an L-infinity bound (Madry et al. 2018), one batch.

    Starts at `clamp(x + u, lo, hi)` with `u ~ U[-eps, eps]` i.i.d. per element, then `steps` times moves by
    `step_size * sign(grad_x CE(f(x_adv), y))` and projects onto the eps-ball around `x` and onto the valid
    range `[lo, hi]`. Guaranteed: every returned element satisfies `|x_adv - x| <= eps` (up to one float32
    rounding of the subtraction) and `lo <= x_adv <= hi`.

    Args:
        forward: The model in eval mode with frozen parameters (or its compiled forward); maps (N, ...)
            float32 inputs to (N, classes) logits, not probabilities.
        inputs: Clean inputs `x`, (N, ...) float32 in `[lo, hi]`, on the model's device.
        labels: True classes, (N,) int64, same device.
        eps: L-infinity radius, in input units (e.g. 0.3 for [0, 1] MNIST pixels); >= 0.
        step_size: Step `alpha` per iteration, input units; > 0.
        steps: Number of gradient steps; >= 0.
        clip: The valid input range `(lo, hi)`.
        random_start: Start from a uniformly random point of the ball (True) or from `x`.
        generator: Generator for the random start (on the inputs' device); None uses torch's global one.
        start_noise: A precomputed `u` of the inputs' shape (overrides `generator`); the gate draws it for a
            whole batch and slices it, so that restarts that attack fewer examples consume the same draws.
        bf16_autocast: Forward and backward under bf16 autocast (`FastPaths.bf16_autocast`).

    Returns:
        The adversarial inputs, detached, same shape, dtype and memory format as `inputs`.
    """
    x = inputs.detach()
    if random_start:
        noise = (
            start_noise
            if start_noise is not None
            else torch.empty_like(x).uniform_(-eps, eps, generator=generator)
        )
        adv = torch.clamp(x + noise, min=clip[0], max=clip[1])
    else:
        adv = x.clone()
    for _ in range(steps):
        grad = _input_gradient(forward, adv, labels, bf16_autocast)
        # torchattacks.PGD's operations in its order, in place: `adv + alpha * sign(g)` (alpha * sign is
        # exact, so the fused multiply-add of `add_(alpha=)` rounds the same), `clamp(adv - x, -eps, eps)`,
        # `clamp(x + delta, lo, hi)` (IEEE addition commutes). Bit-identical on CPU; the graph of this step
        # is already freed, so reusing the leaf's storage is safe.
        adv = adv.detach().add_(grad.sign_(), alpha=step_size)
        adv = adv.sub_(x).clamp_(min=-eps, max=eps).add_(x).clamp_(min=clip[0], max=clip[1])
    return adv


def fgsm_attack(
    forward: Forward,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    eps: float,
    clip: tuple[float, float] = (0.0, 1.0),
    bf16_autocast: bool = False,
) -> torch.Tensor:
    """FGSM (Goodfellow et al. 2015): one signed-gradient step of size `eps` from `x`, clamped to the range.

    Used by the gate's sanity check "FGSM is no stronger than PGD" (Carlini et al. 2019, sec. 5.2): a
    single-step attack beating the iterative one points at a broken attack or at gradient masking.

    Args:
        forward: As for `pgd_attack`.
        inputs: (N, ...) float32 in `[lo, hi]`.
        labels: (N,) int64.
        eps: L-infinity radius, input units.
        clip: The valid input range `(lo, hi)`.
        bf16_autocast: As for `pgd_attack`.

    Returns:
        `clamp(x + eps * sign(grad), lo, hi)`, detached.
    """
    x = inputs.detach()
    grad = _input_gradient(forward, x.clone(), labels, bf16_autocast)
    return torch.clamp(x + eps * grad.sign(), min=clip[0], max=clip[1]).detach()
