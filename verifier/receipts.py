"""Load receipts: a node states, signed by its TPM, that it verified and loaded a model (issue 33).

A receipt file (`application/vnd.modelsec.load-receipt.v1+json`) holds a DSSE envelope whose payload is the
load receipt statement (`modelsec.attestations.predicates.load_receipt`) and, in place of a DSSE signature,
a TPM2 quote by the node's attestation key (AK) whose qualifying data is SHA-256 of the envelope's DSSE PAE;
where the policy names a TSA (`loadReceipt.timestampUrl`), an RFC 3161 timestamp over the quote's signature:

```json
{"mediaType": "application/vnd.modelsec.load-receipt.v1+json",
 "dsseEnvelope": {"payload": "<base64 statement>", "payloadType": "application/vnd.in-toto+json",
                  "signatures": []},
 "tpmQuote": {"attest": "<base64 TPMS_ATTEST>", "signature": "<base64 DER ECDSA P-256>",
              "pcrs": {"sha256": {"0": "<hex>", "7": "<hex>"}}},
 "rfc3161Timestamps": ["<base64 DER TimeStampResp>"]}
```

A snapshot file (`application/vnd.modelsec.load-snapshot.v1+json`, `take_snapshot`) has the same shape around
a load snapshot statement (`modelsec.attestations.predicates.load_snapshot`): the node's loads since boot.

`verify_receipt` (and `verify_snapshot`) check, in this order, refusing with `ReceiptError` naming the reason:
1. the quote's signature by one of the policy's registered nodes (`unregistered-key` otherwise);
2. that the statement names that node's AK (`node`), and the node the caller expects, if any (`node`);
3. the TPMS_ATTEST: TPM_GENERATED_VALUE, TPM_ST_ATTEST_QUOTE, extraData = SHA-256(PAE) (`qualifying-data`);
4. the quoted PCR selection and digest: the digest of the receipt's PCR values, and each value equal to
   the policy's (`pcr`);
5. the receipt's subject against the digest the caller loaded (`model-digest`);
6. the RFC 3161 timestamps over the quote's signature: required when the policy names a TSA URL, each trusted
   through the policy's `timestampAuthorities` (`timestamp`), and each within the policy's `window` of the
   statement's time (`stale`);
7. the TPM clock (`clockInfo`) against an earlier quote of the same node, where the caller gives one: within
   one power cycle the clock must have advanced as far as the statements' times, within `window`; across a
   reset never further, and the reset counters never back (`stale`);
8. freshness: the statement's time no older than the policy's `maxAge` and not in the future beyond a minute
   (`stale`), unless the caller reads history (`fresh=False`).

What it proves: a TPM holding a registered AK, in the boot state the policy's PCRs describe, signed this
statement; with a TSA, no earlier than the TSA's time minus `window` and no later than it. What it does not:
that the AK lives in a hardware TPM (a software TPM such as swtpm proves nothing about hardware; the
enrolment of the AK against a hardware TPM's endorsement key, or a confidential VM's vTPM, is what makes it
so), nor that the node's software told the truth in the statement's fields.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import struct
import sys
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from modelsec.attestations.dsse import PAYLOAD_TYPE_IN_TOTO, pae
from modelsec.attestations.predicates.load_receipt import (
    WORKLOAD_ENV,
    LoadReceipt,
    parse_receipt_statement,
    receipt_statement,
)
from modelsec.attestations.predicates.load_snapshot import (
    LoadSnapshot,
    SnapshotLoad,
    parse_snapshot_statement,
    snapshot_statement,
)
from modelsec.attestations.statement import parse_statement, serialize_statement
from modelsec.errors import (
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    PolicyError,
    ReceiptError,
    SignatureError,
)
from modelsec.policy.requirements import LoadReceiptRequirement
from modelsec.signer.keys import TrustedKey, load_trusted_key
from modelsec.signer.tpm import TpmAttestationKey, TpmQuote
from modelsec.strict_json import strict_loads
from modelsec.verifier.admission import ModelAdmission
from modelsec.verifier.stores.receipts import (
    RECEIPT_MEDIA_TYPE,
    SNAPSHOT_MEDIA_TYPE,
    ReceiptStore,
    open_receipt_store,
)

__all__ = [
    "RECEIPT_MEDIA_TYPE",
    "SNAPSHOT_MEDIA_TYPE",
    "QuoteInfo",
    "Quoted",
    "ReceiptRow",
    "ReceiptWarning",
    "TakenSnapshot",
    "VerifiedReceipt",
    "VerifiedSnapshot",
    "boot_time",
    "check_tpm_clock",
    "document_media_type",
    "emit_load_receipt",
    "emit_receipt_for",
    "list_receipts",
    "parse_attest",
    "receipt_document",
    "take_snapshot",
    "verify_receipt",
    "verify_snapshot",
]

_TPM_GENERATED_VALUE = 0xFF544347
_TPM_ST_ATTEST_QUOTE = 0x8018
_TPM_ALG_SHA256 = 0x000B
_MAX_RECEIPT_BYTES = 16 * 2**20
_MAX_TIMESTAMPS = 8
_FUTURE_SKEW = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class QuoteInfo:
    """The fields of a TPMS_ATTEST of type TPM_ST_ATTEST_QUOTE (TPM 2.0 Library Part 2, 10.12.12).

    Attributes:
        signer_name: `qualifiedSigner` (TPM2B_NAME).
        extra_data: `extraData`: the qualifying data the caller gave.
        clock: `clockInfo.clock`, milliseconds the TPM has been powered since its last clear.
        reset_count: `clockInfo.resetCount`.
        restart_count: `clockInfo.restartCount`.
        pcr_selection: (hash algorithm id, PCR indices) per selected bank.
        pcr_digest: `attested.quote.pcrDigest`.
    """

    signer_name: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    pcr_selection: tuple[tuple[int, tuple[int, ...]], ...]
    pcr_digest: bytes


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.at, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise MalformedArtifactError(f"{self.what}: TPMS_ATTEST is truncated")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def uint(self, fmt: str) -> int:
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def sized(self) -> bytes:
        return self.take(self.uint(">H"))


def parse_attest(data: bytes, *, what: str) -> QuoteInfo:
    """Parse a marshalled TPMS_ATTEST that must be a quote (strict: nothing may follow it).

    Raises:
        MalformedArtifactError: Truncated, trailing bytes, not TPM-generated (magic), or not a quote.
    """
    r = _Reader(data, what)
    if r.uint(">I") != _TPM_GENERATED_VALUE:
        raise MalformedArtifactError(f"{what}: TPMS_ATTEST magic is not TPM_GENERATED_VALUE")
    if r.uint(">H") != _TPM_ST_ATTEST_QUOTE:
        raise MalformedArtifactError(f"{what}: TPMS_ATTEST is not a quote")
    signer, extra = r.sized(), r.sized()
    clock, resets, restarts = r.uint(">Q"), r.uint(">I"), r.uint(">I")
    r.take(1 + 8)  # clockInfo.safe, firmwareVersion
    banks = []
    for _ in range(r.uint(">I")):
        alg, size = r.uint(">H"), r.uint(">B")
        bits = r.take(size)
        banks.append((alg, tuple(i for i in range(8 * size) if bits[i // 8] >> (i % 8) & 1)))
    digest = r.sized()
    if r.at != len(data):
        raise MalformedArtifactError(f"{what}: bytes after the TPMS_ATTEST")
    return QuoteInfo(signer, extra, clock, resets, restarts, tuple(banks), digest)


def _qualifying_data(payload: bytes) -> bytes:
    return hashlib.sha256(pae(PAYLOAD_TYPE_IN_TOTO, payload)).digest()


def _device_name(device: str) -> str:
    """`cpu`, or the CUDA device's UUID where torch can tell it (else the device string itself)."""
    if not device.startswith("cuda") or "torch" not in sys.modules:
        return device
    torch = sys.modules["torch"]
    try:
        index = int(device.partition(":")[2] or torch.cuda.current_device())
        return f"GPU-{torch.cuda.get_device_properties(index).uuid}"
    except Exception:  # noqa: BLE001 - a UUID torch cannot give is recorded as the device string
        return device


