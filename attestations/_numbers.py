"""Range checks shared by the predicate modules (`gate_predicate`, `watermark_predicate`).

Every check runs before any arithmetic.

A statement is signed or verified as a whole, but its numbers are read by code that compares, converts and
formats them: an integer like `10**400` raises `OverflowError` when it meets a float, a year-1 timestamp with
an offset overflows `datetime` subtraction, a negative sample count reads as "fewer than required" only by
luck. `modelsec.strict_json` already refuses integers outside 64 bits and non-finite floats; the predicate
modules add the range each field can sensibly hold (tables of `Range` by dotted path), checked here, so every
consumer rejects the statement with `MalformedArtifactError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelsec.errors import MalformedArtifactError

__all__ = [
    "BIG_REAL",
    "COUNT",
    "UNIT",
    "UNIT_PAIR",
    "Range",
    "check_fields",
    "check_number",
    "integer",
    "lookup",
    "parse_rfc3339",
    "real",
]

# Bounds far beyond any real run, far below anything that overflows a float or a C integer.
COUNT = 10**12  # samples, carriers, elements: a trillion is beyond every dataset and model here
BIG_REAL = 1e12  # seconds, input units: a run of 30,000 years, inputs of any scale in use


@dataclass(frozen=True, slots=True)
class Range:
    integer: bool
    lo: float
    hi: float
    nullable: bool = False
    pair: bool = False  # a [lo, hi] list of two such numbers, in order


def integer(lo: int, hi: int, *, nullable: bool = False) -> Range:
    return Range(True, lo, hi, nullable)


def real(lo: float, hi: float, *, nullable: bool = False, pair: bool = False) -> Range:
    return Range(False, lo, hi, nullable, pair)


UNIT = real(0.0, 1.0)
UNIT_PAIR = real(0.0, 1.0, pair=True)


def lookup(predicate: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = predicate
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def check_number(value: object, spec: Range, path: str, what: str) -> None:
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


def check_fields(predicate: Mapping[str, Any], fields: Mapping[str, Range], what: str) -> None:
    for path, spec in fields.items():
        present, value = lookup(predicate, path)
        if not present or (value is None and spec.nullable):
            continue
        if spec.pair:
            bounds = f"[{spec.lo:g}, {spec.hi:g}]"
            rule = f"{what}: predicate {path} must be [lower, upper] with lower <= upper in {bounds}"
            if not isinstance(value, list) or len(value) != 2:
                raise MalformedArtifactError(rule)
            for i in (0, 1):
                try:
                    check_number(value[i], spec, f"{path}[{i}]", what)
                except MalformedArtifactError as e:
                    raise MalformedArtifactError(f"{rule} ({e})") from None
            if value[0] > value[1]:
                raise MalformedArtifactError(rule)
        else:
            check_number(value, spec, path, what)


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
