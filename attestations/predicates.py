"""Range checks for the numbers in modelsec's gate and watermark predicates, before any arithmetic.

A statement is signed or verified as a whole, but its numbers are read by code that compares, converts and
formats them: an integer like `10**400` raises `OverflowError` when it meets a float, a year-1 timestamp with
an offset overflows `datetime` subtraction, a negative sample count reads as "fewer than required" only by
luck. `modelsec._strict_json` already refuses integers outside 64 bits and non-finite floats; this module
adds the range each field can sensibly hold, so every consumer (the verifier, `SignStatement`, detection
hints) rejects the statement with `MalformedArtifactError` naming the field instead of crashing or doing
arithmetic on nonsense.

What is checked: the type and range of every numeric field of the predicate *that is present* (and
`finishedAt` / `embeddedAt` as RFC 3339 with a zone, years 1970-9998), and `correct <= total`. What is not:
which fields are required and what values a policy accepts (`modelsec.verifier.attestations` decides that),
and fields not listed here (free-form, never used in arithmetic by modelsec).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelsec.attestations.statement import GATE_PREDICATE_TYPE, WATERMARK_PREDICATE_TYPE, Statement
from modelsec.errors import MalformedArtifactError

__all__ = ["check_gate_predicate", "check_predicate_numbers", "check_watermark_predicate", "parse_rfc3339"]

# Bounds far beyond any real run, far below anything that overflows a float or a C integer.
_COUNT = 10**12  # samples, carriers, elements: a trillion is beyond every dataset and model here
_BIG_REAL = 1e12  # seconds, input units: a run of 30,000 years, inputs of any scale in use


@dataclass(frozen=True, slots=True)
class _Range:
    integer: bool
    lo: float
    hi: float
    nullable: bool = False
    pair: bool = False  # a [lo, hi] list of two such numbers, in order


def _int(lo: int, hi: int, *, nullable: bool = False) -> _Range:
    return _Range(True, lo, hi, nullable)


def _real(lo: float, hi: float, *, nullable: bool = False, pair: bool = False) -> _Range:
    return _Range(False, lo, hi, nullable, pair)


_UNIT = _real(0.0, 1.0)
_UNIT_PAIR = _real(0.0, 1.0, pair=True)

_GATE_FIELDS: dict[str, _Range] = {
    # eps and stepSize are in input units (GateConfig accepts any finite clip range, e.g. [0, 255]).
    "parameters.eps": _real(0.0, _BIG_REAL),
    "parameters.stepSize": _real(0.0, _BIG_REAL),
    "parameters.steps": _int(1, 10**7),
    "parameters.restarts": _int(1, 10**5),
    "parameters.seed": _int(-(2**63), 2**64 - 1),
    "parameters.batchSize": _int(1, 2**31),
    "parameters.inputRange": _real(-_BIG_REAL, _BIG_REAL, pair=True),
    "dataset.samples": _int(0, _COUNT),
    "results.clean.correct": _int(0, _COUNT),
    "results.clean.total": _int(0, _COUNT),
    "results.clean.accuracy": _UNIT,
    "results.clean.wilson95": _UNIT_PAIR,
    "results.robust.correct": _int(0, _COUNT),
    "results.robust.total": _int(0, _COUNT),
    "results.robust.accuracy": _UNIT,
    "results.robust.wilson95": _UNIT_PAIR,
    "gate.threshold": _UNIT,
    "gate.minSamples": _int(0, _COUNT),
    "gate.value": _UNIT,
    "sanity.samples": _int(0, _COUNT),
    "sanity.tolerance": _UNIT,
    "sanity.largeEps": _real(0.0, _BIG_REAL, nullable=True),
    "sanity.largeEpsMaxAccuracy": _UNIT,
    "environment.worldSize": _int(1, 2**20),
    "elapsedSeconds": _real(0.0, _BIG_REAL),
}

_WATERMARK_FIELDS: dict[str, _Range] = {
    # The ranges WatermarkParams accepts, widened only where it has no upper bound of its own.
    "parameters.kappa": _real(0.0, 100.0),
    "parameters.pilotBits": _int(0, 4096),
    "parameters.blockSize": _int(0, 4096),
    "parameters.targetCarriersLog2": _int(0, 64),
    "parameters.densityLog2": _int(0, 64, nullable=True),
    "parameters.minTensorElements": _int(0, _COUNT),
    "parameters.maxRelativeChange": _UNIT,
    "parameters.maxMessageBits": _int(0, 65536),
    "parameters.minCarriersPerBit": _int(0, _COUNT),
    "parameters.codeBits": _int(0, _COUNT),
    "parameters.messageBits": _int(0, 65536),
    "carriers.count": _int(0, _COUNT),
    "embedding.maxRelativeChange": _real(0.0, _BIG_REAL),
    "embedding.meanRelativeChange": _real(0.0, _BIG_REAL),
    "embedding.relativeL2Change": _real(0.0, _BIG_REAL),
    "embedding.strength.min": _real(0.0, _BIG_REAL),
    "embedding.strength.median": _real(0.0, _BIG_REAL),
    "embedding.strength.max": _real(0.0, _BIG_REAL),
    "detection.bits": _int(0, _COUNT),
    "detection.bitMatches": _int(0, _COUNT),
    "detection.bitErrorRate": _UNIT,
    "detection.falsePositiveProbability": _UNIT,
    "detection.log10FalsePositiveProbability": _real(-_BIG_REAL, 0.0, nullable=True),
    "detection.confidence": _real(-1.0, 1.0),
    "detection.tests": _int(0, _COUNT),
    "detection.pilotBits": _int(0, 4096),
    "detection.pilotMatches": _int(0, 4096),
    "detection.messageBits": _int(0, 65536, nullable=True),
    "detection.messageMatches": _int(0, 65536, nullable=True),
    "detection.messageBitErrorRate": _real(0.0, 1.0, nullable=True),
    "detection.minMargin": _real(-_BIG_REAL, _BIG_REAL, nullable=True),
    "detection.medianMargin": _real(-_BIG_REAL, _BIG_REAL, nullable=True),
    "detection.densityLog2": _int(0, 64, nullable=True),
    "detection.carriers": _int(0, _COUNT),
    "detection.carrierTensors": _int(0, _COUNT),
    "detection.thresholds.minConfidence": _UNIT,
    "detection.thresholds.maxFalsePositiveProbability": _UNIT,
}


def _lookup(predicate: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = predicate
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _check_number(value: object, spec: _Range, path: str, what: str) -> None:
    kind = "an integer" if spec.integer else "a number"
    ok_type = isinstance(value, int) if spec.integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type:
        raise MalformedArtifactError(f"{what}: predicate {path} is not {kind} ({type(value).__name__})")
    # Compare before converting: Python compares int and float exactly, float(10**400) overflows.
    if isinstance(value, float) and not math.isfinite(value):
        raise MalformedArtifactError(f"{what}: predicate {path} is not finite")
    if not spec.lo <= value <= spec.hi:  # type: ignore[operator]
        shown = str(value) if len(str(value)) <= 40 else f"{str(value)[:20]}...({len(str(value))} digits)"
        raise MalformedArtifactError(
            f"{what}: predicate {path} = {shown} is out of range [{spec.lo:g}, {spec.hi:g}]"
        )


def _check_fields(predicate: Mapping[str, Any], fields: Mapping[str, _Range], what: str) -> None:
    for path, spec in fields.items():
        present, value = _lookup(predicate, path)
        if not present or (value is None and spec.nullable):
            continue
        if spec.pair:
            bounds = f"[{spec.lo:g}, {spec.hi:g}]"
            rule = f"{what}: predicate {path} must be [lower, upper] with lower <= upper in {bounds}"
            if not isinstance(value, list) or len(value) != 2:
                raise MalformedArtifactError(rule)
            for i in (0, 1):
                try:
                    _check_number(value[i], spec, f"{path}[{i}]", what)
                except MalformedArtifactError as e:
                    raise MalformedArtifactError(f"{rule} ({e})") from None
            if value[0] > value[1]:
                raise MalformedArtifactError(rule)
        else:
            _check_number(value, spec, path, what)


def parse_rfc3339(value: object, *, field: str, what: str) -> datetime:
    """Parse an RFC 3339 timestamp with a time zone, as UTC, refusing years outside 1970-9998.

    The year bound keeps every later subtraction (`now - finishedAt`) and zone conversion inside
    `datetime`'s range: `0001-01-01T00:00:00+01:00` would otherwise overflow when converted to UTC.

    Args:
        value: The JSON value (must be a string).
        field: The field name, for errors.
        what: Names the document in errors.

    Returns:
        The time, in UTC.

    Raises:
        MalformedArtifactError: Not a string, not RFC 3339, no time zone, or out of range.
    """
    if not isinstance(value, str) or len(value) > 64:
        raise MalformedArtifactError(f"{what}: predicate {field} must be an RFC 3339 time string")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise MalformedArtifactError(f"{what}: predicate {field} {value!r} is not RFC 3339") from None
    if when.tzinfo is None:
        raise MalformedArtifactError(f"{what}: predicate {field} {value!r} has no time zone")
    if not 1970 <= when.year <= 9998:
        raise MalformedArtifactError(f"{what}: predicate {field} {value!r} is out of range (1970-9998)")
    return when.astimezone(UTC)


def _check_counts(predicate: Mapping[str, Any], what: str) -> None:
    for part in ("clean", "robust"):
        _, correct = _lookup(predicate, f"results.{part}.correct")
        _, total = _lookup(predicate, f"results.{part}.total")
        if isinstance(correct, int) and isinstance(total, int) and correct > total:
            raise MalformedArtifactError(
                f"{what}: predicate results.{part}.correct {correct} exceeds results.{part}.total {total}"
            )


def check_gate_predicate(predicate: Mapping[str, Any], *, what: str) -> None:
    """Check the type and range of every number in a robustness-gate predicate (see the module docstring).

    Args:
        predicate: The `https://modelsec.dev/robustness-gate/v1` predicate.
        what: Names the bundle or request in errors.

    Raises:
        MalformedArtifactError: A number has the wrong type or is out of range, `correct` exceeds
            `total`, or `finishedAt` is present and not an RFC 3339 time in range.
    """
    _check_fields(predicate, _GATE_FIELDS, what)
    _check_counts(predicate, what)
    if "finishedAt" in predicate:
        parse_rfc3339(predicate["finishedAt"], field="finishedAt", what=what)


def check_watermark_predicate(predicate: Mapping[str, Any], *, what: str) -> None:
    """Check the type and range of every number in a watermark predicate (see the module docstring).

    Args:
        predicate: The `https://modelsec.dev/watermark/v1` predicate.
        what: Names the bundle or request in errors.

    Raises:
        MalformedArtifactError: A number has the wrong type or is out of range, or `embeddedAt` is present
            and not an RFC 3339 time in range.
    """
    _check_fields(predicate, _WATERMARK_FIELDS, what)
    tensors = _lookup(predicate, "carriers.tensors")[1]
    if isinstance(tensors, list):
        for i, entry in enumerate(tensors):
            if isinstance(entry, Mapping) and "carriers" in entry:
                _check_number(entry["carriers"], _int(0, _COUNT), f"carriers.tensors[{i}].carriers", what)
    if "embeddedAt" in predicate:
        parse_rfc3339(predicate["embeddedAt"], field="embeddedAt", what=what)


def check_predicate_numbers(statement: Statement, *, what: str) -> None:
    """`check_gate_predicate` or `check_watermark_predicate` by predicate type; other types pass unchecked.

    Raises:
        MalformedArtifactError: As the checker for the statement's predicate type.
    """
    if statement.predicate_type == GATE_PREDICATE_TYPE:
        check_gate_predicate(statement.predicate, what=what)
    elif statement.predicate_type == WATERMARK_PREDICATE_TYPE:
        check_watermark_predicate(statement.predicate, what=what)
