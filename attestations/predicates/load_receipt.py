"""The load receipt predicate (`https://modelsec.dev/load-receipt/v1`): this node loaded this model, now.

A node that verified a model and loaded it (`modelsec.verifier.load_model`, the runtime guard) may state so
(`modelsec.verifier.receipts`). The subject is the model root digest the loaded bytes were verified under;
the predicate records what was loaded, where, by whom, under which policy and when:

```json
{"_type": "https://in-toto.io/Statement/v1",
 "subject": [{"name": "<model dir name>", "digest": {"sha256": "<model root digest>"}}],
 "predicateType": "https://modelsec.dev/load-receipt/v1",
 "predicate": {"loadedAt": "2025-01-31T12:00:00Z",
               "files": ["model-00001-of-00002.safetensors", "..."], "tensors": 291,
               "device": "cpu" | "GPU-<CUDA device UUID>",
               "process": {"pid": 4242, "executable": "/usr/bin/python3"},
               "workload": {"pod": "...", "namespace": "...", "serviceAccount": "..."},
               "node": {"attestationKey": "<keyid of the AK: hex SHA-256 of its canonical PEM>"},
               "policyDigest": "<hex SHA-256 of the policy file>",
               "pinnedDigests": ["sha256:<hex>"]}}
```

`workload` holds only the fields whose downward-API variables are set (`POD_NAME`, `POD_NAMESPACE`,
`SERVICE_ACCOUNT`); `policyDigest` is "" for a policy not read from a file; `pinnedDigests` is empty when
nothing pinned the load. Every field is the node's own claim: what makes it evidence is the TPM quote that
signs the statement (`modelsec.verifier.receipts`), and that still proves only that the node's TPM, in the
boot state its PCRs show, was asked to sign it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelsec.attestations._numbers import parse_rfc3339
from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits

__all__ = [
    "LOAD_RECEIPT_PREDICATE_TYPE",
    "WORKLOAD_ENV",
    "LoadReceipt",
    "parse_receipt_statement",
    "receipt_statement",
]

LOAD_RECEIPT_PREDICATE_TYPE = "https://modelsec.dev/load-receipt/v1"

WORKLOAD_ENV: Mapping[str, str] = {
    "pod": "POD_NAME",
    "namespace": "POD_NAMESPACE",
    "serviceAccount": "SERVICE_ACCOUNT",
}
"""Predicate `workload` field -> the environment variable the Kubernetes downward API sets it from."""

_MAX_TEXT = 4096
_MAX_FILES = 65_536
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_PIN = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class LoadReceipt:
    """A parsed load receipt statement (its quote is not checked here).

    Attributes:
        root_digest: The model root digest (the subject), hex SHA-256.
        loaded_at: When the node says it loaded the model (UTC).
        files: The model files the tensors came from.
        tensors: How many tensors were returned.
        device: `cpu`, or the CUDA device's UUID (`GPU-...`).
        pid: The loading process's id.
        executable: The loading process's executable.
        workload: Downward-API identity (`pod`, `namespace`, `serviceAccount`), the fields present only.
        attestation_key: The keyid of the node's attestation key (hex SHA-256 of its canonical PEM, as
            `TrustedKey.keyid`).
        policy_digest: Hex SHA-256 of the policy file that decided ("" when not read from a file).
        pinned_digests: The root digests the load was pinned to (`sha256:<hex>`).
    """

    root_digest: str
    loaded_at: datetime
    files: tuple[str, ...]
    tensors: int
    device: str
    pid: int
    executable: str
    workload: Mapping[str, str]
    attestation_key: str
    policy_digest: str
    pinned_digests: tuple[str, ...]


def receipt_statement(receipt: LoadReceipt, *, model_name: str) -> Statement:
    """The unsigned load receipt statement (see the module docstring for its shape).

    Raises:
        MalformedArtifactError: A digest is not SHA-256, or a text field is empty, too long or not printable.
    """
    predicate = {
        "loadedAt": receipt.loaded_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "files": list(receipt.files),
        "tensors": receipt.tensors,
        "device": receipt.device,
        "process": {"pid": receipt.pid, "executable": receipt.executable},
        "workload": dict(receipt.workload),
        "node": {"attestationKey": receipt.attestation_key},
        "policyDigest": receipt.policy_digest,
        "pinnedDigests": list(receipt.pinned_digests),
    }
    statement = Statement(
        (Subject(model_name, {"sha256": receipt.root_digest}),), LOAD_RECEIPT_PREDICATE_TYPE, predicate
    )
    parse_receipt_statement(statement, what="load receipt")  # never build what no verifier can read
    return statement


def _text(value: object, field: str, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT or _CONTROL.search(value) or not (value or empty):
        raise MalformedArtifactError(f"{what}: predicate {field} must be a string of printable characters")
    return value


def _int(value: object, field: str, what: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise MalformedArtifactError(f"{what}: predicate {field} must be an integer in [0, {hi}]")
    return value


def _object(predicate: Mapping[str, Any], field: str, what: str, keys: set[str]) -> Mapping[str, Any]:
    value = predicate.get(field)
    if not isinstance(value, Mapping) or not set(value) <= keys:
        raise MalformedArtifactError(f"{what}: predicate {field} must be an object of {sorted(keys)}")
    return value


def parse_receipt_statement(statement: Statement, *, what: str, limits: Limits | None = None) -> LoadReceipt:
    """The receipt's fields, parsed strictly (shape only: nothing is verified here).

    Args:
        statement: A parsed statement of type `LOAD_RECEIPT_PREDICATE_TYPE`.
        what: Names the receipt in errors.
        limits: Unused (the `PredicateParser` signature).

    Returns:
        The parsed receipt.

    Raises:
        MalformedArtifactError: Another predicate type; not exactly one subject with a SHA-256 digest; a
            field missing, of the wrong type, out of range, or unknown (the message names it).
    """
    del limits
    if statement.predicate_type != LOAD_RECEIPT_PREDICATE_TYPE:
        raise MalformedArtifactError(
            f"{what}: predicateType {statement.predicate_type!r} is not a load receipt"
        )
    if len(statement.subjects) != 1 or not is_sha256_hex(statement.subjects[0].digest.get("sha256")):
        raise MalformedArtifactError(f"{what}: a load receipt has exactly one subject with a SHA-256 digest")
    p: Mapping[str, Any] = statement.predicate
    known = {
        "loadedAt", "files", "tensors", "device", "process", "workload", "node", "policyDigest",
        "pinnedDigests",
    }  # fmt: skip
    if set(p) != known:
        raise MalformedArtifactError(f"{what}: predicate fields must be exactly {sorted(known)}")
    files = p["files"]
    if not isinstance(files, Sequence) or isinstance(files, str) or len(files) > _MAX_FILES:
        raise MalformedArtifactError(f"{what}: predicate files must be a list of at most {_MAX_FILES} names")
    process = _object(p, "process", what, {"pid", "executable"})
    workload = _object(p, "workload", what, set(WORKLOAD_ENV))
    node = _object(p, "node", what, {"attestationKey"})
    pins = p["pinnedDigests"]
    if (
        not isinstance(pins, Sequence)
        or isinstance(pins, str)
        or not all(isinstance(d, str) and _PIN.fullmatch(d) for d in pins)
    ):
        raise MalformedArtifactError(f"{what}: predicate pinnedDigests must be a list of sha256:<hex>")
    policy_digest = p["policyDigest"]
    if policy_digest != "" and not is_sha256_hex(policy_digest):
        raise MalformedArtifactError(f"{what}: predicate policyDigest must be a hex SHA-256 or empty")
    if not is_sha256_hex(node.get("attestationKey")):
        raise MalformedArtifactError(f"{what}: predicate node.attestationKey must be a hex SHA-256")
    return LoadReceipt(
        root_digest=statement.subjects[0].digest["sha256"],
        loaded_at=parse_rfc3339(p["loadedAt"], field="loadedAt", what=what),
        files=tuple(_text(f, "files[]", what) for f in files),
        tensors=_int(p["tensors"], "tensors", what, 2**40),
        device=_text(p["device"], "device", what),
        pid=_int(process.get("pid"), "process.pid", what, 2**32),
        executable=_text(process.get("executable"), "process.executable", what, empty=True),
        workload={k: _text(v, f"workload.{k}", what) for k, v in workload.items()},
        attestation_key=node["attestationKey"],
        policy_digest=policy_digest,
        pinned_digests=tuple(pins),
    )