_AK_IDS: dict[tuple[int, str | None], TrustedKey] = {}


def emit_load_receipt(
    requirement: LoadReceiptRequirement,
    *,
    root_digest: str,
    model_name: str,
    files: Sequence[str],
    tensors: int,
    device: str,
    policy_digest: str,
    pinned_digests: Collection[str],
    tpm: TpmAttestationKey | None = None,
    now: datetime | None = None,
) -> str | None:
    """Build a load receipt, have the node's TPM quote it, and write it to the requirement's store.

    Args:
        requirement: The policy's `loadReceipt` (AK handle, PCRs, store).
        root_digest: The verified model root digest (hex SHA-256).
        model_name: The model directory's name (informational).
        files: The model files the tensors came from.
        tensors: How many tensors were loaded.
        device: The torch device string the tensors went to.
        policy_digest: Hex SHA-256 of the policy file ("" when not read from a file).
        pinned_digests: The digests that pinned the load (`sha256:<hex>`).
        tpm: The node's AK; default `TpmAttestationKey(requirement.attestation_key_handle)`.
        now: The load's time; default the current time.

    Returns:
        Where the receipt was stored (a file, or `oci://...@sha256:<referrer digest>`), or None when the
        requirement names no store.

    Raises:
        BackendUnavailableError: The TPM or tpm2-tools are unreachable, or the AK cannot be read; the
            requirement's TSA cannot be reached or answers with no usable timestamp; the store cannot be
            written.
        KeyMaterialError: The TPM's AK is not an ECDSA P-256 key.
        MalformedArtifactError: A field cannot be recorded (e.g. an unprintable executable path).
    """
    tpm = tpm or TpmAttestationKey(requirement.attestation_key_handle)
    receipt = LoadReceipt(
        root_digest=root_digest,
        loaded_at=now or datetime.now(UTC),
        files=tuple(files),
        tensors=tensors,
        device=_device_name(device),
        pid=os.getpid(),
        executable=os.path.realpath(sys.executable),
        workload={k: os.environ[v] for k, v in WORKLOAD_ENV.items() if os.environ.get(v)},
        attestation_key=_ak_id(tpm).keyid,
        policy_digest=policy_digest,
        pinned_digests=tuple(sorted(pinned_digests)),
    )
    payload = serialize_statement(receipt_statement(receipt, model_name=model_name))
    document = _quoted_document(payload, requirement, tpm, RECEIPT_MEDIA_TYPE)
    if requirement.store is None:
        return None
    return open_receipt_store(requirement.store).put_receipt(document, receipt)


