"""Strict JSON decoding shared by every parser of untrusted input (bundles, manifests, side files).

RFC 8259 leaves duplicate member names undefined and Python keeps the last one, so two parsers of the same
bytes can disagree (the classic "JSON interoperability" confusion); NaN/Infinity are not JSON at all.
Both are refused here. So are numbers no other implementation could hold: an integer outside the 64-bit range
(signed or unsigned: RFC 8259 section 6 warns that larger ones are not interoperable, and Python's unbounded
ints raise `OverflowError` the moment they meet a float, e.g. `10**400 < 0.5` is fine but
`math.isfinite(10**400)` is not) and a float that overflows to infinity.
"""

from __future__ import annotations

import json
import math
from typing import Any

from modelsec.errors import MalformedArtifactError

__all__ = ["MAX_JSON_INT", "MIN_JSON_INT", "DuplicateKeyError", "strict_loads", "unique_pairs"]

MIN_JSON_INT = -(2**63)
MAX_JSON_INT = 2**64 - 1
# The longest decimal spelling of an integer in range (with a sign); longer text is refused unread, before
# `int()` does quadratic work on it.
_MAX_INT_CHARS = len(str(MIN_JSON_INT))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-JSON constant {name}")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to inf: Infinity by another spelling
        raise ValueError(f"number {text[:40]} is out of range (not finite)")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > _MAX_INT_CHARS:
        raise ValueError(f"integer {text[:20]}... ({len(text)} digits) is out of the 64-bit range")
    value = int(text)
    if not MIN_JSON_INT <= value <= MAX_JSON_INT:
        raise ValueError(f"integer {text} is out of the 64-bit range")
    return value


class DuplicateKeyError(ValueError):
    """A JSON object names `key` twice (raised by `unique_pairs`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An `object_pairs_hook` that builds the object and refuses a key named twice (`DuplicateKeyError`).

    The members are walked only when the dict came out smaller than the list of pairs, i.e. on a duplicate.
    """
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return result


def strict_loads(data: bytes | str, *, what: str, bounded_ints: bool = True) -> Any:
    """Decode JSON, refusing duplicate keys, NaN/Infinity, out-of-range numbers and invalid UTF-8.

    Integers must lie in [-2**63, 2**64 - 1] (int64 or uint64) and floats must be finite, so every consumer
    can do arithmetic on what it gets without `OverflowError`; field-specific ranges are the consumer's.

    Args:
        data: The raw document.
        what: Names the document in the error (file name and role).
        bounded_ints: Refuse integers outside the 64-bit range (statements, bundles, admission reviews).
            False for a model's own JSON files, which real frameworks write with larger integers
            (transformers' `model_max_length` is 10**30); Python's digit limit still bounds the parse.

    Returns:
        The decoded value (dict, list, str, int, float, bool or None).

    Raises:
        MalformedArtifactError: The document is not strict JSON.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(
            text,
            object_pairs_hook=unique_pairs,
            parse_constant=_refuse_constant,
            parse_float=_finite,
            parse_int=_bounded_int if bounded_ints else int,
        )
    except RecursionError:
        raise MalformedArtifactError(
            f"{what}: invalid JSON: arrays or objects nested too deeply to decode"
        ) from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MalformedArtifactError(f"{what}: invalid JSON: {e}") from e
