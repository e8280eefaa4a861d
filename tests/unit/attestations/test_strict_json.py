"""The strict JSON reader every signed document goes through."""

from __future__ import annotations

import pytest

from modelsec.errors import MalformedArtifactError
from modelsec.strict_json import strict_loads


@pytest.mark.parametrize(
    ("doc", "mentions"),
    [
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": Infinity}', "Infinity"),
        (b'{"a": 1e999}', "out of range"),
        (b'{"a": -1e999}', "out of range"),
        (b'{"a": "\xff"}', "invalid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
    ],
)
def test_refused(doc: bytes, mentions: str) -> None:
    with pytest.raises(MalformedArtifactError, match=mentions):
        strict_loads(doc, what="doc")


def test_accepted() -> None:
    assert strict_loads(b'{"a": [1, 2.5, 1e308, -0.0, "\\u00e8", null, true]}', what="doc") == {
        "a": [1, 2.5, 1e308, -0.0, "è", None, True]
    }


@pytest.mark.parametrize("depth", [2_000, 200_000])
def test_deep_nesting_is_named_not_a_python_internal(depth: int) -> None:
    """User trial 2: a bundle (or AdmissionReview) nested 2,000+ deep said "maximum recursion depth exceeded
    while decoding a JSON array from a unicode string"."""
    with pytest.raises(MalformedArtifactError) as refused:
        strict_loads(b"[" * depth + b"]" * depth, what="b/model.sig")
    assert str(refused.value) == "b/model.sig: invalid JSON: arrays or objects nested too deeply to decode"
