"""The PGD L-infinity release gate: clean and robust accuracy, Wilson intervals, sanity checks, verdict.

What `run_gate` measures, in this order:

1. Setup checks: the model is put into eval mode with frozen parameters; every module must then report
   `training == False`, two forward passes over the same batch must agree bit for bit (dropout or batch
   statistics left on show up here), and the outputs must be logits: (N, classes) with at least two
   classes, and *not* rows of probabilities (all in [0, 1] and summing to 1, i.e. a softmax output, on
   which cross-entropy gradients vanish: Carlini et al. 2019, sec. 4.2). Labels must be below the class
   count.
2. The main pass over the whole dataset: clean accuracy, and robust accuracy under untargeted PGD
   (`modelsec.robustness.pgd`) with `restarts` random restarts. An example counts as robust only if it is
   classified correctly clean *and* after every restart (the worst case over restarts, Madry et al. 2018).
   Restart 0 attacks the whole batch; later restarts attack only the examples still standing.
3. Sanity checks on the first `sanity.samples` examples, after Carlini et al., "On Evaluating Adversarial
   Robustness", arXiv:1902.06705 (2019), sec. 5, and Athalye, Carlini, Wagner, "Obfuscated Gradients Give
   a False Sense of Security", ICML 2018, sec. 3.1 (signs of gradient masking):
   `eps_zero` (PGD at eps = 0 reproduces the clean predictions exactly: catches out-of-range data and
   non-determinism), `monotone` (accuracy on the attacked inputs does not increase with eps over 0, eps/2,
   eps, large eps), `large_eps` (an attack over the whole input range drives the accuracy on attacked
   inputs to at most `large_eps_max_accuracy`), `fgsm_weaker` (single-step FGSM is no stronger than PGD).
   These compare accuracy on the attacked inputs, not robust accuracy (which is capped by clean accuracy
   and would hide a model that is wrong on clean inputs and right on perturbed ones). Each comparison
   allows `max(tolerance, 1/samples)` of slack for the randomness of the start.
4. `frozen`: parameters and buffers are byte-identical after all passes.
5. Verdict: PASSED iff N >= `min_samples`, the rule holds (`point`: robust accuracy >= threshold;
   `strict`: the lower 95% Wilson bound >= threshold, Wilson 1927) and every check passed.

Determinism: on CPU the result is a function of (model, data, configuration, seed) alone on one host and
torch build, also across numbers of data-parallel processes (`modelsec.robustness.distributed`). Across
hosts the float kernels differ in their last bits and examples on the decision boundary can flip (the
PGD-trained LeNet5 at eps 0.3 on 100 digits: FGSM accuracy 0.95 on one x86-64 VM, 0.93 on another), so a
configuration whose sanity checks pass by under a few examples may fail elsewhere. On CUDA, cuDNN's
backward kernels are not bit-reproducible; the counts may differ by a few examples between runs.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import torch
from torch import nn

from modelsec.errors import BackendUnavailableError, MalformedArtifactError, PolicyError
from modelsec.robustness.data import Dataset
from modelsec.robustness.distributed import DistContext
from modelsec.robustness.gate_config import (
    FAILED,
    PASSED,
    RULES,
    GateConfig,
    GateProgress,
    GateResult,
    SanityCheck,
    SanityConfig,
)
from modelsec.robustness.pgd import Forward, batch_seed, fgsm_attack, make_generator, pgd_attack
from modelsec.robustness.stats import Accuracy

__all__ = [
    "RULES",
    "GateConfig",
    "GateProgress",
    "GateResult",
    "SanityCheck",
    "SanityConfig",
    "run_gate",
]


def _fingerprint(module: nn.Module) -> str:
    """SHA-256 over every parameter and buffer (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict(keep_vars=False).items():
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _looks_like_probabilities(logits: torch.Tensor) -> bool:
    values = logits.detach().float()
    in_unit = bool(((values >= 0) & (values <= 1)).all())
    ones = torch.ones(values.shape[0], device=values.device)
    sums_to_one = bool(torch.allclose(values.sum(dim=1), ones, atol=1e-3))
    return in_unit and sums_to_one


def _predict(forward: Forward, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return forward(x).argmax(dim=1)


@dataclass(frozen=True, slots=True)
class _Pass:
    """One evaluation pass: clean correctness and adversarial correctness per example (bool, length m)."""

    clean: torch.Tensor
    adversarial: torch.Tensor

    @property
    def robust(self) -> torch.Tensor:
        return self.clean & self.adversarial


class _Runner:
    """Shared state of one gate run: the forward, device, data, configuration and process group."""

    def __init__(
        self,
        forward: Forward,
        dataset: Dataset,
        config: GateConfig,
        device: torch.device,
        ctx: DistContext,
        progress: GateProgress | None,
    ) -> None:
        self.forward = forward
        self.config = config
        self.device = device
        self.ctx = ctx
        self.progress = progress
        self.inputs = dataset.inputs.pin_memory() if device.type == "cuda" else dataset.inputs
        self.labels = dataset.labels

    def batch(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.inputs[lo:hi].to(self.device, non_blocking=True)
        y = self.labels[lo:hi].to(self.device, non_blocking=True)
        if self.config.fast.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    def run(
        self, m: int, *, eps: float, step_size: float, restarts: int, attack: str, description: str
    ) -> _Pass:
        """Evaluate the first `m` examples under `attack` (`pgd` or `fgsm`) at radius `eps`."""
        cfg = self.config
        size = cfg.batch_size
        count = (m + size - 1) // size
        mine = self.ctx.batches(count)
        clean = torch.zeros(m, dtype=torch.int32, device=self.device)
        adversarial = torch.zeros(m, dtype=torch.int32, device=self.device)
        if self.progress is not None:
            self.progress.start(description, sum(min(m, (b + 1) * size) - b * size for b in mine))
        for b in mine:
            lo, hi = b * size, min(m, (b + 1) * size)
            x, y = self.batch(lo, hi)
            clean[lo:hi] = (_predict(self.forward, x) == y).int()
            if attack == "fgsm":
                adv = fgsm_attack(
                    self.forward, x, y, eps=eps, clip=cfg.clip, bf16_autocast=cfg.fast.bf16_autocast
                )
                ok = _predict(self.forward, adv) == y
            else:
                ok = self._pgd_restarts(b, x, y, eps=eps, step_size=step_size, restarts=restarts)
            adversarial[lo:hi] = ok.int()
            if self.progress is not None:
                self.progress.advance(hi - lo)
        clean = self.ctx.all_reduce_sum(clean)
        adversarial = self.ctx.all_reduce_sum(adversarial)
        return _Pass(clean.cpu().bool(), adversarial.cpu().bool())

    def _pgd_restarts(
        self, b: int, x: torch.Tensor, y: torch.Tensor, *, eps: float, step_size: float, restarts: int
    ) -> torch.Tensor:
        cfg = self.config
        ok = torch.ones_like(y, dtype=torch.bool)
        for r in range(restarts):
            generator = make_generator(self.device, batch_seed(cfg.seed, b, r))
            # Drawn for the whole batch, so that a restart attacking fewer examples uses the same numbers.
            noise = torch.empty_like(x).uniform_(-eps, eps, generator=generator)
            if r == 0:
                xs, ys, ns = x, y, noise
            else:
                idx = ok.nonzero().squeeze(1)
                if idx.numel() == 0:
                    break
                xs, ys, ns = x[idx], y[idx], noise[idx]
            adv = pgd_attack(
                self.forward,
                xs,
                ys,
                eps=eps,
                step_size=step_size,
                steps=cfg.steps,
                clip=cfg.clip,
                start_noise=ns,
                bf16_autocast=cfg.fast.bf16_autocast,
            )
            still = _predict(self.forward, adv) == ys
            if r == 0:
                ok = still
            else:
                ok[idx] = still
        return ok


def _environment(
    module: nn.Module, device: torch.device, config: GateConfig, ctx: DistContext
) -> dict[str, object]:
    param = next(iter(module.parameters()), None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    env: dict[str, object] = {
        "device": device.type,
        "deviceName": name,
        "worldSize": ctx.world_size,
        "backend": ctx.backend,
        "dtypes": {
            "inputs": "float32",
            "parameters": str(param.dtype).removeprefix("torch.") if param is not None else None,
            "compute": "bfloat16" if config.fast.bf16_autocast else "float32",
            "projection": "float32",
        },
        "fastPaths": config.fast.to_json(),
        "torch": str(torch.__version__),
        "deterministic": device.type == "cpu",
    }
    if device.type == "cuda":
        env["tf32"] = {
            "matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn": bool(torch.backends.cudnn.allow_tf32),
        }
    return env


def _resolve_device(config: GateConfig, ctx: DistContext) -> torch.device:
    if config.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {config.device}: CUDA is not available here")
        if config.device == "cuda" and ctx.world_size > 1 and ctx.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
    return torch.device(config.device)


def _setup_checks(
    module: nn.Module, forward: Forward, runner: _Runner, dataset: Dataset
) -> tuple[list[SanityCheck], int]:
    """eval_mode and logits checks on a probe batch; returns the checks and the class count."""
    training = [name or "<root>" for name, m in module.named_modules() if m.training]
    probe_x, _ = runner.batch(0, min(runner.config.batch_size, dataset.size))
    try:
        with torch.no_grad():
            first = forward(probe_x)
            second = forward(probe_x)
    except RuntimeError as e:
        raise PolicyError(
            f"the architecture cannot run on dataset inputs of shape {tuple(dataset.inputs.shape[1:])}: {e}"
        ) from e
    if not isinstance(first, torch.Tensor) or first.ndim != 2 or first.shape[0] != probe_x.shape[0]:
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
        raise PolicyError(f"the model must return (N, classes) logits for N inputs, got {shape}")
    classes = int(first.shape[1])
    if classes < 2:
        raise PolicyError(f"the model returns {classes} output column(s); a classifier needs at least 2")
    top = int(dataset.labels.max())
    if top >= classes:
        raise MalformedArtifactError(
            f"{dataset.source}: label {top} is out of range for a model with {classes} classes "
            f"(0..{classes - 1})"
        )
    same = torch.equal(first, second)
    eval_ok = not training and same
    if training:
        eval_detail = f"modules in training mode: {', '.join(training[:5])}"
    elif not same:
        eval_detail = "two forward passes over one batch differ (dropout or batch statistics still active?)"
    else:
        eval_detail = "every module in eval mode; forward passes reproducible"
    probabilities = _looks_like_probabilities(first)
    checks = [
        SanityCheck("eval_mode", eval_ok, eval_detail),
        SanityCheck(
            "logits",
            not probabilities,
            "outputs are rows of probabilities (in [0, 1], summing to 1): give the model's logits, a softmax "
            "output masks the cross-entropy gradient"
            if probabilities
            else f"outputs are unnormalised logits over {classes} classes",
        ),
    ]
    return checks, classes


def _attack_checks(runner: _Runner, main: _Pass, n: int) -> list[SanityCheck]:
    cfg = runner.config
    s = cfg.sanity
    m = min(n, s.samples)
    tol = max(s.tolerance, 1.0 / m)
    checks: list[SanityCheck] = []

    zero = runner.run(
        m, eps=0.0, step_size=cfg.step_size, restarts=1, attack="pgd", description="sanity: eps=0"
    )
    mismatches = int((zero.adversarial != zero.clean).sum())
    checks.append(
        SanityCheck(
            "eps_zero",
            mismatches == 0,
            f"PGD at eps=0 reproduces the clean prediction correctness on {m - mismatches}/{m} examples",
        )
    )

    def acc(flags: torch.Tensor) -> float:
        return float(flags.sum()) / m

    ladder: list[tuple[float, float]] = [(0.0, acc(zero.adversarial))]
    if cfg.eps > 0:
        half = runner.run(
            m,
            eps=cfg.eps / 2,
            step_size=cfg.step_size / 2,
            restarts=1,
            attack="pgd",
            description=f"sanity: eps={cfg.eps / 2:g}",
        )
        ladder += [(cfg.eps / 2, acc(half.adversarial)), (cfg.eps, acc(main.adversarial[:m]))]
    large_eps = s.large_eps if s.large_eps is not None else cfg.clip[1] - cfg.clip[0]
    large = runner.run(
        m,
        eps=large_eps,
        step_size=2.5 * large_eps / cfg.steps,
        restarts=1,
        attack="pgd",
        description=f"sanity: eps={large_eps:g}",
    )
    large_acc = acc(large.adversarial)
    if large_eps > cfg.eps:
        ladder.append((large_eps, large_acc))
    rises = [
        f"{ladder[j][1]:.4f} at eps={ladder[j][0]:g} > {ladder[i][1]:.4f} at eps={ladder[i][0]:g}"
        for i in range(len(ladder))
        for j in range(i + 1, len(ladder))
        if ladder[j][1] > ladder[i][1] + tol
    ]
    text = ", ".join(f"{a:.4f}@{e:g}" for e, a in ladder)
    checks.append(
        SanityCheck(
            "monotone",
            not rises,
            f"accuracy under attack by eps {text} (tolerance {tol:.4f})"
            + (f"; increases: {'; '.join(rises)}" if rises else ""),
        )
    )
    checks.append(
        SanityCheck(
            "large_eps",
            large_acc <= s.large_eps_max_accuracy,
            f"accuracy {large_acc:.4f} at eps={large_eps:g} (whole range; at most "
            f"{s.large_eps_max_accuracy:g} allowed: an unbounded attack must succeed)",
        )
    )
    fgsm = runner.run(
        m, eps=cfg.eps, step_size=cfg.eps, restarts=1, attack="fgsm", description="sanity: FGSM"
    )
    fgsm_acc, pgd_acc = acc(fgsm.adversarial), acc(main.adversarial[:m])
    checks.append(
        SanityCheck(
            "fgsm_weaker",
            fgsm_acc + tol >= pgd_acc,
            f"FGSM accuracy {fgsm_acc:.4f} vs PGD {pgd_acc:.4f} at eps={cfg.eps:g} (tolerance {tol:.4f})",
        )
    )
    return checks


def run_gate(
    model: nn.Module,
    dataset: Dataset,
    config: GateConfig,
    *,
    progress: GateProgress | None = None,
    dist: DistContext | None = None,
) -> GateResult:
    """Run the PGD L-infinity gate: measure, check, decide (see the module docstring for the order).

    The model is modified in place: put into eval mode, parameters frozen, moved to the device (and to
    channels_last when that fast path is on). Under `torch.distributed` every rank calls this with the
    same arguments; each evaluates its share of the batches and all ranks return the same result.

    Args:
        model: The classifier (weights already verified, e.g. `load_verified_model(...).module`); maps
            (N, ...) float32 inputs in `config.clip` to (N, classes) logits.
        dataset: The evaluation set (validated, CPU).
        config: Attack parameters, rule and threshold.
        progress: Optional progress sink.
        dist: The data-parallel context; default: a single process.

    Returns:
        The result; `result.passed` tells the verdict (call `raise_for_verdict()` to turn FAILED into an
        error).

    Raises:
        PolicyError: The model cannot run on the inputs or does not return (N, classes) outputs; ranks
            disagree on data or configuration.
        MalformedArtifactError: A label is not below the model's class count.
        BackendUnavailableError: CUDA was requested but is not available.

    Example:
        >>> cfg = GateConfig(eps=0.3, step_size=0.01, steps=40, min_robust_accuracy=0.85)  # doctest: +SKIP
        >>> run_gate(classifier.module, load_dataset("mnist.npz"), cfg).verdict  # doctest: +SKIP
        'PASSED'
    """
    started = time.perf_counter()
    ctx = dist or DistContext.single()
    device = _resolve_device(config, ctx)
    ctx.check_same(
        json.dumps([dataset.digest, config.to_json(), config.min_robust_accuracy, config.rule]),
        what="dataset and gate configuration",
    )
    model.eval()
    model.requires_grad_(False)
    model.to(device)
    if config.fast.channels_last:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    forward: Forward = torch.compile(model) if config.fast.compile else model
    before = _fingerprint(model)
    runner = _Runner(forward, dataset, config, device, ctx, progress)
    n = dataset.size

    checks, _classes = _setup_checks(model, forward, runner, dataset)
    main = runner.run(
        n,
        eps=config.eps,
        step_size=config.step_size,
        restarts=config.restarts,
        attack="pgd",
        description=f"PGD eps={config.eps:g}",
    )
    clean = Accuracy(int(main.clean.sum()), n)
    robust = Accuracy(int(main.robust.sum()), n)
    if config.sanity.enabled:
        checks += _attack_checks(runner, main, n)
    unchanged = _fingerprint(model) == before
    checks.append(
        SanityCheck(
            "frozen",
            unchanged,
            "parameters and buffers unchanged by the evaluation"
            if unchanged
            else "parameters or buffers changed during the evaluation (batch-norm statistics updating?)",
        )
    )

    reasons = []
    if n < config.min_samples:
        reasons.append(f"only {n} samples, fewer than the required {config.min_samples}")
    lo, _hi = robust.wilson95
    value = robust.accuracy if config.rule == "point" else lo
    if value < config.min_robust_accuracy:
        what = "robust accuracy" if config.rule == "point" else "the 95% Wilson lower bound of it"
        reasons.append(f"{what} {value:.4f} is below the threshold {config.min_robust_accuracy:g}")
    reasons += [f"sanity check {c.name} failed: {c.detail}" for c in checks if not c.passed]
    return GateResult(
        config=config,
        clean=clean,
        robust=robust,
        verdict=FAILED if reasons else PASSED,
        reasons=tuple(reasons),
        checks=tuple(checks),
        dataset_digest=dataset.digest,
        dataset_source=dataset.source,
        dataset_format=dataset.format,
        environment=_environment(model, device, config, ctx),
        elapsed_s=time.perf_counter() - started,
        finished_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
