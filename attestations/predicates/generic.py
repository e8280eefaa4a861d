"""Statements of any predicate type about a model (`modelsec attest sign --predicate-type URI --predicate F`).

A user's own predicate (SLSA provenance, an SBOM, an evaluation report, a policy-controller or Kyverno
attestation) is signed and stored like modelsec's own: an in-toto Statement v1 whose one subject is the
model root digest (the identity every requirement reads, DESIGN.md decision 1):

```json
{"_type": "https://in-toto.io/Statement/v1",
 "subject": [{"name": "<model dir name>", "digest": {"sha256": "<model root digest, hex>"}}],
 "predicateType": "<URI>",
 "predicate": {"...": "the FILE's JSON object, as given"}}
```

What is checked before signing (`model_statement`): the type is an absolute `https://` or `http://` URI (as
the in-toto Statement v1 specification asks: "URI identifying the type of the Predicate"), at most
`_MAX_TYPE_CHARS` characters, with no whitespace or control characters; the predicate is strict JSON
(`modelsec.strict_json`: no duplicate keys, no NaN) and an object, at most `Limits.max_bundle_bytes`
bytes. A predicate type modelsec registers (`modelsec.attestations.predicates.PREDICATE_KINDS`) is held to its
own parser and number checker, so a gate or watermark statement signed this way reads as the dedicated
commands' would; a type about something other than a model (the OCI binding) is refused here. What is not
checked: the meaning of a foreign predicate (the policy's conditions read it; `modelsec.verifier.attestations`
returns verified statements by type).
"""

from __future__ import annotations

import re
from typing import Any

from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.strict_json import strict_loads

__all__ = ["check_predicate_type", "model_statement", "parse_predicate_document", "predicate_slug"]

_MAX_TYPE_CHARS = 512
_TYPE_URI = re.compile(r"https?://[^\s/?#]+(?:/[^\s]*)?")


def check_predicate_type(predicate_type: str, *, what: str) -> str:
    """`predicate_type` when it is an absolute http(s) URI of at most 512 printable characters.

    Raises:
        MalformedArtifactError: It is not (the message names `what`).
    """
    if (
        not isinstance(predicate_type, str)
        or len(predicate_type) > _MAX_TYPE_CHARS
        or not predicate_type.isprintable()
        or _TYPE_URI.fullmatch(predicate_type) is None
    ):
        raise MalformedArtifactError(
            f"{what}: predicateType {str(predicate_type)[:80]!r} is not an absolute http(s) URI of at most "
            f"{_MAX_TYPE_CHARS} printable characters"
        )
    return predicate_type


def predicate_slug(predicate_type: str) -> str:
    """A file-name-safe form of a type URI (`https://slsa.dev/provenance/v1` -> `slsa.dev-provenance-v1`)."""
    rest = predicate_type.split("://", 1)[-1]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", rest).strip("-.")
    return slug[:80] or "predicate"


def parse_predicate_document(data: bytes, *, what: str, limits: Limits | None = None) -> dict[str, Any]:
    """A predicate file's JSON object (strict JSON, at most `limits.max_bundle_bytes` bytes).

    Raises:
        MalformedArtifactError: Too large, not strict JSON, or not an object (names `what`).
    """
    limit = (limits or Limits()).max_bundle_bytes
    if len(data) > limit:
        raise MalformedArtifactError(f"{what}: the predicate is larger than {limit} bytes")
    value = strict_loads(data, what=what)
    if not isinstance(value, dict):
        raise MalformedArtifactError(
            f"{what}: the predicate must be a JSON object, not {type(value).__name__}"
        )
    return value


def model_statement(
    root_digest: str,
    predicate_type: str,
    predicate: dict[str, Any],
    *,
    name: str,
    what: str,
    limits: Limits | None = None,
) -> Statement:
    """The unsigned statement that `predicate` of `predicate_type` holds about the model `root_digest`.

    Args:
        root_digest: The model root digest (hex SHA-256).
        predicate_type: The predicateType URI (`check_predicate_type`).
        predicate: The predicate object (from `parse_predicate_document`).
        name: The subject name (informational: the model directory's name).
        what: Names the predicate's source in errors.
        limits: For the parser of a registered type.

    Returns:
        The statement; nothing is signed.

    Raises:
        MalformedArtifactError: The type is not a URI, the root digest is not SHA-256 hex, a registered
            type's predicate is malformed or has a number out of range, or the type is about an OCI
            manifest rather than a model.
        AttestationError: A registered type's parser refuses the predicate.
    """
    from modelsec.attestations.predicates import PREDICATE_KINDS

    check_predicate_type(predicate_type, what=what)
    if not is_sha256_hex(root_digest):
        raise MalformedArtifactError(f"{what}: model root digest {root_digest!r} is not SHA-256 hex")
    statement = Statement((Subject(name, {"sha256": root_digest}),), predicate_type, predicate)
    kind = PREDICATE_KINDS.get(predicate_type)
    if kind is not None:
        if kind.about != "model":
            raise MalformedArtifactError(
                f"{what}: predicateType {predicate_type!r} is about an {kind.about}, not a model"
            )
        if kind.check_numbers is not None:
            kind.check_numbers(predicate, what=what)
        kind.parse(statement, what=what, limits=limits or Limits())
    return statement