def _ak_id(tpm: TpmAttestationKey) -> TrustedKey:
    """The AK's public key (read once per TPM and handle in a process: one TPM call less per load)."""
    which = (tpm.handle, tpm.tcti or os.environ.get("TPM2TOOLS_TCTI"))
    ak = _AK_IDS.get(which)
    if ak is None:
        ak = _AK_IDS.setdefault(which, load_trusted_key(tpm.public_key_pem(), name=f"TPM AK {tpm.handle:#x}"))
    return ak


def _quoted_document(
    payload: bytes, requirement: LoadReceiptRequirement, tpm: TpmAttestationKey, media_type: str
) -> bytes:
    """The document of `payload`: the TPM's quote over it, and the TSA's timestamp of the quote if asked."""
    quote = tpm.quote(_qualifying_data(payload), sorted(requirement.pcrs))
    timestamps: tuple[bytes, ...] = ()
    if requirement.timestamp_url is not None:
        from modelsec.verifier.trust.timestamps import request_timestamp

        try:
            timestamps = (request_timestamp(quote.signature, requirement.timestamp_url),)
        except (MalformedArtifactError, SignatureError) as e:
            # A TSA that answers wrongly is as unusable to the node as one that does not answer.
            raise BackendUnavailableError(f"load receipt timestamp: {e.diagnostics()}") from e
    return receipt_document(payload, quote, timestamps=timestamps, media_type=media_type)


class ReceiptWarning(UserWarning):
    """A load receipt the policy asks for but does not require could not be emitted (the load went on)."""


def emit_receipt_for(
    admission: ModelAdmission,
    root_digest: str,
    model_name: str,
    files: Sequence[str],
    tensors: int,
    device: str,
    pins: Collection[str] | None,
) -> str | None:
    """Emit the receipt of a verified load if the deciding policy asks for one (`loadReceipt`).

    Called by the loader and the runtime guard after the bytes were verified and before the tensors are
    returned, so that a required receipt that cannot be emitted leaves the caller with nothing.

    Returns:
        Where the receipt was stored, or None (no `loadReceipt` or store, or an optional receipt that failed).

    Raises:
        Error: `loadReceipt.required` and the receipt could not be emitted (as `emit_load_receipt`; a TPM
            that cannot be reached is a `BackendUnavailableError`).
    """
    requirement = admission.policy.load_receipt
    if requirement is None:
        return None
    try:
        return emit_load_receipt(
            requirement,
            root_digest=root_digest,
            model_name=model_name,
            files=files,
            tensors=tensors,
            device=device,
            policy_digest=admission.policy_digest,
            pinned_digests=pins or (),
        )
    except Error as e:
        if requirement.required:
            raise
        warnings.warn(f"load receipt not emitted: {e.diagnostics()}", ReceiptWarning, stacklevel=3)
        return None


