"""Strict JSON decoding of a safetensors header (steps 2 and 3 of `safetensors_header`'s order).

The header bytes must be UTF-8, start with `{`, nest at most `_MAX_NESTING` levels (a linear pre-scan, so the
recursive decoder never goes deep), hold no duplicate key at any level and no `NaN`/`Infinity`, and have only
space padding after the closing brace. Nothing here checks the schema (`safetensors_header` does). Also the
renderers that quote attacker-chosen names and integers in error messages. Every refusal is a
`MalformedArtifactError` starting with the file's display name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from modelsec.errors import MalformedArtifactError
from modelsec.strict_json import DuplicateKeyError, unique_pairs

__all__ = ["LongInteger", "decode_header_json", "is_unicode_text", "json_type", "show", "show_int"]

# A valid header nests three levels deep (object > tensor object > shape list). The pre-scan allows more,
# so that it only names nesting for clearly abusive input; the schema checks refuse the rest.
_MAX_NESTING = 8
_SHOW_CHARS = 80  # How much of an attacker-chosen string an error message repeats.
# A longer integer literal is kept as its digit count (`LongInteger`), never converted: the schema check then
# names the field, and int()'s digit limit (4300 by default, its error advising to raise it) is never
# reached. 640 is the lowest limit a process can set (`sys.int_info.str_digits_check_threshold`); every
# size, offset and dimension of a valid header has at most 20 digits.
MAX_INT_DIGITS = 640

# The two literals `_parse_int` exists for: `-0`, and an integer of more than `MAX_INT_DIGITS` digits. A
# header without either has its integers converted by the decoder's C path (measured: a third of the decode
# time of a typical shard header goes to calling `_parse_int` per integer). Conservative: a match inside a
# string or in a number's fraction only takes the hooked path. The digit run is found by mapping every digit
# to one byte value and searching for the run: linear, where the equivalent regular expression `[0-9]{641}`
# retries at every digit (measured: 4.8 us of a typical 350-byte header's 30 us parse, against 0.3 us).
_DIGITS_AS_ONES = bytes.maketrans(b"0123456789", b"1" * 10)
_LONG_DIGIT_RUN = b"1" * (MAX_INT_DIGITS + 1)
_ESCAPED_PAIR = re.compile(rb"\\.", re.DOTALL)
_SIMPLE_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


@dataclass(frozen=True, slots=True)
class LongInteger:
    """A JSON integer literal of more than `MAX_INT_DIGITS` digits, never converted to an `int`."""

    digits: int

    def describe(self) -> str:
        """`an integer of N digits (too long)`, for messages."""
        return f"an integer of {self.digits} digits (too long)"


def show(text: str) -> str:
    """Quote an attacker-chosen string for an error message: backquoted, escaped, truncated."""
    if len(text) <= _SHOW_CHARS and text.isprintable():
        return f"`{text}`"
    cut = len(text) > _SHOW_CHARS
    shown = "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text[:_SHOW_CHARS]
    )
    return f"`{shown}...`" if cut else f"`{shown}`"


def show_int(value: int) -> str:
    """Render an attacker-chosen integer, abbreviating absurdly long ones (up to `MAX_INT_DIGITS` digits)."""
    if abs(value) < 10**40:
        return str(value)
    return f"{'-' if value < 0 else ''}<an integer of {value.bit_length()} bits>"


def json_type(value: object) -> str:
    """Name the JSON type of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | LongInteger):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def is_unicode_text(text: str) -> bool:
    """Whether `text` encodes to UTF-8 (JSON can escape lone surrogates, which do not encode)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_nesting(header: bytes, *, path: str) -> None:
    """Bound the bracket nesting of `header` before the recursive JSON decoder sees it.

    The scan is linear and exact for valid JSON: escaped pairs are dropped first (so every remaining quote
    delimits a string), strings next, then everything but brackets; innermost `[]`/`{}` pairs are then removed
    round by round. Each round removes at least one level, so `_MAX_NESTING` rounds accept every valid JSON
    text of that depth and nothing deeper than twice it.
    """
    unescaped = _ESCAPED_PAIR.sub(b"", header) if b"\\" in header else header
    brackets = _SIMPLE_STRING.sub(b"", unescaped).translate(None, _NOT_BRACKETS)
    for _ in range(_MAX_NESTING):
        if not brackets:
            return
        reduced = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if reduced == brackets:
            raise MalformedArtifactError(f"{path}: header is not valid JSON (unbalanced brackets)")
        brackets = reduced
    if brackets:
        raise MalformedArtifactError(f"{path}: header JSON is nested more than {_MAX_NESTING} levels deep")


def decode_header_json(header: bytes, *, path: str) -> dict[str, object]:
    """Decode the header as strict JSON with only trailing spaces after it; return the top-level object."""
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedArtifactError(f"{path}: header is not valid UTF-8 (at byte {e.start})") from e
    if not text.startswith("{"):
        raise MalformedArtifactError(f"{path}: header does not start with `{{` (not a JSON object)")
    _check_nesting(header, path=path)

    # One decoder per integer mode, shared by every call and thread (as `json.loads` shares its own): a
    # decoder holds no state between calls, and building one per header cost a tenth of a header's parse.
    decoder = _DECODER_WITH_INT_HOOK if _needs_int_hook(header) else _DECODER
    try:
        top, end = decoder.raw_decode(text)
    except DuplicateKeyError as e:
        raise MalformedArtifactError(f"{path}: header JSON has a duplicate key {show(e.key)}") from None
    except _ForbiddenConstant as e:
        raise MalformedArtifactError(
            f"{path}: header JSON contains `{e.name}`, which strict JSON forbids"
        ) from None
    except ValueError as e:
        # JSONDecodeError, and the integer-digits limit of int(); neither message repeats input text.
        raise MalformedArtifactError(f"{path}: header is not valid JSON: {e}") from e
    if text[end:].strip(" "):
        raise MalformedArtifactError(
            f"{path}: header has bytes other than spaces after its closing `}}` (at character {end}); "
            "only space (0x20) padding is allowed"
        )
    if not isinstance(top, dict):  # Unreachable after the `{` check; kept for the type checker.
        raise MalformedArtifactError(f"{path}: header is not a JSON object")
    return top


def _needs_int_hook(header: bytes) -> bool:
    """Whether `header` may hold `-0` or an integer literal of more than `MAX_INT_DIGITS` digits."""
    if b"-0" in header:
        return True
    return len(header) > MAX_INT_DIGITS and _LONG_DIGIT_RUN in header.translate(_DIGITS_AS_ONES)


def _parse_int(literal: str) -> int | float | LongInteger:
    """Decode a JSON integer, keeping `-0` a float as serde_json (and so safetensors) does.

    `-0` is then refused by the integer checks like any other non-integer, with the tensor named, so that
    this parser never accepts a header that safetensors itself refuses. A literal of more than
    `MAX_INT_DIGITS` digits becomes a `LongInteger`, refused by the same checks.
    """
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        return LongInteger(digits)
    return -0.0 if literal == "-0" else int(literal)


# Signals from the shared decoder's hooks (with `DuplicateKeyError`), turned into `MalformedArtifactError`
# naming the file by `decode_header_json` (the hooks cannot know the file); never raised to callers.
class _ForbiddenConstant(Exception):
    def __init__(self, name: str) -> None:
        self.name = name


def _reject_constant(name: str) -> object:
    raise _ForbiddenConstant(name)


_DECODER = json.JSONDecoder(object_pairs_hook=unique_pairs, parse_constant=_reject_constant, strict=True)
_DECODER_WITH_INT_HOOK = json.JSONDecoder(
    object_pairs_hook=unique_pairs, parse_constant=_reject_constant, parse_int=_parse_int, strict=True
)
