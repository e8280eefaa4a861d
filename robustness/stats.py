"""Binomial accuracy estimates with 95% Wilson score intervals (pure Python, no torch).

Source: E. B. Wilson, "Probable inference, the law of succession, and statistical inference", JASA 22
(1927) 209-212. The Wilson interval keeps its coverage near the nominal level for small `n` and for
proportions near 0 or 1, where the normal (Wald) interval collapses to a point; Brown, Cai and DasGupta,
"Interval estimation for a binomial proportion", Statistical Science 16 (2001) recommend it for exactly the
regime of a release gate (n of a few hundred, accuracy near 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Z_95", "Accuracy", "wilson_interval"]

Z_95 = 1.959963984540054
"""The 0.975 quantile of the standard normal distribution (two-sided 95%)."""


def wilson_interval(correct: int, total: int, *, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion `correct / total`.

    Args:
        correct: Number of successes, `0 <= correct <= total`.
        total: Number of trials; 0 gives the uninformative interval (0, 1).
        z: Normal quantile; the default gives a two-sided 95% interval.

    Returns:
        `(lower, upper)`, both in [0, 1]; `lower <= correct/total <= upper`.

    Raises:
        ValueError: `correct` or `total` out of range (a programming error, not a modelsec refusal).

    Example:
        >>> tuple(round(v, 4) for v in wilson_interval(17, 20))
        (0.6396, 0.9476)
    """
    if total < 0 or not 0 <= correct <= total:
        raise ValueError(f"need 0 <= correct <= total, got {correct}/{total}")
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    z2 = z * z
    denom = 1.0 + z2 / total
    center = (p + z2 / (2 * total)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / total + z2 / (4.0 * total * total))
    # At p = 0 or 1 the exact bound is 0 or 1; rounding must not move it inside.
    lower = 0.0 if correct == 0 else max(0.0, center - half)
    upper = 1.0 if correct == total else min(1.0, center + half)
    return (lower, upper)


@dataclass(frozen=True, slots=True)
class Accuracy:
    """`correct` out of `total` examples, with its 95% Wilson interval.

    Attributes:
        correct: Examples classified correctly (for robust accuracy: correct clean *and* under every attack
            restart).
        total: Examples evaluated.
    """

    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        """The point estimate `correct / total` (0.0 when `total` is 0)."""
        return self.correct / self.total if self.total else 0.0

    @property
    def wilson95(self) -> tuple[float, float]:
        """The 95% Wilson score interval (Wilson 1927)."""
        return wilson_interval(self.correct, self.total)

    def to_json(self) -> dict[str, object]:
        """`{"correct", "total", "accuracy", "wilson95": [lower, upper]}`."""
        lower, upper = self.wilson95
        return {
            "correct": self.correct,
            "total": self.total,
            "accuracy": self.accuracy,
            "wilson95": [lower, upper],
        }
