"""The load snapshot predicate (`https://modelsec.dev/load-snapshot/v1`): the models this node has loaded.

`modelsec receipts snapshot` states, signed by the node's TPM as a receipt is (`modelsec.verifier.receipts`),
the set of models the node loaded since it booted, for a watchdog to compare against what admission
allowed. The subject is the node itself (its attestation key's keyid), so that an empty set is a statement
too; each load names the receipt it comes from:

```json
{"_type": "https://in-toto.io/Statement/v1",
 "subject": [{"name": "node", "digest": {"sha256": "<keyid of the node's AK>"}}],
 "predicateType": "https://modelsec.dev/load-snapshot/v1",
 "predicate": {"takenAt": "2025-01-31T12:00:00Z", "bootTime": "2025-01-31T08:00:00Z",
               "loads": [{"model": "sha256:<root digest>", "loadedAt": "...", "device": "cpu",
                          "pid": 4242, "workload": {"pod": "..."},
                          "receipt": "sha256:<digest of the receipt file>"}]}}
```

Where the set comes from is `modelsec.verifier.receipts.take_snapshot`'s business: the receipts this node's
AK quoted since `bootTime`, verified, from the policy's store. Every field is still the node's claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelsec.attestations._numbers import parse_rfc3339
from modelsec.attestations.predicates.load_receipt import WORKLOAD_ENV
from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits

__all__ = [
    "LOAD_SNAPSHOT_PREDICATE_TYPE",
    "LoadSnapshot",
    "SnapshotLoad",
    "parse_snapshot_statement",
    "snapshot_statement",
]

LOAD_SNAPSHOT_PREDICATE_TYPE = "https://modelsec.dev/load-snapshot/v1"
_MAX_LOADS = 65_536
_MAX_TEXT = 4096


@dataclass(frozen=True, slots=True)
class SnapshotLoad:
    """One load in a snapshot (from a verified receipt).

    Attributes:
        model: The model root digest, `sha256:<hex>`.
        loaded_at: The receipt's `loadedAt` (UTC).
        device: `cpu` or the CUDA device UUID.
        pid: The loading process.
        workload: The receipt's downward-API identity.
        receipt: `sha256:<hex>` of the receipt file's bytes.
    """

    model: str
    loaded_at: datetime
    device: str
    pid: int
    workload: Mapping[str, str]
    receipt: str


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """A parsed load snapshot statement (its quote is not checked here).

    Attributes:
        attestation_key: The keyid of the node's AK (the subject).
        taken_at: When the node took it (UTC).
        boot_time: Since when the loads are counted (the node's boot, UTC).
        loads: The loads, oldest first.
    """

    attestation_key: str
    taken_at: datetime
    boot_time: datetime
    loads: tuple[SnapshotLoad, ...]


def _time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def snapshot_statement(snapshot: LoadSnapshot) -> Statement:
    """The unsigned snapshot statement (module docstring shape).

    Raises:
        MalformedArtifactError: A field cannot be represented (as `parse_snapshot_statement` would refuse).
    """
    predicate = {
        "takenAt": _time(snapshot.taken_at),
        "bootTime": _time(snapshot.boot_time),
        "loads": [
            {
                "model": load.model,
                "loadedAt": _time(load.loaded_at),
                "device": load.device,
                "pid": load.pid,
                "workload": dict(load.workload),
                "receipt": load.receipt,
            }
            for load in snapshot.loads
        ],
    }
    statement = Statement(
        (Subject("node", {"sha256": snapshot.attestation_key}),), LOAD_SNAPSHOT_PREDICATE_TYPE, predicate
    )
    parse_snapshot_statement(statement, what="load snapshot")  # never build what no verifier can read
    return statement


def _digest(value: object, field: str, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("sha256:") or not is_sha256_hex(value[7:]):
        raise MalformedArtifactError(f"{what}: predicate {field} must be sha256:<hex>")
    return value


def _load(item: object, i: int, what: str) -> SnapshotLoad:
    keys = {"model", "loadedAt", "device", "pid", "workload", "receipt"}
    if not isinstance(item, Mapping) or set(item) != keys:
        raise MalformedArtifactError(f"{what}: predicate loads[{i}] must be an object of {sorted(keys)}")
    device, pid, workload = item["device"], item["pid"], item["workload"]
    if not isinstance(device, str) or not 0 < len(device) <= _MAX_TEXT or not device.isprintable():
        raise MalformedArtifactError(f"{what}: predicate loads[{i}].device must be printable text")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= 2**32:
        raise MalformedArtifactError(f"{what}: predicate loads[{i}].pid must be an integer in [0, 2^32]")
    if (
        not isinstance(workload, Mapping)
        or not set(workload) <= set(WORKLOAD_ENV)
        or not all(
            isinstance(v, str) and 0 < len(v) <= _MAX_TEXT and v.isprintable() for v in workload.values()
        )
    ):
        raise MalformedArtifactError(f"{what}: predicate loads[{i}].workload must map {sorted(WORKLOAD_ENV)}")
    return SnapshotLoad(
        model=_digest(item["model"], f"loads[{i}].model", what),
        loaded_at=parse_rfc3339(item["loadedAt"], field=f"loads[{i}].loadedAt", what=what),
        device=device,
        pid=pid,
        workload=dict(workload),
        receipt=_digest(item["receipt"], f"loads[{i}].receipt", what),
    )


def parse_snapshot_statement(
    statement: Statement, *, what: str, limits: Limits | None = None
) -> LoadSnapshot:
    """The snapshot's fields, parsed strictly (shape only: nothing is verified here).

    Args:
        statement: A parsed statement of type `LOAD_SNAPSHOT_PREDICATE_TYPE`.
        what: Names the snapshot in errors.
        limits: Unused (the `PredicateParser` signature).

    Raises:
        MalformedArtifactError: Another predicate type; not exactly one subject with a SHA-256 digest; a
            field missing, unknown, of the wrong type or out of range (the message names it).
    """
    del limits
    if statement.predicate_type != LOAD_SNAPSHOT_PREDICATE_TYPE:
        raise MalformedArtifactError(
            f"{what}: predicateType {statement.predicate_type!r} is not a load snapshot"
        )
    if len(statement.subjects) != 1 or not is_sha256_hex(statement.subjects[0].digest.get("sha256")):
        raise MalformedArtifactError(f"{what}: a load snapshot has exactly one subject with a SHA-256 digest")
    p: Mapping[str, Any] = statement.predicate
    if set(p) != {"takenAt", "bootTime", "loads"}:
        raise MalformedArtifactError(f"{what}: predicate fields must be exactly bootTime, loads, takenAt")
    loads = p["loads"]
    if not isinstance(loads, Sequence) or isinstance(loads, str) or len(loads) > _MAX_LOADS:
        raise MalformedArtifactError(f"{what}: predicate loads must be a list of at most {_MAX_LOADS}")
    return LoadSnapshot(
        attestation_key=statement.subjects[0].digest["sha256"],
        taken_at=parse_rfc3339(p["takenAt"], field="takenAt", what=what),
        boot_time=parse_rfc3339(p["bootTime"], field="bootTime", what=what),
        loads=tuple(_load(item, i, what) for i, item in enumerate(loads)),
    )
