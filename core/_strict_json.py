"""Strict JSON decoding shared by every parser of untrusted input (bundles, manifests, side files).

RFC 8259 leaves duplicate member names undefined and Python keeps the last one, so two parsers of the same
bytes can disagree (the classic "JSON interoperability" confusion); NaN/Infinity are not JSON at all.
Both are refused here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from modelsec.errors import MalformedArtifactError

__all__ = ["strict_loads"]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-JSON constant {name}")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to inf: Infinity by another spelling
        raise ValueError(f"number {text[:40]} is out of range (not finite)")
    return value


def strict_loads(data: bytes | str, *, what: str) -> Any:
    """Decode JSON, refusing duplicate keys, NaN/Infinity and invalid UTF-8.

    Args:
        data: The raw document.
        what: Names the document in the error (file name and role).

    Returns:
        The decoded value (dict, list, str, int, float, bool or None).

    Raises:
        MalformedArtifactError: The document is not strict JSON.
    """

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in items:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, object_pairs_hook=pairs, parse_constant=_refuse_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MalformedArtifactError(f"{what}: invalid JSON: {e}") from e
