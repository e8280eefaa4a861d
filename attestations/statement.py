"""in-toto Statement v1: build, serialise and strictly parse.

Source: https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md. The statement is the DSSE
payload (payloadType `application/vnd.in-toto+json`). modelsec serialises with sorted keys and no
whitespace (as the corpus and `model_signing`'s key bundles do byte-for-byte where possible) and never
re-serialises a payload it verifies: parsing works on the exact signed bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeGuard

from modelsec.errors import MalformedArtifactError
from modelsec.strict_json import strict_loads

__all__ = [
    "STATEMENT_TYPE",
    "Statement",
    "Subject",
    "is_sha256_hex",
    "parse_statement",
    "serialize_statement",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# The predicate types are not named here: each lives in its predicate's module, and the types modelsec
# knows are registered in `modelsec.attestations.predicates`.
_HEX_DIGEST = re.compile(r"[0-9a-f]{32,128}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_SUBJECTS = 1024


def is_sha256_hex(value: object) -> TypeGuard[str]:
    """Whether `value` is a SHA-256 digest as 64 lowercase hex digits, and nothing else (no newline)."""
    return isinstance(value, str) and _SHA256_HEX.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Subject:
    """An in-toto ResourceDescriptor used as subject: a name (informational) and digests by algorithm."""

    name: str
    digest: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Statement:
    """A parsed in-toto Statement v1.

    Attributes:
        subjects: At least one subject.
        predicate_type: The predicateType URI.
        predicate: The predicate object (read-only view of the parsed JSON).
        raw: The exact payload bytes the statement was parsed from (empty when built locally).
    """

    subjects: tuple[Subject, ...]
    predicate_type: str
    predicate: Mapping[str, Any]
    raw: bytes = field(default=b"", compare=False)

    def to_json_object(self) -> dict[str, Any]:
        """The statement as a JSON-ready dict."""
        return {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": s.name, "digest": dict(s.digest)} for s in self.subjects],
            "predicateType": self.predicate_type,
            "predicate": _thaw(self.predicate),
        }


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


def serialize_statement(statement: Statement) -> bytes:
    """Serialise `statement` as compact JSON with sorted keys (UTF-8, no ASCII escaping)."""
    return json.dumps(
        statement.to_json_object(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def parse_statement(payload: bytes, *, what: str, predicate_type: str | None = None) -> Statement:
    """Parse an in-toto Statement v1 strictly from the exact signed payload bytes.

    Checks `_type` (exactly `https://in-toto.io/Statement/v1`), a non-empty `subject` list whose entries
    have a string `name` and a non-empty `digest` map of lowercase hex values, a string `predicateType`
    (equal to `predicate_type` when given) and an object `predicate`. Unknown top-level fields are refused.
    The predicate's contents are not interpreted here.

    Args:
        payload: The DSSE payload bytes (after signature verification).
        what: Names the bundle in errors.
        predicate_type: The required predicateType, or None to accept any.

    Returns:
        The statement, with `raw` set to `payload`.

    Raises:
        MalformedArtifactError: The payload is not a well-formed Statement v1, or has another predicateType.
    """
    doc = strict_loads(payload, what=f"{what}: statement")
    if not isinstance(doc, dict):
        raise MalformedArtifactError(f"{what}: statement is not a JSON object")
    unknown = set(doc) - {"_type", "subject", "predicateType", "predicate"}
    if unknown:
        raise MalformedArtifactError(f"{what}: statement has unknown fields {sorted(unknown)}")
    if doc.get("_type") != STATEMENT_TYPE:
        raise MalformedArtifactError(
            f"{what}: statement _type must be {STATEMENT_TYPE!r}, got {doc.get('_type')!r}"
        )
    ptype = doc.get("predicateType")
    if not isinstance(ptype, str):
        raise MalformedArtifactError(f"{what}: statement predicateType is missing or not a string")
    if predicate_type is not None and ptype != predicate_type:
        raise MalformedArtifactError(f"{what}: predicateType must be {predicate_type!r}, got {ptype!r}")
    predicate = doc.get("predicate")
    if not isinstance(predicate, dict):
        raise MalformedArtifactError(
            f"{what}: statement predicate is missing or not an object (no resources to verify)"
        )
    raw_subjects = doc.get("subject")
    if not isinstance(raw_subjects, list) or not raw_subjects or len(raw_subjects) > _MAX_SUBJECTS:
        raise MalformedArtifactError(f"{what}: statement subject must be a non-empty list")
    subjects = []
    for i, entry in enumerate(raw_subjects):
        if not isinstance(entry, dict) or not isinstance(entry.get("name", ""), str):
            raise MalformedArtifactError(f"{what}: subject[{i}] is malformed")
        digest = entry.get("digest")
        if not isinstance(digest, dict) or not digest:
            raise MalformedArtifactError(f"{what}: subject[{i}].digest must be a non-empty object")
        for alg, value in digest.items():
            if not isinstance(value, str) or not _HEX_DIGEST.fullmatch(value):
                raise MalformedArtifactError(f"{what}: subject[{i}].digest.{alg} is not lowercase hex")
        subjects.append(Subject(name=entry.get("name", ""), digest=MappingProxyType(dict(digest))))
    return Statement(
        subjects=tuple(subjects),
        predicate_type=ptype,
        predicate=MappingProxyType(predicate),
        raw=payload,
    )
