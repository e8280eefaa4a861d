"""Load receipts: a node states, signed by its TPM, that it verified and loaded a model (issue 33).

A receipt file (`application/vnd.modelsec.load-receipt.v1+json`) holds a DSSE envelope whose payload is the
load receipt statement (`modelsec.attestations.predicates.load_receipt`) and, in place of a DSSE signature,
a TPM2 quote by the node's attestation key (AK) whose qualifying data is SHA-256 of the envelope's DSSE PAE:

```json
{"mediaType": "application/vnd.modelsec.load-receipt.v1+json",
 "dsseEnvelope": {"payload": "<base64 statement>", "payloadType": "application/vnd.in-toto+json",
                  "signatures": []},
 "tpmQuote": {"attest": "<base64 TPMS_ATTEST>", "signature": "<base64 DER ECDSA P-256>",
              "pcrs": {"sha256": {"0": "<hex>", "7": "<hex>"}}}}
```

`verify_receipt` checks, in this order, and refuses with `ReceiptError` naming the reason:
1. the quote's signature by one of the policy's registered nodes (`unregistered-key` otherwise);
2. that the statement names that node's AK (`node`), and the node the caller expects, if any (`node`);
3. the TPMS_ATTEST: TPM_GENERATED_VALUE, TPM_ST_ATTEST_QUOTE, extraData = SHA-256(PAE) (`qualifying-data`);
4. the quoted PCR selection and digest: the digest of the receipt's PCR values, and each value equal to
   the policy's (`pcr`);
5. the receipt's subject against the digest the caller loaded (`model-digest`);
6. freshness: `loadedAt` no older than the policy's `maxAge` and not in the future beyond a minute (`stale`).

What it proves: a TPM holding a registered AK, in the boot state the policy's PCRs describe, signed this
statement. What it does not: that the AK lives in a hardware TPM (a software TPM such as swtpm proves
nothing about hardware; the enrolment of the AK against a hardware TPM's endorsement key, or a confidential
VM's vTPM, is what makes it so), nor that the node's software told the truth in the statement's fields.
Not yet checked (see docs/load-receipts.md): an RFC 3161 timestamp over the quote, and the TPM clock against a
previous quote of the same node.
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
from pathlib import Path
from typing import Any

from modelsec.attestations.dsse import PAYLOAD_TYPE_IN_TOTO, pae
from modelsec.attestations.predicates.load_receipt import (
    WORKLOAD_ENV,
    LoadReceipt,
    parse_receipt_statement,
    receipt_statement,
)
from modelsec.attestations.statement import parse_statement, serialize_statement
from modelsec.errors import Error, MalformedArtifactError, ReceiptError, SignatureError
from modelsec.policy.requirements import LoadReceiptRequirement
from modelsec.signer.keys import TrustedKey, load_trusted_key
from modelsec.signer.tpm import TpmAttestationKey, TpmQuote
from modelsec.strict_json import strict_loads
from modelsec.verifier.admission import ModelAdmission

__all__ = [
    "RECEIPT_MEDIA_TYPE",
    "QuoteInfo",
    "ReceiptWarning",
    "VerifiedReceipt",
    "emit_load_receipt",
    "emit_receipt_for",
    "parse_attest",
    "receipt_document",
    "verify_receipt",
]

RECEIPT_MEDIA_TYPE = "application/vnd.modelsec.load-receipt.v1+json"
_TPM_GENERATED_VALUE = 0xFF544347
_TPM_ST_ATTEST_QUOTE = 0x8018
_TPM_ALG_SHA256 = 0x000B
_MAX_RECEIPT_BYTES = 16 * 2**20
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


@dataclass(frozen=True, slots=True)
class VerifiedReceipt:
    """A receipt whose quote and content were verified under a policy.

    Attributes:
        receipt: The statement's fields (node claims, now signed by `node`'s TPM).
        node: The registered node whose AK signed the quote.
        quote: The quote's parsed fields.
    """

    receipt: LoadReceipt
    node: str
    quote: QuoteInfo


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
) -> Path | None:
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
        The receipt file written, or None when the requirement names no store.

    Raises:
        BackendUnavailableError: The TPM or tpm2-tools are unreachable, or the AK cannot be read.
        KeyMaterialError: The TPM's AK is not an ECDSA P-256 key.
        MalformedArtifactError: A field cannot be recorded (e.g. an unprintable executable path).
    """
    tpm = tpm or TpmAttestationKey(requirement.attestation_key_handle)
    # The AK's public key is read once per TPM and handle in a process (one TPM call less per load).
    which = (tpm.handle, tpm.tcti or os.environ.get("TPM2TOOLS_TCTI"))
    ak = _AK_IDS.get(which)
    if ak is None:
        ak = _AK_IDS.setdefault(which, load_trusted_key(tpm.public_key_pem(), name=f"TPM AK {tpm.handle:#x}"))
    receipt = LoadReceipt(
        root_digest=root_digest,
        loaded_at=now or datetime.now(UTC),
        files=tuple(files),
        tensors=tensors,
        device=_device_name(device),
        pid=os.getpid(),
        executable=os.path.realpath(sys.executable),
        workload={k: os.environ[v] for k, v in WORKLOAD_ENV.items() if os.environ.get(v)},
        attestation_key=ak.keyid,
        policy_digest=policy_digest,
        pinned_digests=tuple(sorted(pinned_digests)),
    )
    payload = serialize_statement(receipt_statement(receipt, model_name=model_name))
    quote = tpm.quote(_qualifying_data(payload), sorted(requirement.pcrs))
    document = receipt_document(payload, quote)
    if requirement.store is None:
        return None
    requirement.store.mkdir(parents=True, exist_ok=True)
    stamp = receipt.loaded_at.strftime("%Y%m%dT%H%M%S%fZ")
    path = requirement.store / f"{root_digest[:16]}-{stamp}-{receipt.pid}.receipt.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(document)
    tmp.replace(path)  # a reader never sees half a receipt
    return path


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
) -> Path | None:
    """Emit the receipt of a verified load if the deciding policy asks for one (`loadReceipt`).

    Called by the loader and the runtime guard after the bytes were verified and before the tensors are
    returned, so that a required receipt that cannot be emitted leaves the caller with nothing.

    Returns:
        The receipt written, or None (no `loadReceipt`, no store, or an optional receipt that failed).

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


def receipt_document(payload: bytes, quote: TpmQuote) -> bytes:
    """The receipt file's bytes (the module docstring's shape) for a statement and its quote."""
    return json.dumps(
        {
            "mediaType": RECEIPT_MEDIA_TYPE,
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
        },
        indent=1,
    ).encode()


def _b64(value: object, field: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedArtifactError(f"{what}: {field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise MalformedArtifactError(f"{what}: {field} is not base64") from None


def _parse_document(data: bytes, what: str) -> tuple[bytes, TpmQuote]:
    if len(data) > _MAX_RECEIPT_BYTES:
        raise MalformedArtifactError(f"{what}: larger than {_MAX_RECEIPT_BYTES} bytes")
    doc: Any = strict_loads(data, what=what)
    if not isinstance(doc, dict) or doc.get("mediaType") != RECEIPT_MEDIA_TYPE:
        raise MalformedArtifactError(f"{what}: not a load receipt (mediaType {RECEIPT_MEDIA_TYPE})")
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
    return _b64(env.get("payload"), "dsseEnvelope.payload", what), TpmQuote(
        _b64(quote.get("attest"), "tpmQuote.attest", what),
        _b64(quote.get("signature"), "tpmQuote.signature", what),
        pcrs,
    )


def verify_receipt(
    data: bytes,
    requirement: LoadReceiptRequirement,
    *,
    what: str = "load receipt",
    expected_digest: str | None = None,
    node: str | None = None,
    now: datetime | None = None,
) -> VerifiedReceipt:
    """Verify a receipt file's quote and content under the policy's `loadReceipt` (module docstring order).

    Args:
        data: The receipt file's bytes.
        requirement: Registered nodes, expected PCR values, `maxAge`.
        what: Names the receipt in errors.
        expected_digest: The model root digest (hex or `sha256:<hex>`) the receipt must be about; None: any.
        node: The registered node name the receipt must come from; None: any registered node.
        now: The verification time; default the current time.

    Returns:
        The verified receipt and the node that signed it.

    Raises:
        ReceiptError: A check failed; `reason` names it (`unregistered-key`, `node`, `qualifying-data`,
            `pcr`, `model-digest`, `stale`).
        MalformedArtifactError: The file, statement or TPMS_ATTEST cannot be parsed.
    """
    payload, quote = _parse_document(data, what)
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
    statement = parse_statement(payload, what=what)
    receipt = parse_receipt_statement(statement, what=what)
    if not hmac.compare_digest(receipt.attestation_key, signer.keyid):
        raise ReceiptError(
            what, "node", f"the statement names attestation key {receipt.attestation_key[:16]}…, but node "
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
    if expected_digest is not None:
        want_digest = expected_digest.removeprefix("sha256:")
        if not hmac.compare_digest(receipt.root_digest, want_digest):
            raise ReceiptError(
                what, "model-digest", f"about model {receipt.root_digest}, not the loaded {want_digest}"
            )
    at = now or datetime.now(UTC)
    age = (at - receipt.loaded_at).total_seconds()
    if age > requirement.max_age_seconds or receipt.loaded_at - at > _FUTURE_SKEW:
        raise ReceiptError(
            what, "stale", f"loadedAt {receipt.loaded_at.isoformat()} is {age:.0f}s from now, outside the "
            f"policy's maxAge of {requirement.max_age_seconds:.0f}s"
        )  # fmt: skip
    return VerifiedReceipt(receipt, signer.name, info)
