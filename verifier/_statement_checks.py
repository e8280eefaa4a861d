"""One trusted statement against one requirement: whether it applies, and whether it meets the policy.

Used by `modelsec.verifier.attestations` (steps 6 and the selection of its module docstring): a statement
failing `gate_applies` / `watermark_applies` is ignored; among those left, the newest decides through
`gate_outcome` / `watermark_outcome`, whose failure vetoes.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from modelsec.attestations.predicates.gate import GatePredicate, check_gate_run, parse_gate_predicate
from modelsec.attestations.predicates.watermark import (
    WatermarkPredicate,
    check_watermark_run,
    parse_watermark_predicate,
)
from modelsec.errors import AttestationError
from modelsec.policy import RobustnessRequirement, WatermarkRequirement

__all__ = [
    "check_gate",
    "check_watermark",
    "fresh",
    "gate_applies",
    "gate_outcome",
    "watermark_applies",
    "watermark_outcome",
]

# A statement dated further ahead than this is not fresh evidence (it would stay the newest for as long).
CLOCK_SKEW_SECONDS = 300.0


def gate_applies(pred: GatePredicate, req: RobustnessRequirement, what: str, now: datetime) -> None:
    """Whether a trusted gate statement is evidence for `req` at all: its settings and its freshness.

    A statement failing this is ignored (it neither satisfies nor vetoes); one passing it competes with the
    others, and the newest decides through `gate_outcome`.
    """
    if pred.attack != req.attack:
        raise AttestationError(f"{what}: gate attack {pred.attack!r} is not the policy's {req.attack!r}")
    if pred.eps < req.min_eps:
        raise AttestationError(f"{what}: gate eps {pred.eps} is below the policy's minEps {req.min_eps}")
    if pred.robust_total < req.min_samples:
        raise AttestationError(
            f"{what}: gate evaluated {pred.robust_total} samples, policy needs {req.min_samples}"
        )
    fresh(pred.finished_at, req.max_age_seconds, "gate result", "finishedAt", what, now)
    check_gate_run(pred, req, what=what)  # steps, restarts, dataset, who ran it: a weaker run is not evidence


def fresh(
    when: datetime | None, max_age: float | None, label: str, field_name: str, what: str, now: datetime
) -> None:
    # A time in the future would make a statement the newest for as long as the clock lags: not evidence.
    if when is not None and (when - now).total_seconds() > CLOCK_SKEW_SECONDS:
        raise AttestationError(f"{what}: {field_name} {when.isoformat()} lies in the future")
    if max_age is None:
        return
    if when is None:
        raise AttestationError(f"{what}: {field_name} is missing (the policy sets maxAge)")
    age = (now - when).total_seconds()
    if age > max_age:
        raise AttestationError(
            f"{what}: {label} is stale ({age / 86400:.1f} days old; maxAge {max_age / 86400:.1f} days)"
        )


def gate_outcome(pred: GatePredicate, req: RobustnessRequirement, what: str) -> str:
    """The deciding gate statement's result: verdict, accuracy and sanity checks (raises unless met)."""
    if pred.verdict != "PASSED":
        raise AttestationError(f"{what}: gate verdict is {pred.verdict!r}, not 'PASSED'")
    if req.rule == "strict":
        value, label = pred.robust_wilson95[0], "Wilson 95% lower bound"
    else:
        value, label = pred.robust_accuracy, "robust accuracy"
    if value < req.min_robust_accuracy:
        raise AttestationError(f"{what}: {label} {value:.4f} is below the policy's {req.min_robust_accuracy}")
    if pred.failed_checks:
        raise AttestationError(f"{what}: gate sanity checks failed: {pred.failed_checks}")
    run = check_gate_run(pred, req, what=what)  # already met in gate_applies: here for the description
    return (
        f"robustness: {pred.attack} eps {pred.eps} >= {req.min_eps}, "
        f"{label} {value:.4f} >= {req.min_robust_accuracy}" + (f", {run}" if run else "")
    )


def check_gate(predicate: Mapping[str, Any], req: RobustnessRequirement, what: str, now: datetime) -> str:
    """One gate statement alone: parsed, applicable and passing (raises naming the first failure)."""
    pred = parse_gate_predicate(predicate, what=what)
    gate_applies(pred, req, what, now)
    return gate_outcome(pred, req, what)


def watermark_applies(pred: WatermarkPredicate, req: WatermarkRequirement, what: str, now: datetime) -> None:
    """Whether a trusted watermark statement is evidence for `req` at all: its date and its message.

    A statement failing this is ignored (it neither satisfies nor vetoes); one passing it competes with the
    others, and the newest decides through `watermark_outcome`. With the policy's `message`, the statement
    must commit to that message under the policy's key (constant-time comparison): a mark of another
    release's message, or made with another key, is not evidence about this release.
    """
    fresh(pred.embedded_at, None, "watermark record", "embeddedAt", what, now)
    expected = req.message_commitment
    if expected is not None and not hmac.compare_digest(pred.message_commitment.encode(), expected.encode()):
        raise AttestationError(
            f"{what}: watermark messageCommitment does not commit to the policy's message "
            "(attestations.watermark.message) under its keyFile: another message, or another key"
        )


def watermark_outcome(pred: WatermarkPredicate, req: WatermarkRequirement, what: str) -> str:
    """The deciding watermark statement's result: detection and fidelity at embedding (raises unless met)."""
    if not pred.detected:
        raise AttestationError(f"{what}: the watermark was not detected at embed time")
    confidence, fpp = pred.confidence, pred.false_positive_probability
    if confidence < req.min_confidence:
        raise AttestationError(f"{what}: watermark confidence {confidence:.4f} < policy {req.min_confidence}")
    if fpp > req.max_false_positive:
        raise AttestationError(
            f"{what}: watermark false-positive probability {fpp:.3g} > policy {req.max_false_positive:.3g}"
        )
    if req.max_fidelity_loss is not None or req.fidelity_metric is not None:
        if pred.fidelity is None:
            raise AttestationError(f"{what}: the watermark attestation records no fidelity measurement")
        if req.fidelity_metric is not None and pred.fidelity.metric != req.fidelity_metric:
            raise AttestationError(
                f"{what}: watermark fidelity measured as {pred.fidelity.metric!r}, not in the policy's "
                f"fidelityMetric {req.fidelity_metric!r}"
            )
        if req.max_fidelity_loss is not None and pred.fidelity.value > req.max_fidelity_loss:
            raise AttestationError(
                f"{what}: watermark fidelity loss {pred.fidelity.value:.3g} ({pred.fidelity.metric}) > "
                f"policy maxFidelityLoss {req.max_fidelity_loss:.3g}"
            )
    run = check_watermark_run(pred, require_server_run=req.require_server_run, what=what)
    return f"watermark: detected at embed time, confidence {confidence:.3f}, false-positive p {fpp:.2g}" + (
        f", {run}" if run else ""
    )


def check_watermark(predicate: Mapping[str, Any], req: WatermarkRequirement, what: str) -> str:
    """One watermark statement alone: parsed and passing (raises naming the first failure)."""
    pred = parse_watermark_predicate(predicate, what=what)
    watermark_applies(pred, req, what, datetime.now(UTC))
    return watermark_outcome(pred, req, what)
