"""The predicate types modelsec writes and reads: one registry from type URI to what modelsec knows of it.

Each predicate has one module that parses, builds and checks it: `modelsec.attestations.predicates.oms`
(the OMS weights manifest, `https://model_signing/signature/v1.0`), `modelsec.attestations.predicates.gate`
(`https://modelsec.dev/robustness-gate/v1`) and `modelsec.attestations.predicates.watermark`
(`https://modelsec.dev/watermark/v1`) about a model root digest, and
`modelsec.attestations.predicates.oci_binding` (`https://modelsec.dev/oci-binding/v2`) about an OCI manifest,
naming the model it carries, and `modelsec.attestations.predicates.load_receipt`
(`https://modelsec.dev/load-receipt/v1`) about a load of a model by a node, and
`modelsec.attestations.predicates.load_snapshot` (`https://modelsec.dev/load-snapshot/v1`) about a node's
loaded models. `PREDICATE_KINDS` maps each
type URI to a `PredicateKind`: the role a key must hold to sign it, its parser, its builder and its number
checker. Every caller that depends on the predicate type (the verifier choosing the signing role,
`inspect`, the service's SignStatement and its key roles, `check_predicate_numbers`) looks the type up
here instead of comparing URIs, and a type that is not registered is refused by name (`predicate_kind`).

A new predicate touches: its module here (parse, build, check), one entry in `_KINDS`, and its requirement
in `modelsec.policy` (with its role among the roles a policy key may hold). Nothing else compares type URIs;
what its evidence must show is judged, per role, by `modelsec.verifier.attestations` (one handler there).

What the number checkers check: the type and range of every numeric field of the predicate *that is present*
(and `finishedAt` / `embeddedAt` as RFC 3339 with a zone, years 1970-9998), and `correct <= total`. What is
not: which fields are required (the parsers) and what values a policy accepts
(`modelsec.verifier.attestations`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from modelsec.errors import AttestationError

if TYPE_CHECKING:
    from modelsec.attestations._numbers import parse_rfc3339
    from modelsec.attestations.predicates.gate import check_gate_predicate
    from modelsec.attestations.predicates.watermark import check_watermark_predicate
    from modelsec.attestations.statement import Statement
    from modelsec.limits import Limits

    PREDICATE_KINDS: Mapping[str, PredicateKind]

__all__ = [
    "PREDICATE_KINDS",
    "NumberChecker",
    "PredicateKind",
    "PredicateParser",
    "check_gate_predicate",
    "check_predicate_numbers",
    "check_watermark_predicate",
    "parse_rfc3339",
    "predicate_kind",
]


class PredicateParser(Protocol):
    """Parses a statement's predicate strictly into its typed form (e.g. `parse_gate_statement`)."""

    def __call__(self, statement: Statement, *, what: str, limits: Limits) -> Any:
        """The typed predicate; raises `MalformedArtifactError` or `AttestationError` naming the field."""
        ...


class NumberChecker(Protocol):
    """Checks the type and range of every number present in a predicate (e.g. `check_gate_predicate`)."""

    def __call__(self, predicate: Mapping[str, Any], *, what: str) -> None:
        """Raises `MalformedArtifactError` naming the first field out of its range."""
        ...


@dataclass(frozen=True, slots=True)
class PredicateKind:
    """What modelsec knows of one predicate type.

    Attributes:
        predicate_type: The predicateType URI.
        role: The role a trusted key (or authority) must hold to sign it: `weights`, `watermark` or `gate`;
            `node` for a load receipt, which no policy key signs (a node's TPM attestation key quotes it:
            `modelsec.verifier.receipts`).
        parse: Its strict parser, from the statement (not from any trust decision: a verifier calls it on
            a statement whose signature and subject it checked).
        build: Its builder of the unsigned statement (arguments per predicate: `manifest_statement`,
            `gate_statement`, `watermark_statement`).
        check_numbers: Its number checker, or None where the parser alone reads the numbers (the OMS
            manifest: digests and names, no measurements).
        records_run: Whether the predicate may record `runBy` (a run a modelsec server performed:
            `modelsec.attestations.predicates.run_by`).
        about: What the statement's subject is: `model` (a model root digest: evidence about the model)
            or `oci-manifest` (an OCI manifest digest: the binding, evidence for no model requirement), or
            `load` (a load of the model by a node: a receipt, evidence for no model requirement), or `node`
            (a node's set of loaded models: a snapshot, evidence for no model requirement).
    """

    predicate_type: str
    role: str
    parse: PredicateParser
    build: Callable[..., Statement]
    check_numbers: NumberChecker | None = None
    records_run: bool = False
    about: str = "model"


