"""`modelsec receipts verify | list | snapshot`: TPM-quoted load receipts (docs/load-receipts.md).

Each command reads the policy file's `loadReceipt` (registered nodes, PCRs, TSAs, window, store): the entry
`--entry NAME`, or the only entry that has one. No trust decision is taken here: `modelsec.verifier.receipts`
verifies. Only click is imported at module level.

Exit codes: 0 verified / listed / taken; 1 refused (the receipt or snapshot must not be believed), or the
TPM, TSA or store cannot be reached; 2 usage (a bad option, or a policy file that cannot be read or has no
`loadReceipt`).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelsec.cli.common import digest_str, fail, json_option, reply

if TYPE_CHECKING:
    from modelsec.policy.requirements import LoadReceiptRequirement
    from modelsec.verifier.receipts import VerifiedReceipt, VerifiedSnapshot

__all__ = ["receipts"]

_MAX_FILE_BYTES = 16 * 2**20


@click.group(name="receipts")
def receipts() -> None:
    """TPM-quoted load receipts: verify one, list a model's, snapshot this node's loads."""


def _policy_options(f: Any) -> Any:
    f = click.option(
        "--entry",
        metavar="NAME",
        help="The policy entry whose loadReceipt applies (default: the only entry that has one).",
    )(f)
    return click.option(
        "--policy",
        "policy_file",
        required=True,
        type=click.Path(path_type=Path, dir_okay=False),
        help="Policy file whose loadReceipt registers the nodes, PCR values, TSAs and store.",
    )(f)


def _requirement(policy_file: Path, entry: str | None) -> LoadReceiptRequirement:
    """The `loadReceipt` the options name (usage error, exit 2, when there is none to use)."""
    from modelsec.errors import Error
    from modelsec.policy import PolicySet

    try:
        policies = PolicySet.from_file(policy_file)
    except Error as e:
        raise click.UsageError(f"--policy: {e.diagnostics()}") from e
    found = [
        (p.name or "?", r)
        for p in policies.policies
        if (r := p.load_receipt) is not None and (entry is None or p.name == entry)
    ]
    if entry is None and len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise click.UsageError(
            f"--policy: several entries have a loadReceipt ({names}); name one with --entry"
        )
    if not found:
        which = f"entry {entry!r} with" if entry is not None else "entry with"
        raise click.UsageError(f"--policy: {policy_file} has no {which} a loadReceipt")
    return found[0][1]


def _read(path: Path, what: str) -> bytes:
    from modelsec.errors import PolicyError
    from modelsec.safe_io import read_regular_file

    try:
        return read_regular_file(path, what, max_bytes=_MAX_FILE_BYTES, error=PolicyError)
    except PolicyError as e:
        raise click.UsageError(e.diagnostics()) from e


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _receipt_json(v: VerifiedReceipt) -> dict[str, Any]:
    r = v.receipt
    return {
        "kind": "load-receipt",
        "node": v.node,
        "model": digest_str(r.root_digest),
        "loadedAt": _time(r.loaded_at),
        "files": list(r.files),
        "tensors": r.tensors,
        "device": r.device,
        "pid": r.pid,
        "executable": r.executable,
        "workload": dict(r.workload),
        "policyDigest": r.policy_digest,
        "pinnedDigests": list(r.pinned_digests),
        "timestamp": _time(v.timestamp),
        "tpmClock": {
            "clockMs": v.quote.clock,
            "resetCount": v.quote.reset_count,
            "restartCount": v.quote.restart_count,
        },
        "digest": v.digest,
    }


def _snapshot_json(v: VerifiedSnapshot) -> dict[str, Any]:
    s = v.snapshot
    return {
        "kind": "load-snapshot",
        "node": v.node,
        "takenAt": _time(s.taken_at),
        "bootTime": _time(s.boot_time),
        "loads": [
            {
                "model": load.model,
                "loadedAt": _time(load.loaded_at),
                "device": load.device,
                "pid": load.pid,
                "workload": dict(load.workload),
                "receipt": load.receipt,
            }
            for load in s.loads
        ],
        "timestamp": _time(v.timestamp),
        "digest": v.digest,
    }


def _verify_file(
    data: bytes,
    requirement: LoadReceiptRequirement,
    *,
    what: str,
    model: str | None,
    node: str | None,
    previous: Any,
    fresh: bool,
) -> VerifiedReceipt | VerifiedSnapshot:
    from modelsec.verifier.receipts import (
        SNAPSHOT_MEDIA_TYPE,
        document_media_type,
        verify_receipt,
        verify_snapshot,
    )

    if document_media_type(data, what) == SNAPSHOT_MEDIA_TYPE:
        if model is not None:
            raise click.UsageError("--model-digest applies to a load receipt, not to a snapshot")
        return verify_snapshot(data, requirement, what=what, node=node, previous=previous, fresh=fresh)
    return verify_receipt(
        data, requirement, what=what, expected_digest=model, node=node, previous=previous, fresh=fresh
    )


@receipts.command(name="verify")
@click.argument("receipt", type=click.Path(path_type=Path, dir_okay=False))
@_policy_options
@click.option(
    "--model-digest",
    "model",
    metavar="sha256:HEX",
    help="The model root digest the receipt must be about (the one admission allowed).",
)
@click.option("--node", metavar="NAME", help="The registered node the receipt must come from.")
@click.option(
    "--previous",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="FILE",
    help="An earlier receipt or snapshot of the same node: this quote's TPM clock must fit the time between "
    "them (within the policy's window).",
)
@click.option(
    "--history",
    is_flag=True,
    help="Do not apply the policy's maxAge (an old receipt read for the record); the TSA and TPM-clock "
    "checks still apply.",
)
@json_option
def _verify(
    receipt: Path,
    policy_file: Path,
    entry: str | None,
    model: str | None,
    node: str | None,
    previous: Path | None,
    history: bool,
    as_json: bool,
) -> None:
    """Verify a load receipt or snapshot file: its TPM quote, node, PCRs, subject and freshness.

    Checks, in order: the quote's signature by a node registered in the policy; that the statement names
    that node's attestation key (and --node); the quote's qualifying data against the statement; the PCR
    values against the policy's; the model digest (--model-digest); the RFC 3161 timestamp and the TPM
    clock (--previous) against the statement's time, within the policy's window; maxAge (unless
    --history). Exit 0 verified, 1 refused (the error names the reason), 2 usage.
    """
    from modelsec.errors import Error, ReceiptError

    requirement = _requirement(policy_file, entry)
    data = _read(receipt, "load receipt")
    try:
        before = None
        if previous is not None:
            before = _verify_file(
                _read(previous, "load receipt"), requirement, what=str(previous), model=None, node=node,
                previous=None, fresh=False,
            )  # fmt: skip
        verified = _verify_file(
            data, requirement, what=str(receipt), model=model, node=node, previous=before, fresh=not history
        )
    except ReceiptError as e:
        fail(e, as_json, fields={"reason": e.reason})
    except Error as e:
        fail(e, as_json)
    from modelsec.verifier.receipts import VerifiedReceipt

    if isinstance(verified, VerifiedReceipt):
        if as_json:
            reply({"receipt": _receipt_json(verified)})
            return
        r = verified.receipt
        click.echo(
            f"OK load receipt: node {verified.node} loaded {digest_str(r.root_digest)} at "
            f"{_time(r.loaded_at)} ({r.tensors} tensors to {r.device}, pid {r.pid})"
        )
        return
    if as_json:
        reply({"snapshot": _snapshot_json(verified)})
        return
    s = verified.snapshot
    click.echo(
        f"OK load snapshot: node {verified.node} at {_time(s.taken_at)}: {len(s.loads)} load(s) since "
        f"{_time(s.boot_time)}"
    )
    for load in s.loads:
        click.echo(f"  {load.model}  {_time(load.loaded_at)}  {load.device}  pid {load.pid}")


def _model_digest(model: str, policy_file: Path) -> str:
    """MODEL as a root digest: `sha256:<hex>` as given, or a model directory verified under the policy."""
    from modelsec.attestations.statement import is_sha256_hex

    if model.startswith("sha256:"):
        if not is_sha256_hex(model[7:]):
            raise click.BadParameter(f"{model!r} is not sha256:<64 hex digits>", param_hint="MODEL")
        return model[7:]
    path = Path(model)
    if not path.is_dir():
        raise click.BadParameter(
            f"{model!r} is neither sha256:<hex> nor a model directory", param_hint="MODEL"
        )
    from modelsec.policy import PolicySet
    from modelsec.verifier import verify_model

    return verify_model(path, PolicySet.from_file(policy_file)).root_digest


@receipts.command(name="list")
@click.argument("model", metavar="MODEL")
@_policy_options
@click.option(
    "--store",
    metavar="DIR|oci://REGISTRY/REPOSITORY",
    help="Read receipts from this store instead of the policy's loadReceipt.store.",
)
@json_option
def _list(model: str, policy_file: Path, entry: str | None, store: str | None, as_json: bool) -> None:
    """Show which nodes loaded MODEL (sha256:<root digest>, or a signed model directory), when and where.

    Every receipt about MODEL in the store is verified under the policy (without maxAge: this is
    history); receipts of one node are also checked against each other's TPM clock. Refused receipts are
    listed as REFUSED with their reason. Exit 0 when listed (even with refused rows; --json counts them), 1
    when the model or the store cannot be read, 2 usage.
    """
    from modelsec.errors import Error
    from modelsec.verifier.receipts import list_receipts
    from modelsec.verifier.stores.receipts import open_receipt_store

    requirement = _requirement(policy_file, entry)
    try:
        digest = _model_digest(model, policy_file)
        opened = open_receipt_store(store) if store is not None else None
        if opened is None and requirement.store is None:
            raise click.UsageError("the policy's loadReceipt names no store; give --store")
        rows = list_receipts(requirement, digest, store=opened)
    except Error as e:
        fail(e, as_json)
    verified = [r for r in rows if r.verified is not None]
    if as_json:
        reply(
            {
                "model": digest_str(digest),
                "receipts": [{"source": r.source, **_receipt_json(r.verified)} for r in rows if r.verified],
                "refused": [
                    {"source": r.source, "reason": r.reason, "message": r.detail}
                    for r in rows
                    if not r.verified
                ],
            }
        )
        return
    click.echo(f"{'NODE':<16} {'LOADED AT':<28} {'DEVICE':<14} {'PID':>8}  {'WORKLOAD':<24} SOURCE")
    for row, v in ((r, r.verified) for r in rows):
        if v is None:
            continue
        workload = "/".join(v.receipt.workload.get(k, "") for k in ("namespace", "pod")).strip("/") or "-"
        click.echo(
            f"{v.node:<16} {_time(v.receipt.loaded_at) or '':<28} {v.receipt.device:<14} {v.receipt.pid:>8}  "
            f"{workload:<24} {row.source}"
        )
    for row in rows:
        if row.verified is None:
            click.echo(f"{'REFUSED':<16} {row.reason:<28} {row.detail}")
    click.echo(f"{len(verified)} receipt(s) of {digest_str(digest)}, {len(rows) - len(verified)} refused")


@receipts.command(name="snapshot")
@_policy_options
@click.option(
    "--since",
    metavar="TIME",
    type=click.DateTime(formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"]),
    help="Count loads from this time (ISO 8601, UTC unless a zone is given) instead of the machine's boot.",
)
@json_option
def _snapshot(policy_file: Path, entry: str | None, since: datetime | None, as_json: bool) -> None:
    """Sign this node's set of loaded models with its TPM, as a receipt is signed, and store it.

    The set is the receipts in the policy's loadReceipt.store that this node's TPM quoted since the
    machine booted (/proc/stat btime, or --since), each verified under the policy; it says which loads
    happened, not whether the processes still run. The TPM is reached as tpm2-tools reach it
    ($TPM2TOOLS_TCTI). Exit 0 taken and stored, 1 the TPM, TSA or store cannot be reached, 2 usage.
    """
    from datetime import UTC

    from modelsec.errors import Error
    from modelsec.verifier.receipts import take_snapshot

    requirement = _requirement(policy_file, entry)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    try:
        taken = take_snapshot(requirement, since=since)
    except Error as e:
        fail(e, as_json)
    s = taken.snapshot
    if as_json:
        reply(
            {
                "stored": taken.stored,
                "takenAt": _time(s.taken_at),
                "bootTime": _time(s.boot_time),
                "loads": [{"model": x.model, "loadedAt": _time(x.loaded_at), "pid": x.pid} for x in s.loads],
                "skipped": [{"source": src, "reason": why} for src, why in taken.skipped],
            }
        )
        return
    click.echo(f"snapshot {taken.stored}: {len(s.loads)} load(s) since {_time(s.boot_time)}")
    for load in s.loads:
        click.echo(f"  {load.model}  {_time(load.loaded_at)}  {load.device}  pid {load.pid}")
    for src, why in taken.skipped:
        click.echo(f"  skipped {src}: {why}", err=True)
