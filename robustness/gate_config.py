"""The robustness gate's values: its configuration (`GateConfig`, `SanityConfig`) and result (`GateResult`).

`run_gate` (`modelsec.robustness.gate`) takes a `GateConfig` and returns a `GateResult`; the predicate
built from a result is `modelsec.attestations.predicates.gate`. The rules and numbers are documented on
`modelsec.robustness.gate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from modelsec.errors import GateFailedError, PolicyError
from modelsec.robustness.pgd import FastPaths
from modelsec.robustness.stats import Accuracy

RULES = ("point", "strict")


def default_step_size(eps: float, steps: int) -> float:
    """The PGD step size when none is given: `2.5 * eps / steps` (Madry et al. 2018's rule of thumb).

    0.01 when `eps` or `steps` is not positive, so that a configuration with `eps = 0` (the gate as a
    clean-accuracy check) stays valid.
    """
    return 2.5 * eps / steps if eps > 0 and steps > 0 else 0.01


PASSED, FAILED = "PASSED", "FAILED"


class GateProgress(Protocol):
    """Progress sink (the CLI's rich bar). Units are examples of this process."""

    def start(self, description: str, total: int) -> None:
        """A new pass over `total` examples begins."""
        ...

    def advance(self, n: int) -> None:
        """`n` more examples of the current pass are done."""
        ...


@dataclass(frozen=True, slots=True)
class SanityConfig:
    """Sanity checks against gradient masking and setup mistakes (see the module docstring).

    Attributes:
        enabled: Run the attack-based checks (`eps_zero`, `monotone`, `large_eps`, `fgsm_weaker`). The
            structural checks (`eval_mode`, `logits`, `frozen`) always run.
        samples: How many of the first examples the attack-based checks use.
        tolerance: Slack for comparisons between attacks, as a fraction of `samples` (at least one example).
        large_eps: The "unbounded" radius; None means the whole valid range, `hi - lo`. Its step size is
            `2.5 * large_eps / steps` (Madry et al. 2018's rule of thumb).
        large_eps_max_accuracy: Highest accuracy allowed at `large_eps`.
    """

    enabled: bool = True
    samples: int = 256
    tolerance: float = 0.02
    large_eps: float | None = None
    large_eps_max_accuracy: float = 0.05

    def to_json(self) -> dict[str, object]:
        """The configuration as recorded in the attestation."""
        return {
            "enabled": self.enabled,
            "samples": self.samples,
            "tolerance": self.tolerance,
            "largeEps": self.large_eps,
            "largeEpsMaxAccuracy": self.large_eps_max_accuracy,
        }


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Attack parameters and the release rule.

    Attributes:
        eps: L-infinity radius in input units (e.g. 0.03 for [0, 1] images), >= 0.
        step_size: PGD step `alpha` in input units, > 0.
        steps: PGD iterations, >= 1.
        min_robust_accuracy: The release threshold in [0, 1].
        restarts: Random restarts, >= 1 (worst case per example).
        seed: Seed of the random starts (per-batch seeds derive from it, `pgd.batch_seed`).
        rule: `point` (robust accuracy >= threshold) or `strict` (Wilson 95% lower bound >= threshold).
        min_samples: Fewest examples a PASSED verdict needs.
        clip: The valid input range `(lo, hi)`.
        batch_size: Examples per batch (fixed; the last batch may be smaller).
        device: `cpu`, `cuda` or `cuda:K`.
        fast: CUDA fast paths (all off: the reference path).
        sanity: Sanity-check settings.
    """

    eps: float
    step_size: float
    steps: int
    min_robust_accuracy: float
    restarts: int = 1
    seed: int = 0
    rule: str = "point"
    min_samples: int = 100
    clip: tuple[float, float] = (0.0, 1.0)
    batch_size: int = 256
    device: str = "cpu"
    fast: FastPaths = field(default_factory=FastPaths)
    sanity: SanityConfig = field(default_factory=SanityConfig)

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.eps) and self.eps >= 0):
            problems.append(f"eps must be a finite number >= 0, got {self.eps}")
        if not (math.isfinite(self.step_size) and self.step_size > 0):
            problems.append(f"step size must be > 0, got {self.step_size}")
        if self.steps < 1:
            problems.append(f"steps must be >= 1, got {self.steps}")
        if self.restarts < 1:
            problems.append(f"restarts must be >= 1, got {self.restarts}")
        if not 0.0 <= self.min_robust_accuracy <= 1.0:
            problems.append(f"the threshold must be in [0, 1], got {self.min_robust_accuracy}")
        if self.rule not in RULES:
            problems.append(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.min_samples < 1:
            problems.append(f"min samples must be >= 1, got {self.min_samples}")
        if not (math.isfinite(self.clip[0]) and math.isfinite(self.clip[1]) and self.clip[0] < self.clip[1]):
            problems.append(f"the valid range needs lo < hi, got {self.clip}")
        if self.batch_size < 1:
            problems.append(f"batch size must be >= 1, got {self.batch_size}")
        if self.sanity.samples < 1 or not 0.0 <= self.sanity.tolerance < 1.0:
            problems.append("sanity samples must be >= 1 and tolerance in [0, 1)")
        if self.sanity.large_eps is not None and not self.sanity.large_eps > 0:
            problems.append(f"the large eps must be > 0, got {self.sanity.large_eps}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            problems.append(f"device must be cpu, cuda or cuda:K, got {self.device!r}")
        if problems:
            raise PolicyError("invalid gate configuration: " + "; ".join(problems))

    def to_json(self) -> dict[str, object]:
        """The attack parameters as recorded in the attestation."""
        return {
            "norm": "Linf",
            "eps": self.eps,
            "stepSize": self.step_size,
            "steps": self.steps,
            "restarts": self.restarts,
            "randomStart": True,
            "loss": "cross-entropy",
            "seed": self.seed,
            "inputRange": [self.clip[0], self.clip[1]],
            "batchSize": self.batch_size,
        }


@dataclass(frozen=True, slots=True)
class SanityCheck:
    """The outcome of one sanity check.

    Attributes:
        name: `eval_mode`, `logits`, `eps_zero`, `monotone`, `large_eps`, `fgsm_weaker` or `frozen`.
        passed: Whether it held.
        detail: What was measured, in words.
    """

    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, object]:
        """`{"name", "passed", "detail"}`."""
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class GateResult:
    """Everything a gate run measured and decided (the attestation's predicate is built from it).

    Attributes:
        config: The configuration used.
        clean: Clean accuracy over the dataset.
        robust: Robust accuracy (correct clean and under every PGD restart).
        verdict: `PASSED` or `FAILED`.
        reasons: Why it failed (empty when PASSED).
        checks: Sanity checks run, in order.
        dataset_digest: Hex SHA-256 of the dataset (see `modelsec.robustness.data`).
        dataset_source: Where the dataset came from.
        dataset_format: `safetensors`, `npz` or `loader`.
        environment: Device, dtypes, fast paths, torch version, world size (JSON-ready).
        elapsed_s: Wall-clock seconds of the run.
        finished_at: RFC 3339 UTC time the run finished, e.g. `2025-01-31T12:00:00Z`.
    """

    config: GateConfig
    clean: Accuracy
    robust: Accuracy
    verdict: str
    reasons: tuple[str, ...]
    checks: tuple[SanityCheck, ...]
    dataset_digest: str
    dataset_source: str
    dataset_format: str
    environment: dict[str, object]
    elapsed_s: float
    finished_at: str

    @property
    def passed(self) -> bool:
        """Whether the verdict is PASSED."""
        return self.verdict == PASSED

    @property
    def metric(self) -> float:
        """The value the rule compares with the threshold (point estimate or Wilson lower bound)."""
        return self.robust.accuracy if self.config.rule == "point" else self.robust.wilson95[0]

    def raise_for_verdict(self) -> None:
        """Raise `GateFailedError` unless the gate passed.

        Raises:
            GateFailedError: The verdict is FAILED; the message lists the reasons.
        """
        if not self.passed:
            raise GateFailedError("PGD robustness gate FAILED: " + "; ".join(self.reasons))

    def summary(self) -> str:
        """One line for humans: verdict, accuracies with intervals, threshold and rule."""
        lo, hi = self.robust.wilson95
        return (
            f"{self.verdict}: robust accuracy {self.robust.correct}/{self.robust.total} = "
            f"{self.robust.accuracy:.4f} (95% Wilson [{lo:.4f}, {hi:.4f}]) at eps={self.config.eps:g}, "
            f"clean {self.clean.accuracy:.4f}; threshold {self.config.min_robust_accuracy:g} "
            f"({self.config.rule} rule)"
        )

    def to_json(self) -> dict[str, object]:
        """JSON-ready form (the CLI's `--json` output and the attestation's predicate body)."""
        return {
            "attack": "pgd-linf",
            "parameters": self.config.to_json(),
            "dataset": {
                "digest": {"sha256": self.dataset_digest},
                "samples": self.clean.total,
                "source": self.dataset_source,
                "format": self.dataset_format,
            },
            "results": {"clean": self.clean.to_json(), "robust": self.robust.to_json()},
            "gate": {
                "metric": "robustAccuracy",
                "threshold": self.config.min_robust_accuracy,
                "rule": self.config.rule,
                "minSamples": self.config.min_samples,
                "value": self.metric,
                "verdict": self.verdict,
                "reasons": list(self.reasons),
            },
            "sanity": {**self.config.sanity.to_json(), "checks": [c.to_json() for c in self.checks]},
            "environment": self.environment,
            "elapsedSeconds": round(self.elapsed_s, 3),
            "finishedAt": self.finished_at,
        }
