"""The predicate types modelsec writes and reads, and the range check of their numbers by type.

Each predicate has one module that parses, builds and checks it: `modelsec.attestations.predicates.gate`
(`https://modelsec.dev/robustness-gate/v1`) and `modelsec.attestations.predicates.watermark`
(`https://modelsec.dev/watermark/v1`); the OMS weights manifest is
`modelsec.attestations.predicates.oms`. This module keeps the names earlier callers import
(`check_gate_predicate`, `check_watermark_predicate`, `parse_rfc3339`) and dispatches
`check_predicate_numbers` by predicate type.

What is checked: the type and range of every numeric field of the predicate *that is present* (and
`finishedAt` / `embeddedAt` as RFC 3339 with a zone, years 1970-9998), and `correct <= total`. What is not:
which fields are required (the `parse_*` functions of the predicate modules) and what values a policy
accepts (`modelsec.verifier.attestations`).
"""

from __future__ import annotations

from modelsec.attestations._numbers import parse_rfc3339
from modelsec.attestations.predicates.gate import check_gate_predicate
from modelsec.attestations.predicates.watermark import check_watermark_predicate
from modelsec.attestations.statement import GATE_PREDICATE_TYPE, WATERMARK_PREDICATE_TYPE, Statement

__all__ = ["check_gate_predicate", "check_predicate_numbers", "check_watermark_predicate", "parse_rfc3339"]


def check_predicate_numbers(statement: Statement, *, what: str) -> None:
    """`check_gate_predicate` or `check_watermark_predicate` by predicate type; other types pass unchecked.

    Raises:
        MalformedArtifactError: As the checker for the statement's predicate type.
    """
    if statement.predicate_type == GATE_PREDICATE_TYPE:
        check_gate_predicate(statement.predicate, what=what)
    elif statement.predicate_type == WATERMARK_PREDICATE_TYPE:
        check_watermark_predicate(statement.predicate, what=what)
