"""The robustness-gate predicate (`https://modelsec.dev/robustness-gate/v1`): parse, build and check it.

The one home of the gate predicate's format (the producer is `modelsec.robustness.attestation`, the consumer
`modelsec.verifier.attestations`; both go through this module). `check_gate_predicate` checks the type and
range of every number that is present (before any arithmetic; ranges far beyond any real run, far below
anything that overflows); `parse_gate_predicate` also requires the fields a verifier reads and returns them
typed. What a policy accepts (attack, minimum eps, accuracy rule, freshness) is decided by
`modelsec.verifier.attestations` on the parsed `GatePredicate`; how the run was performed (by a modelsec
server, on an allowed dataset, with enough PGD steps and restarts) is checked here, by `check_gate_run`, which
the verifier calls with the policy's requirement.

`build_gate_predicate` builds the predicate of a run (the run's JSON form, `GateResult.to_json()`, plus the
model it ran on) and `gate_statement` the unsigned statement; the predicate reads:

```json
{"attack": "pgd-linf",
 "parameters": {"norm": "Linf", "eps": 0.3, "stepSize": 0.01, "steps": 40, "restarts": 1,
                "randomStart": true, "loss": "cross-entropy", "seed": 0, "inputRange": [0.0, 1.0],
                "batchSize": 256},
 "dataset": {"digest": {"sha256": "<hex>"}, "samples": 5000, "source": "mnist.npz", "format": "npz"},
 "results": {"clean":  {"correct": 4950, "total": 5000, "accuracy": 0.99, "wilson95": [0.987, 0.992]},
             "robust": {"correct": 4700, "total": 5000, "accuracy": 0.94, "wilson95": [0.933, 0.946]}},
 "gate": {"metric": "robustAccuracy", "threshold": 0.85, "rule": "point", "minSamples": 100,
          "value": 0.94, "verdict": "PASSED", "reasons": []},
 "sanity": {"enabled": true, "samples": 256, "tolerance": 0.02, "largeEps": null,
            "largeEpsMaxAccuracy": 0.05, "checks": [{"name": "eps_zero", "passed": true, "detail": "..."}]},
 "environment": {"device": "cpu", "deviceName": "cpu", "worldSize": 1, "backend": null,
                 "dtypes": {"inputs": "float32", "parameters": "float32", "compute": "float32",
                            "projection": "float32"},
                 "fastPaths": {"channelsLast": false, "bf16Autocast": false, "torchCompile": false},
                 "torch": "2.13.0+cpu", "deterministic": true},
 "model": {"architecture": "lenet5:lenet5", "weights": ["model.safetensors"]},
 "elapsedSeconds": 12.345,
 "finishedAt": "2025-01-31T12:00:00Z",
 "runBy": {"server": "signer.example.org", "requester": "spiffe://example.org/ci/release"}}
```

`runBy` (`modelsec.attestations.predicates.run_by`) records the server and the requester of a run a modelsec
server performed (RunGate); it is absent from gates run elsewhere (`modelsec gate pgd`). A FAILED run is a
valid predicate too (the verdict is part of what is signed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol

from modelsec.attestations._numbers import (
    BIG_REAL,
    COUNT,
    UNIT,
    UNIT_PAIR,
    Range,
    check_fields,
    lookup,
    parse_rfc3339,
)
from modelsec.attestations._numbers import integer as _int
from modelsec.attestations._numbers import real as _real
from modelsec.attestations.predicates.run_by import RUN_BY_FIELD, RunBy, parse_run_by
from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import AttestationError, MalformedArtifactError
from modelsec.limits import Limits

__all__ = [
    "GATE_PREDICATE_TYPE",
    "GatePredicate",
    "GateRunRequirement",
    "SanityCheck",
    "build_gate_predicate",
    "check_gate_predicate",
    "check_gate_run",
    "gate_statement",
    "parse_gate_predicate",
    "parse_gate_statement",
]

GATE_PREDICATE_TYPE = "https://modelsec.dev/robustness-gate/v1"

_GATE_FIELDS: dict[str, Range] = {
    # eps and stepSize are in input units (GateConfig accepts any finite clip range, e.g. [0, 255]).
    "parameters.eps": _real(0.0, BIG_REAL),
    "parameters.stepSize": _real(0.0, BIG_REAL),
    "parameters.steps": _int(1, 10**7),
    "parameters.restarts": _int(1, 10**5),
    "parameters.seed": _int(-(2**63), 2**64 - 1),
    "parameters.batchSize": _int(1, 2**31),
    "parameters.inputRange": _real(-BIG_REAL, BIG_REAL, pair=True),
    "dataset.samples": _int(0, COUNT),
    "results.clean.correct": _int(0, COUNT),
    "results.clean.total": _int(0, COUNT),
    "results.clean.accuracy": UNIT,
    "results.clean.wilson95": UNIT_PAIR,
    "results.robust.correct": _int(0, COUNT),
    "results.robust.total": _int(0, COUNT),
    "results.robust.accuracy": UNIT,
    "results.robust.wilson95": UNIT_PAIR,
    "gate.threshold": UNIT,
    "gate.minSamples": _int(0, COUNT),
    "gate.value": UNIT,
    "sanity.samples": _int(0, COUNT),
    "sanity.tolerance": UNIT,
    "sanity.largeEps": _real(0.0, BIG_REAL, nullable=True),
    "sanity.largeEpsMaxAccuracy": UNIT,
    "environment.worldSize": _int(1, 2**20),
    "elapsedSeconds": _real(0.0, BIG_REAL),
}


def _check_counts(predicate: Mapping[str, Any], what: str) -> None:
    for part in ("clean", "robust"):
        _, correct = lookup(predicate, f"results.{part}.correct")
        _, total = lookup(predicate, f"results.{part}.total")
        if isinstance(correct, int) and isinstance(total, int) and correct > total:
            raise MalformedArtifactError(
                f"{what}: predicate results.{part}.correct {correct} exceeds results.{part}.total {total}"
            )


def check_gate_predicate(predicate: Mapping[str, Any], *, what: str) -> None:
    """Check the type and range of every number in a robustness-gate predicate (see the module docstring).

    Fields that are absent are not required here (`parse_gate_predicate` requires them).

    Args:
        predicate: The `https://modelsec.dev/robustness-gate/v1` predicate.
        what: Names the bundle or request in errors.

    Raises:
        MalformedArtifactError: A number has the wrong type or is out of range, `correct` exceeds
            `total`, `finishedAt` is present and not an RFC 3339 time in range, `dataset.digest.sha256` is
            present and not 64 lowercase hex digits, or `runBy` is present and malformed.
    """
    check_fields(predicate, _GATE_FIELDS, what)
    _check_counts(predicate, what)
    if "finishedAt" in predicate:
        parse_rfc3339(predicate["finishedAt"], field="finishedAt", what=what)
    _dataset_digest(predicate, what)
    parse_run_by(predicate, what=what)


def _dataset_digest(predicate: Mapping[str, Any], what: str) -> str | None:
    present, digest = lookup(predicate, "dataset.digest.sha256")
    if not present:
        return None
    if not isinstance(digest, str) or not is_sha256_hex(digest):
        raise MalformedArtifactError(
            f"{what}: predicate dataset.digest.sha256 is not 64 lowercase hex digits"
        )
    return digest


@dataclass(frozen=True, slots=True)
class SanityCheck:
    """One sanity check of the gate run (e.g. `eps_zero`: at eps 0 the attack changes nothing)."""

    name: str
    passed: bool


@dataclass(frozen=True, slots=True)
class GatePredicate:
    """A parsed robustness-gate predicate: the fields a verifier reads, typed, and the whole predicate.

    Parsed is not trusted: the statement's signature and subject are checked by the verifier, and whether
    the values meet a policy is decided there.

    Attributes:
        attack: The attack name (`pgd-linf`).
        eps: The perturbation budget, in input units.
        verdict: `PASSED` or `FAILED` as recorded by the gate.
        robust_total: Samples evaluated under attack.
        robust_accuracy: Accuracy under attack, in [0, 1].
        robust_wilson95: The 95% Wilson interval of `robust_accuracy` (lower <= accuracy <= upper).
        sanity_checks: The sanity checks run, at least one.
        finished_at: When the run finished (UTC), or None when not recorded.
        predicate: The whole predicate, read-only.
        steps: PGD iterations per restart (`parameters.steps`), or None when not recorded.
        restarts: PGD random restarts (`parameters.restarts`), or None when not recorded.
        dataset_sha256: The evaluation set's digest (`dataset.digest.sha256`), or None when not recorded.
        run_by: Who ran the gate, when a modelsec server ran it (`runBy`), else None.
    """

    attack: str
    eps: float
    verdict: str
    robust_total: int
    robust_accuracy: float
    robust_wilson95: tuple[float, float]
    sanity_checks: tuple[SanityCheck, ...]
    finished_at: datetime | None
    predicate: Mapping[str, Any]
    steps: int | None = None
    restarts: int | None = None
    dataset_sha256: str | None = None
    run_by: RunBy | None = None

    @property
    def failed_checks(self) -> list[str]:
        """Names of the sanity checks that did not pass."""
        return [c.name for c in self.sanity_checks if not c.passed]


def _get(predicate: Mapping[str, Any], path: str, what: str) -> Any:
    present, value = lookup(predicate, path)
    if not present:
        raise AttestationError(f"{what}: predicate lacks {path}")
    return value


def _number(predicate: Mapping[str, Any], path: str, what: str) -> float:
    value = _get(predicate, path, what)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AttestationError(f"{what}: predicate {path} is not a number")
    return float(value)


def _string(predicate: Mapping[str, Any], path: str, what: str) -> str:
    value = _get(predicate, path, what)
    if not isinstance(value, str):
        raise AttestationError(f"{what}: predicate {path} is not a string")
    return value


def _wilson(predicate: Mapping[str, Any], accuracy: float, what: str) -> tuple[float, float]:
    interval = _get(predicate, "results.robust.wilson95", what)
    if (
        not isinstance(interval, list)
        or len(interval) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in interval)
        or not 0.0 <= interval[0] <= accuracy + 1e-9
        or not accuracy - 1e-9 <= interval[1] <= 1.0
    ):
        raise AttestationError(
            f"{what}: predicate results.robust.wilson95 must be [lower, upper] with "
            "0 <= lower <= accuracy <= upper <= 1"
        )
    return float(interval[0]), float(interval[1])


def _sanity_checks(predicate: Mapping[str, Any], what: str) -> tuple[SanityCheck, ...]:
    checks = _get(predicate, "sanity.checks", what)
    if (
        not isinstance(checks, list)
        or not checks
        or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in checks)
    ):
        raise AttestationError(f"{what}: predicate sanity.checks must be a non-empty list of named checks")
    return tuple(SanityCheck(c["name"], c.get("passed") is True) for c in checks)


def parse_gate_predicate(predicate: Mapping[str, Any], *, what: str) -> GatePredicate:
    """Parse a robustness-gate predicate strictly (numbers first, then the fields a verifier reads).

    Args:
        predicate: The `https://modelsec.dev/robustness-gate/v1` predicate.
        what: Names the bundle in errors.

    Returns:
        The typed predicate (not yet checked against any policy).

    Raises:
        MalformedArtifactError: A number has the wrong type or is out of its field's range
            (`check_gate_predicate`).
        AttestationError: A required field (`attack`, `parameters.eps`, `gate.verdict`,
            `results.robust.total|accuracy|wilson95`, `sanity.checks`) is missing or mistyped, the accuracy
            is outside [0, 1] or its Wilson interval does not contain it.
    """
    check_gate_predicate(predicate, what=what)  # every number in range before any arithmetic
    attack = _string(predicate, "attack", what)
    eps = _number(predicate, "parameters.eps", what)
    verdict = _get(predicate, "gate.verdict", what)
    total = _number(predicate, "results.robust.total", what)
    accuracy = _number(predicate, "results.robust.accuracy", what)
    if not 0.0 <= accuracy <= 1.0:
        raise AttestationError(f"{what}: predicate results.robust.accuracy {accuracy} is not in [0, 1]")
    wilson = _wilson(predicate, accuracy, what)
    checks = _sanity_checks(predicate, what)
    finished = predicate.get("finishedAt")
    return GatePredicate(
        attack=attack,
        eps=eps,
        verdict=verdict if isinstance(verdict, str) else repr(verdict),
        robust_total=int(total),
        robust_accuracy=accuracy,
        robust_wilson95=wilson,
        sanity_checks=checks,
        finished_at=None if finished is None else parse_rfc3339(finished, field="finishedAt", what=what),
        predicate=predicate,
        steps=_optional_int(predicate, "parameters.steps"),
        restarts=_optional_int(predicate, "parameters.restarts"),
        dataset_sha256=_dataset_digest(predicate, what),
        run_by=parse_run_by(predicate, what=what),
    )


def parse_gate_statement(statement: Statement, *, what: str, limits: Limits | None = None) -> GatePredicate:
    """`parse_gate_predicate` of a statement's predicate (the parser the predicate registry holds).

    Args:
        statement: A statement whose predicateType is `https://modelsec.dev/robustness-gate/v1`.
        what: Names the bundle in errors.
        limits: Not needed by this predicate (every parser of the registry takes them).

    Raises:
        MalformedArtifactError: As `parse_gate_predicate`.
        AttestationError: As `parse_gate_predicate`.
    """
    return parse_gate_predicate(statement.predicate, what=what)


def _optional_int(predicate: Mapping[str, Any], path: str) -> int | None:
    # The type and range were checked by `check_gate_predicate` (an integer in the field's range).
    value = lookup(predicate, path)[1]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class GateRunRequirement(Protocol):
    """How a gate must have been run (`modelsec.policy.RobustnessRequirement` is one)."""

    @property
    def min_steps(self) -> int:
        """Fewest PGD iterations per restart accepted."""
        ...

    @property
    def min_restarts(self) -> int:
        """Fewest PGD random restarts accepted."""
        ...

    @property
    def datasets(self) -> frozenset[str]:
        """Accepted evaluation-set digests (hex SHA-256); empty: any dataset."""
        ...

    @property
    def require_server_run(self) -> bool:
        """Whether only gates a modelsec server ran (`runBy` recorded) count."""
        ...


def check_gate_run(pred: GatePredicate, req: GateRunRequirement, *, what: str) -> str:
    """Check how a parsed gate was run against a requirement: steps, restarts, dataset, who ran it.

    A field the requirement does not constrain (`min_steps` 1, `min_restarts` 1, no `datasets`,
    `require_server_run` False) is not required in the predicate. Whether `runBy` is true is a matter of
    which key signed it (see `modelsec.attestations.predicates.run_by`); the signature is the verifier's
    check.

    Args:
        pred: The parsed predicate (`parse_gate_predicate`).
        req: The requirement (`modelsec.policy.RobustnessRequirement`).
        what: Names the bundle in errors.

    Returns:
        A summary of what was checked, empty when nothing was constrained.

    Raises:
        AttestationError: The run used fewer steps or restarts than required (or does not record them),
            an evaluation set whose digest is not among `datasets` (or none recorded), or no modelsec server
            recorded running it while `require_server_run` is set.
    """
    done: list[str] = []
    for label, value, least in (
        ("steps", pred.steps, req.min_steps),
        ("restarts", pred.restarts, req.min_restarts),
    ):
        if least > 1:
            if value is None or value < least:
                raise AttestationError(
                    f"{what}: gate ran {value if value is not None else 'unrecorded'} PGD {label}, "
                    f"the policy needs at least {least}"
                )
            done.append(f"{label} {value} >= {least}")
    if req.datasets:
        if pred.dataset_sha256 is None or pred.dataset_sha256 not in req.datasets:
            raise AttestationError(
                f"{what}: gate dataset sha256:{pred.dataset_sha256 or 'unrecorded'} is not among the "
                "policy's datasetDigests"
            )
        done.append(f"dataset sha256:{pred.dataset_sha256[:12]}")
    if req.require_server_run:
        if pred.run_by is None:
            raise AttestationError(
                f"{what}: the gate records no server run (runBy); the policy requires server-run evidence"
            )
        done.append(f"run by {pred.run_by.server} for {pred.run_by.requester}")
    return ", ".join(done)


def build_gate_predicate(
    result: Mapping[str, Any], *, architecture: str | None = None, weights: Sequence[str] = ()
) -> dict[str, Any]:
    """The gate predicate of a run: its JSON form and the model it ran on (`model`).

    Not checked here (`gate_statement` checks it before anything is signed).

    Args:
        result: The run's JSON form (`modelsec.robustness.GateResult.to_json()`).
        architecture: The factory import path of the classifier, recorded for reproduction.
        weights: The safetensors files the classifier was built from.

    Returns:
        The predicate, JSON-ready (see the module docstring).
    """
    return {**result, "model": {"architecture": architecture, "weights": list(weights)}}


def gate_statement(
    predicate: Mapping[str, Any], *, root_digest: str, model_name: str, run_by: RunBy | None = None
) -> Statement:
    """Build the unsigned gate statement about the model whose root digest is `root_digest`.

    The numbers are checked (`check_gate_predicate`) before anything is signed: a statement no verifier
    can read is never produced. A FAILED gate is a valid statement (the verdict is part of what is signed).

    Args:
        predicate: The predicate (`build_gate_predicate`).
        root_digest: Hex SHA-256 model root digest (64 lowercase hex digits).
        model_name: The subject name (informational).
        run_by: Who ran the gate, recorded as `runBy`, when a modelsec server ran it (RunGate only).

    Returns:
        The unsigned statement.

    Raises:
        MalformedArtifactError: `root_digest` is not 64 lowercase hex digits, or a number of the predicate
            is out of its field's range.
    """
    if not is_sha256_hex(root_digest):
        raise MalformedArtifactError(f"model root digest {root_digest!r} is not a hex SHA-256 digest")
    if run_by is not None:
        predicate = {**predicate, RUN_BY_FIELD: run_by.to_json()}
    check_gate_predicate(predicate, what="gate statement")
    return Statement(
        subjects=(Subject(name=model_name, digest=MappingProxyType({"sha256": root_digest})),),
        predicate_type=GATE_PREDICATE_TYPE,
        predicate=MappingProxyType(dict(predicate)),
    )