def receipt_document(
    payload: bytes,
    quote: TpmQuote,
    *,
    timestamps: Sequence[bytes] = (),
    media_type: str = RECEIPT_MEDIA_TYPE,
) -> bytes:
    """A receipt (or snapshot) file's bytes (the module docstring's shape) for a statement and its quote.

    Args:
        payload: The serialized statement.
        quote: The TPM's quote over SHA-256 of its DSSE PAE.
        timestamps: DER RFC 3161 `TimeStampResp`s over `quote.signature` (`rfc3161Timestamps`).
        media_type: `RECEIPT_MEDIA_TYPE` or `SNAPSHOT_MEDIA_TYPE`.
    """
    doc: dict[str, Any] = {
        "mediaType": media_type,
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE_IN_TOTO,
            "signatures": [],
        },
        "tpmQuote": {
            "attest": base64.b64encode(quote.attest).decode(),
            "signature": base64.b64encode(quote.signature).decode(),
            "pcrs": {"sha256": {str(i): v.hex() for i, v in sorted(quote.pcrs.items())}},
        },
    }
    if timestamps:
        doc["rfc3161Timestamps"] = [base64.b64encode(t).decode() for t in timestamps]
    return json.dumps(doc, indent=1).encode()


def _b64(value: object, field: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedArtifactError(f"{what}: {field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise MalformedArtifactError(f"{what}: {field} is not base64") from None


def document_media_type(data: bytes, what: str) -> str:
    """The `mediaType` of a receipt or snapshot file (nothing else is checked).

    Raises:
        MalformedArtifactError: Too large, not JSON, or neither media type.
    """
    doc = _document(data, what)
    media_type: str = doc["mediaType"]
    return media_type


def _document(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > _MAX_RECEIPT_BYTES:
        raise MalformedArtifactError(f"{what}: larger than {_MAX_RECEIPT_BYTES} bytes")
    doc: Any = strict_loads(data, what=what)
    if not isinstance(doc, dict) or doc.get("mediaType") not in (RECEIPT_MEDIA_TYPE, SNAPSHOT_MEDIA_TYPE):
        raise MalformedArtifactError(
            f"{what}: not a load receipt or snapshot "
            f"(mediaType {RECEIPT_MEDIA_TYPE} or {SNAPSHOT_MEDIA_TYPE})"
        )
    unknown = set(doc) - {"mediaType", "dsseEnvelope", "tpmQuote", "rfc3161Timestamps"}
    if unknown:
        raise MalformedArtifactError(f"{what}: unknown field(s) {sorted(unknown)}")
    return doc


def _parse_document(data: bytes, what: str, media_type: str) -> tuple[bytes, TpmQuote, tuple[bytes, ...]]:
    doc = _document(data, what)
    if doc["mediaType"] != media_type:
        raise MalformedArtifactError(f"{what}: mediaType {doc['mediaType']}, not {media_type}")
    env, quote = doc.get("dsseEnvelope"), doc.get("tpmQuote")
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE_IN_TOTO:
        raise MalformedArtifactError(f"{what}: dsseEnvelope.payloadType must be {PAYLOAD_TYPE_IN_TOTO}")
    if not isinstance(quote, dict) or not isinstance(quote.get("pcrs"), dict):
        raise MalformedArtifactError(f"{what}: tpmQuote must be an object with attest, signature and pcrs")
    bank = quote["pcrs"].get("sha256", {})
    if set(quote["pcrs"]) - {"sha256"} or not isinstance(bank, dict):
        raise MalformedArtifactError(f"{what}: tpmQuote.pcrs holds only a sha256 bank")
    pcrs: dict[int, bytes] = {}
    for k, v in bank.items():
        if not (k.isdigit() and 0 <= int(k) <= 23 and isinstance(v, str) and len(v) == 64):
            raise MalformedArtifactError(f"{what}: tpmQuote.pcrs.sha256.{k} is not PCR 0-23 -> hex SHA-256")
        try:
            pcrs[int(k)] = bytes.fromhex(v)
        except ValueError:
            raise MalformedArtifactError(f"{what}: tpmQuote.pcrs.sha256.{k} is not hex") from None
    tokens = doc.get("rfc3161Timestamps", [])
    if not isinstance(tokens, list) or len(tokens) > _MAX_TIMESTAMPS:
        raise MalformedArtifactError(f"{what}: rfc3161Timestamps must be a list of at most {_MAX_TIMESTAMPS}")
    return (
        _b64(env.get("payload"), "dsseEnvelope.payload", what),
        TpmQuote(
            _b64(quote.get("attest"), "tpmQuote.attest", what),
            _b64(quote.get("signature"), "tpmQuote.signature", what),
            pcrs,
        ),
        tuple(_b64(t, f"rfc3161Timestamps[{i}]", what) for i, t in enumerate(tokens)),
    )


@dataclass(frozen=True, slots=True)
class VerifiedReceipt:
    """A receipt whose quote and content were verified under a policy.

    Attributes:
        receipt: The statement's fields (node claims, now signed by `node`'s TPM).
        node: The registered node whose AK signed the quote.
        quote: The quote's parsed fields.
        timestamp: The trusted RFC 3161 time of the quote, or None (no TSA configured).
        digest: `sha256:<hex>` of the receipt file's bytes.
    """

    receipt: LoadReceipt
    node: str
    quote: QuoteInfo
    timestamp: datetime | None = None
    digest: str = ""

    @property
    def time(self) -> datetime:
        """The receipt's own time (`loadedAt`)."""
        return self.receipt.loaded_at


@dataclass(frozen=True, slots=True)
class VerifiedSnapshot:
    """A load snapshot whose quote and content were verified under a policy.

    Attributes:
        snapshot: The statement's fields.
        node: The registered node whose AK signed the quote.
        quote: The quote's parsed fields.
        timestamp: The trusted RFC 3161 time of the quote, or None.
        digest: `sha256:<hex>` of the snapshot file's bytes.
    """

    snapshot: LoadSnapshot
    node: str
    quote: QuoteInfo
    timestamp: datetime | None = None
    digest: str = ""

    @property
    def time(self) -> datetime:
        """The snapshot's own time (`takenAt`)."""
        return self.snapshot.taken_at


Quoted = VerifiedReceipt | VerifiedSnapshot
"""A verified receipt or snapshot: what the TPM-clock check compares a new quote against."""


@dataclass(frozen=True, slots=True)
class _Checked:
    node: str
    quote: QuoteInfo
    timestamp: datetime | None


def _verify_quoted(
    payload: bytes,
    quote: TpmQuote,
    requirement: LoadReceiptRequirement,
    *,
    what: str,
    attestation_key: str,
    node: str | None,
) -> _Checked:
    """The checks a receipt and a snapshot share before their content (module docstring, steps 1-4)."""
    signer = None
    for key in requirement.nodes:
        try:
            key.verify(quote.signature, quote.attest)
        except SignatureError:
            continue
        signer = key
        break
    if signer is None:
        raise ReceiptError(
            what, "unregistered-key", "the quote is signed by no registered node's attestation key"
        )
    if not hmac.compare_digest(attestation_key, signer.keyid):
        raise ReceiptError(
            what, "node", f"the statement names attestation key {attestation_key[:16]}…, but node "
            f"{signer.name!r} signed the quote (a receipt replayed from another node)"
        )  # fmt: skip
    if node is not None and signer.name != node:
        raise ReceiptError(what, "node", f"signed by node {signer.name!r}, not {node!r}")
    info = parse_attest(quote.attest, what=what)
    if not hmac.compare_digest(info.extra_data, _qualifying_data(payload)):
        raise ReceiptError(
            what, "qualifying-data", "the quote is over other qualifying data than this statement"
        )
    expected_sel = ((_TPM_ALG_SHA256, tuple(sorted(requirement.pcrs))),)
    if info.pcr_selection != expected_sel or set(quote.pcrs) != set(requirement.pcrs):
        raise ReceiptError(
            what,
            "pcr",
            f"the quote covers PCRs {info.pcr_selection}, the policy sha256:{sorted(requirement.pcrs)}",
        )
    values = b"".join(quote.pcrs[i] for i in sorted(quote.pcrs))
    if not hmac.compare_digest(hashlib.sha256(values).digest(), info.pcr_digest):
        raise ReceiptError(what, "pcr", "the receipt's PCR values are not the ones the TPM quoted")
    for i, want in sorted(requirement.pcrs.items()):
        if not hmac.compare_digest(quote.pcrs[i], want):
            raise ReceiptError(
                what, "pcr", f"PCR sha256:{i} is {quote.pcrs[i].hex()}, the policy's {want.hex()}"
            )
    return _Checked(signer.name, info, None)


def _check_time(
    checked: _Checked,
    quote: TpmQuote,
    tokens: tuple[bytes, ...],
    requirement: LoadReceiptRequirement,
    *,
    what: str,
    stated_time: datetime,
    previous: Quoted | None,
    now: datetime | None,
    fresh: bool,
) -> datetime | None:
    """Steps 6-8: the TSA's time, the TPM clock against an earlier quote, the age; the trusted TSA time."""
    window = requirement.window_seconds
    at = now or datetime.now(UTC)
    trusted: datetime | None = None
    if requirement.timestamp_url is not None and not tokens:
        raise ReceiptError(what, "timestamp", "the policy asks for an RFC 3161 timestamp of the quote; none")
    if tokens and requirement.timestamp_authorities:
        from modelsec.verifier.trust.timestamps import verify_timestamps

        try:
            times = verify_timestamps(
                tokens, quote.signature, requirement.timestamp_authorities, source=what, now=at
            )
        except (MalformedArtifactError, SignatureError) as e:
            raise ReceiptError(what, "timestamp", e.diagnostics()) from e
        trusted = min(times)
        for t in times:
            off = (t - stated_time).total_seconds()
            if abs(off) > window:
                raise ReceiptError(
                    what, "stale", f"the TSA dated the quote {t.isoformat()}, {off:+.0f}s from the "
                    f"statement's time {stated_time.isoformat()}, beyond the policy's window of {window:.0f}s"
                )  # fmt: skip
    if previous is not None:
        _check_tpm_clock(checked, previous, stated_time, window, what)
    if fresh:
        age = (at - stated_time).total_seconds()
        if age > requirement.max_age_seconds or stated_time - at > _FUTURE_SKEW:
            raise ReceiptError(
                what, "stale", f"dated {stated_time.isoformat()}, {age:.0f}s from now, outside the "
                f"policy's maxAge of {requirement.max_age_seconds:.0f}s"
            )  # fmt: skip
    return trusted


def _check_tpm_clock(
    checked: _Checked, previous: Quoted, stated_time: datetime, window: float, what: str
) -> None:
    """Refuse a quote whose TPM clock does not fit its stated time, measured from an earlier quote.

    `clockInfo.clock` counts milliseconds the TPM has been powered (TPM 2.0 Part 1, 36.3); within one
    power cycle (same `resetCount` and `restartCount`) its advance equals the wall time between the two
    quotes. Across a reset it may only have advanced less (the TPM was off), never more, and the counters
    never go back. A statement dated far from when its TPM quoted it (a receipt quoted early and dated
    later, or an old quote re-dated) is `stale`.
    """
    if previous.node != checked.node:
        return  # another node's TPM: another clock
    earlier, later = (previous.quote, checked.quote), (previous.time, stated_time)
    wall = (later[1] - later[0]).total_seconds()
    if wall < 0:
        earlier, wall = (checked.quote, previous.quote), -wall
    first, second = earlier
    tpm = (second.clock - first.clock) / 1000
    same_cycle = (first.reset_count, first.restart_count) == (second.reset_count, second.restart_count)
    if same_cycle and abs(tpm - wall) > window:
        raise ReceiptError(
            what, "stale", f"the TPM clock advanced {tpm:.0f}s between this quote and the node's quote "
            f"{previous.digest or 'given'}, the statements' times {wall:.0f}s: more than the policy's "
            f"window of {window:.0f}s apart"
        )  # fmt: skip
    if not same_cycle and (
        (second.reset_count, second.restart_count) < (first.reset_count, first.restart_count)
        or tpm > wall + window
    ):
        raise ReceiptError(
            what, "stale", f"the TPM's clock or reset counters do not fit the statements' times "
            f"({wall:.0f}s apart, TPM clock {tpm:+.0f}s, reset count {first.reset_count} -> "
            f"{second.reset_count})"
        )  # fmt: skip


def _file_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify_receipt(
    data: bytes,
    requirement: LoadReceiptRequirement,
    *,
    what: str = "load receipt",
    expected_digest: str | None = None,
    node: str | None = None,
    previous: Quoted | None = None,
    now: datetime | None = None,
    fresh: bool = True,
) -> VerifiedReceipt:
    """Verify a receipt file's quote and content under the policy's `loadReceipt` (module docstring order).

    Args:
        data: The receipt file's bytes.
        requirement: Registered nodes, expected PCR values, TSAs, `window`, `maxAge`.
        what: Names the receipt in errors.
        expected_digest: The model root digest (hex or `sha256:<hex>`) the receipt must be about; None: any.
        node: The registered node name the receipt must come from; None: any registered node.
        previous: An earlier verified receipt or snapshot of the same node, whose TPM clock this quote's
            must fit (another node's is ignored); None: no TPM-clock check.
        now: The verification time; default the current time.
        fresh: Whether the receipt must be younger than `maxAge` (False for history: `receipts list`,
            `receipts snapshot`); the TSA and TPM-clock checks apply either way.

    Returns:
        The verified receipt, the node that signed it and its trusted timestamp.

    Raises:
        ReceiptError: A check failed; `reason` names it (`unregistered-key`, `node`, `qualifying-data`,
            `pcr`, `model-digest`, `timestamp`, `stale`).
        MalformedArtifactError: The file, statement or TPMS_ATTEST cannot be parsed.
    """
    payload, quote, tokens = _parse_document(data, what, RECEIPT_MEDIA_TYPE)
    statement = parse_statement(payload, what=what)
    receipt = parse_receipt_statement(statement, what=what)
    checked = _verify_quoted(
        payload, quote, requirement, what=what, attestation_key=receipt.attestation_key, node=node
    )
    if expected_digest is not None:
        want_digest = expected_digest.removeprefix("sha256:")
        if not hmac.compare_digest(receipt.root_digest, want_digest):
            raise ReceiptError(
                what, "model-digest", f"about model {receipt.root_digest}, not the loaded {want_digest}"
            )
    trusted = _check_time(
        checked, quote, tokens, requirement, what=what, stated_time=receipt.loaded_at, previous=previous,
        now=now, fresh=fresh,
    )  # fmt: skip
    return VerifiedReceipt(receipt, checked.node, checked.quote, trusted, _file_digest(data))


def verify_snapshot(
    data: bytes,
    requirement: LoadReceiptRequirement,
    *,
    what: str = "load snapshot",
    node: str | None = None,
    previous: Quoted | None = None,
    now: datetime | None = None,
    fresh: bool = True,
) -> VerifiedSnapshot:
    """Verify a snapshot file (`receipts snapshot`) as `verify_receipt` verifies a receipt.

    The same checks apply, with `takenAt` as the statement's time and the node's AK as its subject; there is
    no model digest to compare. The receipts a snapshot names are not re-read here.

    Raises:
        ReceiptError: As `verify_receipt` (no `model-digest`).
        MalformedArtifactError: The file, statement or TPMS_ATTEST cannot be parsed.
    """
    payload, quote, tokens = _parse_document(data, what, SNAPSHOT_MEDIA_TYPE)
    snapshot = parse_snapshot_statement(parse_statement(payload, what=what), what=what)
    checked = _verify_quoted(
        payload, quote, requirement, what=what, attestation_key=snapshot.attestation_key, node=node
    )
    trusted = _check_time(
        checked, quote, tokens, requirement, what=what, stated_time=snapshot.taken_at, previous=previous,
        now=now, fresh=fresh,
    )  # fmt: skip
    return VerifiedSnapshot(snapshot, checked.node, checked.quote, trusted, _file_digest(data))


def check_tpm_clock(earlier: Quoted, later: Quoted, requirement: LoadReceiptRequirement) -> None:
    """Refuse `later` if its TPM clock does not fit its time, measured from `earlier` (same node only).

    Raises:
        ReceiptError: `stale` (see `verify_receipt`'s `previous`).
    """
    _check_tpm_clock(
        _Checked(later.node, later.quote, later.timestamp),
        earlier,
        later.time,
        requirement.window_seconds,
        later.digest or "load receipt",
    )


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """One receipt of a model in a store, as `receipts list` shows it.

    Attributes:
        source: Where the store holds it.
        verified: The verified receipt, or None when it was refused.
        reason: Why it was refused (`ReceiptError.reason`, or `malformed`); "" when verified.
        detail: The refusal's message; "" when verified.
    """

    source: str
    verified: VerifiedReceipt | None
    reason: str = ""
    detail: str = ""


def list_receipts(
    requirement: LoadReceiptRequirement,
    root_digest: str,
    *,
    store: ReceiptStore | None = None,
    now: datetime | None = None,
) -> list[ReceiptRow]:
    """Every receipt about `root_digest` in the store, each verified (history: no `maxAge`), oldest first.

    Receipts of one node are also checked against each other's TPM clock (`check_tpm_clock`), in the order
    of their times. A refused receipt is listed with its reason when its (untrusted) subject is this model;
    receipts about other models are left out.

    Args:
        requirement: The policy's `loadReceipt` (nodes, PCRs, TSAs, window; its `store` unless `store`).
        root_digest: The model root digest, hex or `sha256:<hex>`.
        store: The store to read; default the requirement's.
        now: The verification time.

    Raises:
        PolicyError: No store given and the requirement names none.
        BackendUnavailableError: The store cannot be read.
    """
    digest = root_digest.removeprefix("sha256:")
    if store is None:
        if requirement.store is None:
            raise PolicyError("loadReceipt names no store to list receipts from")
        store = open_receipt_store(requirement.store)
    rows: list[ReceiptRow] = []
    for source, data in store.receipts(digest):
        try:
            rows.append(
                ReceiptRow(
                    source,
                    verify_receipt(
                        data, requirement, what=source, expected_digest=digest, now=now, fresh=False
                    ),
                )
            )
        except ReceiptError as e:
            if e.reason != "model-digest":
                rows.append(ReceiptRow(source, None, e.reason, e.diagnostics()))
        except MalformedArtifactError as e:
            rows.append(ReceiptRow(source, None, "malformed", e.diagnostics()))
    good = sorted(((r.source, r.verified) for r in rows if r.verified is not None), key=lambda r: r[1].time)
    last: dict[str, VerifiedReceipt] = {}
    out: list[ReceiptRow] = []
    for source, receipt in good:
        before = last.get(receipt.node)
        if before is not None:
            try:
                check_tpm_clock(before, receipt, requirement)
            except ReceiptError as e:
                out.append(ReceiptRow(source, None, e.reason, e.diagnostics()))
                continue
        last[receipt.node] = receipt
        out.append(ReceiptRow(source, receipt))
    return out + [r for r in rows if r.verified is None]


def boot_time() -> datetime:
    """When this machine booted: `btime` of /proc/stat (Linux, seconds since the epoch, UTC).

    Raises:
        BackendUnavailableError: /proc/stat cannot be read or has no btime.
    """
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return datetime.fromtimestamp(int(line.split()[1]), UTC)
    except (OSError, ValueError) as e:
        raise BackendUnavailableError(f"/proc/stat: cannot read the boot time: {e}") from e
    raise BackendUnavailableError("/proc/stat: no btime line (not Linux?)")


@dataclass(frozen=True, slots=True)
class TakenSnapshot:
    """What `take_snapshot` made.

    Attributes:
        document: The snapshot file's bytes.
        snapshot: Its statement's fields.
        stored: Where the store put it (None when the requirement names no store).
        skipped: `(source, reason)` of each receipt in the store it left out (refused, or another node's).
    """

    document: bytes
    snapshot: LoadSnapshot
    stored: str | None
    skipped: tuple[tuple[str, str], ...]


def take_snapshot(
    requirement: LoadReceiptRequirement,
    *,
    tpm: TpmAttestationKey | None = None,
    since: datetime | None = None,
    now: datetime | None = None,
) -> TakenSnapshot:
    """Sign the node's current set of loaded models the way a receipt is signed (TPM quote, timestamp).

    The set is the receipts in the requirement's store that this node's AK quoted at or after `since`
    (default: this machine's boot time, `boot_time`), each verified under `requirement` (without `maxAge`;
    a refused one is left out and listed in `skipped`). It says which loads happened since boot, not whether
    the loading processes still run (a watchdog compares the `pid`s). The snapshot is written to the store.

    Raises:
        PolicyError: The requirement names no store (there is no record of loads to take).
        BackendUnavailableError: The TPM, the TSA or the store cannot be reached; no boot time.
    """
    if requirement.store is None:
        raise PolicyError("loadReceipt names no store: a node without receipts has no loads to snapshot")
    tpm = tpm or TpmAttestationKey(requirement.attestation_key_handle)
    keyid = _ak_id(tpm).keyid
    start = since or boot_time()
    store = open_receipt_store(requirement.store)
    loads: list[SnapshotLoad] = []
    skipped: list[tuple[str, str]] = []
    for source, data in store.receipts(None):
        try:
            v = verify_receipt(data, requirement, what=source, now=now, fresh=False)
        except (ReceiptError, MalformedArtifactError) as e:
            skipped.append((source, e.diagnostics()))
            continue
        if v.receipt.attestation_key != keyid:
            skipped.append((source, f"quoted by node {v.node!r}, not this node's TPM"))
        elif v.receipt.loaded_at >= start:
            r = v.receipt
            loads.append(
                SnapshotLoad(f"sha256:{r.root_digest}", r.loaded_at, r.device, r.pid, r.workload, v.digest)
            )
    snapshot = LoadSnapshot(
        attestation_key=keyid,
        taken_at=now or datetime.now(UTC),
        boot_time=start,
        loads=tuple(sorted(loads, key=lambda x: (x.loaded_at, x.receipt))),
    )
    payload = serialize_statement(snapshot_statement(snapshot))
    document = _quoted_document(payload, requirement, tpm, SNAPSHOT_MEDIA_TYPE)
    stored = store.put_snapshot(document, snapshot)
    return TakenSnapshot(document, snapshot, stored, tuple(skipped))
