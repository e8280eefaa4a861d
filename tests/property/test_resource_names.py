"""Property: `validate_resource_name` accepts exactly the names its rules allow, on its fast path and off it.

The one-scan path for clean ASCII names must agree with the rule-by-rule path on every name: an oracle
written from the docstring's rules (at most `max_path_bytes` UTF-8 bytes, no leading `/`, no backslash,
control character, surrogate or `%XX` escape, no empty, `.` or `..` segment) judges random names drawn
mostly from the characters the rules are about.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.model_files import validate_resource_name

_NAMES = st.text(
    alphabet=st.sampled_from(
        ["a", "Z", "0", "e", ".", "/", "%", "2", " ", "-", "\\", "\x00", "\x1f", "\x7f", "é", "\ud800", "~"]
    ),
    max_size=14,
)


def _allowed(name: str, limit: int) -> bool:
    return (
        bool(name)
        and len(name.encode("utf-8", "surrogatepass")) <= limit
        and not name.startswith("/")
        and "\\" not in name
        and not any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in name)
        and re.search("%[0-9A-Fa-f]{2}", name) is None
        and all(segment not in ("", ".", "..") for segment in name.split("/"))
    )


@settings(max_examples=2000, deadline=None)
@given(name=_NAMES, limit=st.sampled_from([4, 9, 4096]))
def test_a_name_is_accepted_exactly_when_the_rules_allow_it(name: str, limit: int) -> None:
    try:
        validate_resource_name(name, what="manifest", limits=Limits(max_path_bytes=limit))
        accepted = True
    except MalformedArtifactError as e:
        assert e.diagnostics().startswith("manifest: ")
        accepted = False
    assert accepted == _allowed(name, limit), repr(name)