@functools.cache
def _kinds() -> Mapping[str, PredicateKind]:
    """`PREDICATE_KINDS`, built on first use.

    The predicate modules are imported here, not with this package: the verified loader imports
    `modelsec.attestations.predicates.oms` (and so this package), and its start-up would otherwise pay for
    every other predicate's module.
    """
    from modelsec.attestations.predicates import (
        gate,
        load_receipt,
        load_snapshot,
        oci_binding,
        oms,
        watermark,
    )

    kinds = (
        PredicateKind(oms.OMS_PREDICATE_TYPE, "weights", oms.parse_manifest, oms.manifest_statement),
        PredicateKind(
            gate.GATE_PREDICATE_TYPE,
            "gate",
            gate.parse_gate_statement,
            gate.gate_statement,
            gate.check_gate_predicate,
            records_run=True,
        ),
        PredicateKind(
            watermark.WATERMARK_PREDICATE_TYPE,
            "watermark",
            watermark.parse_watermark_statement,
            watermark.watermark_statement,
            watermark.check_watermark_predicate,
            records_run=True,
        ),
        PredicateKind(
            oci_binding.OCI_BINDING_PREDICATE_TYPE,
            "weights",
            oci_binding.parse_binding_statement,
            oci_binding.binding_statement,
            about="oci-manifest",
        ),
        PredicateKind(
            load_receipt.LOAD_RECEIPT_PREDICATE_TYPE,
            "node",
            load_receipt.parse_receipt_statement,
            load_receipt.receipt_statement,
            about="load",
        ),
        PredicateKind(
            load_snapshot.LOAD_SNAPSHOT_PREDICATE_TYPE,
            "node",
            load_snapshot.parse_snapshot_statement,
            load_snapshot.snapshot_statement,
            about="node",
        ),
    )
    return MappingProxyType({k.predicate_type: k for k in kinds})


_LAZY = {
    "check_gate_predicate": "modelsec.attestations.predicates.gate",
    "check_watermark_predicate": "modelsec.attestations.predicates.watermark",
    "parse_rfc3339": "modelsec.attestations._numbers",
}


def __getattr__(name: str) -> Any:
    """`PREDICATE_KINDS` and the re-exported checkers, imported on first use (PEP 562).

    `PREDICATE_KINDS` (a read-only `Mapping[str, PredicateKind]`) is every predicate type modelsec reads and
    writes, by type URI.
    """
    if name == "PREDICATE_KINDS":
        value: Any = _kinds()
    elif name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def predicate_kind(predicate_type: str, *, what: str) -> PredicateKind:
    """The registered kind of `predicate_type`.

    Args:
        predicate_type: The statement's predicateType URI.
        what: Names the bundle or request in errors.

    Returns:
        Its `PredicateKind`.

    Raises:
        AttestationError: The type is not one modelsec knows (`{what}: unknown predicateType '...'`).
    """
    kind = _kinds().get(predicate_type)
    if kind is None:
        raise AttestationError(f"{what}: unknown predicateType {predicate_type!r}")
    return kind


def check_predicate_numbers(statement: Statement, *, what: str) -> None:
    """The number checker of the statement's predicate type; other types pass unchecked.

    Raises:
        MalformedArtifactError: As the checker for the statement's predicate type.
    """
    kind = _kinds().get(statement.predicate_type)
    if kind is not None and kind.check_numbers is not None:
        kind.check_numbers(statement.predicate, what=what)
