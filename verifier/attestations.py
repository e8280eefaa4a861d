"""Joint verification: one policy over weights signatures, watermark and robustness-gate attestations.

`verify_attestations(root_digest, bundles, policy)` needs no weights (the webhook and the service use it
with bundles from a store); `verify_model` and `load_model` call it with the bundles found next to the
model when the policy requires attestations. Order for each bundle, failing closed at every step:

1. strict bundle parsing (media type, exactly one DSSE signature, exact payloadType);
2. the predicate type (read from the payload only to choose the signing role) must be known: the OMS
   weights manifest (role `weights`), `https://modelsec.dev/watermark/v1` (role `watermark`) or
   `https://modelsec.dev/robustness-gate/v1` (role `gate`); anything else is refused by name;
3. the signature must verify under a policy key holding that role (keys never come from the bundle);
4. the statement's subject (parsed once, from the payload bytes the signature covers) must be this model's
   root digest (an attestation replayed from another model does not count);
5. every number of the predicate must lie in its field's range (`modelsec.attestations.predicates`, before
   any arithmetic), and the predicate must meet the policy: the gate's attack, ε, verdict, robust accuracy
   under the policy's rule (point or Wilson lower bound), sample count, sanity checks and freshness
   (`finishedAt`); the watermark's embed-time detection, confidence and false-positive probability.

Bundles failing steps 1-4 are *ignored* (they are not this model's evidence under this policy, and a
shared store must not let whoever writes to it veto a model); trusted statements about this model that
fail step 5, or that have an unknown predicate type, are *refused* and veto. The verdict lists what was
satisfied, what is missing, what was refused and what was ignored and why; it is acceptable only when
nothing is missing and nothing was refused.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.gate_predicate import GatePredicate, check_gate_run, parse_gate_predicate
from modelsec.attestations.oms_predicate import OMS_PREDICATE_TYPE, parse_manifest
from modelsec.attestations.statement import (
    GATE_PREDICATE_TYPE,
    WATERMARK_PREDICATE_TYPE,
    Statement,
    is_sha256_hex,
    parse_statement,
)
from modelsec.attestations.watermark_predicate import (
    WatermarkPredicate,
    check_watermark_run,
    parse_watermark_predicate,
)
from modelsec.errors import AttestationError, Error, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.policy import Policy, RobustnessRequirement, WatermarkRequirement
from modelsec.signer.keys import TrustedKey
from modelsec.signer.signing import ATTESTATION_FILE_NAMES
from modelsec.verifier.bundles import read_bundle, verify_bundle_signature
from modelsec.verifier.stores import StoredBundle, StoreOptions, open_store
from modelsec.verifier.stores.directory import DirectoryStore

__all__ = [
    "GATE_PREDICATE_TYPE",
    "WATERMARK_PREDICATE_TYPE",
    "AdmittedAttestation",
    "AttestationVerdict",
    "Evidence",
    "InspectedBundle",
    "admit_to_store",
    "find_attestation_bundles",
    "inspect_bundle",
    "role_for_predicate",
    "store_bundle",
    "verify_attestations",
    "verify_statement_bundle",
]

_ROLE = {OMS_PREDICATE_TYPE: "weights", WATERMARK_PREDICATE_TYPE: "watermark", GATE_PREDICATE_TYPE: "gate"}
_KIND = {
    OMS_PREDICATE_TYPE: "signature",
    WATERMARK_PREDICATE_TYPE: "watermark",
    GATE_PREDICATE_TYPE: "robustness",
}


def verify_statement_bundle(
    bundle: Bundle, statement: Statement, keys: Sequence[TrustedKey], root_digest: str, *, what: str
) -> TrustedKey:
    """Steps 3-4 for one bundle of a known predicate type: the signing key and the subject.

    Args:
        bundle: The parsed bundle.
        statement: Its statement, parsed from `bundle.envelope.payload` (the bytes the signature covers).
        keys: Trusted keys; only those holding the role for the statement's predicate type are tried.
        root_digest: The model root digest (hex SHA-256) the statement must be about.
        what: Names the bundle in errors.

    Returns:
        The trusted key that verified.

    Raises:
        SignatureError: No key allowed the role verifies the signature.
        AttestationError: The predicate type is unknown, or no subject is `root_digest` (constant-time
            comparison).
    """
    role = _ROLE.get(statement.predicate_type)
    if role is None:
        raise AttestationError(f"{what}: unknown predicateType {statement.predicate_type!r}")
    key = verify_bundle_signature(bundle, keys, role=role)
    subjects = [s.digest.get("sha256", "") for s in statement.subjects]
    if not any(hmac.compare_digest(s.encode(), root_digest.encode()) for s in subjects):
        raise AttestationError(f"{what}: is about model {subjects[0] or '?'}, not {root_digest}")
    return key


def role_for_predicate(predicate_type: str) -> str | None:
    """The key role a statement of this predicate type must be signed with (None: an unknown type)."""
    return _ROLE.get(predicate_type)


@dataclass(frozen=True, slots=True)
class InspectedBundle:
    """A bundle read for display (`modelsec inspect`, `attest list`), and who signed it if keys were given.

    Attributes:
        source: Where it was read (a path, or a store's `<uri>#<id>`).
        bundle: The parsed bundle.
        statement: Its statement, parsed from the payload bytes.
        signer: The trusted key that verified it under the role for its predicate type; None when no keys
            were given (the contents are then claims, not verified).
    """

    source: str
    bundle: Bundle
    statement: Statement
    signer: TrustedKey | None


def inspect_bundle(
    item: Path | StoredBundle, keys: Sequence[TrustedKey], *, limits: Limits | None = None
) -> InspectedBundle:
    """Read a bundle for display; with `keys`, verify it exactly as the verifier would choose its key.

    With keys, the predicate type must be known (an unknown type is refused, as `verify_attestations`
    refuses it) and the signature must verify under a key holding the role for that type. The subject is
    not compared with any model and no predicate is checked against a policy (use `verify_attestations`).

    Args:
        item: A bundle file, or a bundle read from a store.
        keys: Trusted keys; empty to read without verifying.
        limits: Size limits (default `Limits()`).

    Returns:
        The parsed bundle, statement and verifying key (None without keys).

    Raises:
        MalformedArtifactError: The bundle or statement cannot be parsed, or is too large.
        SignatureError: No key holding the role verifies the signature (or the file is missing).
        AttestationError: With keys: the predicate type is not one modelsec knows.
    """
    limits = limits or Limits()
    if isinstance(item, Path):
        what, bundle = str(item), read_bundle(item, limits)
    else:
        if len(item.data) > limits.max_bundle_bytes:
            raise MalformedArtifactError(f"{item.source}: larger than {limits.max_bundle_bytes} bytes")
        what, bundle = item.source, parse_bundle(item.data, source=item.source)
    statement = parse_statement(bundle.envelope.payload, what=what)
    signer = None
    if keys:
        role = _ROLE.get(statement.predicate_type)
        if role is None:
            raise AttestationError(f"{what}: unknown predicateType {statement.predicate_type!r}")
        signer = verify_bundle_signature(bundle, keys, role=role)
    return InspectedBundle(what, bundle, statement, signer)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One accepted piece of evidence: its kind, where it came from, who signed it, and a summary."""

    kind: str
    source: str
    key: str
    detail: str
    keyid: str = ""
    algorithm: str = ""


@dataclass(frozen=True, slots=True)
class AttestationVerdict:
    """The structured result of `verify_attestations`.

    Attributes:
        root_digest: The model root digest the evidence had to be about.
        satisfied: Requirements met, in words (e.g. "robustness: pgd-linf eps 0.3 >= 0.03, robust 0.95").
        missing: Requirements nothing satisfied (e.g. "signature: sm2").
        refused: Trusted statements about this model that fail the policy (a FAILED gate, eps too small,
            stale, unknown predicate type), each with its source and reason; any refusal vetoes.
        evidence: The accepted evidence.
        ignored: Bundles that are not evidence for this model under this policy (unparseable, signed by
            no key trusted for their role, about another model), with the reason; they do not veto, but
            explain a requirement left missing.
        every_bundle_counts: The bundles were submitted as evidence (not read from a shared store): an
            ignored bundle vetoes too, and at least one must verify.
    """

    root_digest: str
    satisfied: tuple[str, ...]
    missing: tuple[str, ...]
    refused: tuple[str, ...]
    evidence: tuple[Evidence, ...] = field(default=())
    ignored: tuple[str, ...] = field(default=())
    every_bundle_counts: bool = False

    @property
    def ok(self) -> bool:
        """Whether the policy is met: nothing missing, nothing refused (nothing ignored, if every counts)."""
        return not self.missing and not self.refused and not (self.every_bundle_counts and self.ignored)

    def reasons(self) -> list[str]:
        """Why the verdict is negative (empty when `ok`); ignored bundles explain what is missing."""
        if self.ok:
            return []
        explained = [f"ignored {i}" for i in self.ignored] if self.missing or self.every_bundle_counts else []
        return [f"missing {m}" for m in self.missing] + [f"refused {r}" for r in self.refused] + explained

    def raise_for_policy(self) -> None:
        """Raise `AttestationError` naming every missing or refused piece unless the verdict is `ok`."""
        if not self.ok:
            raise AttestationError(f"model {self.root_digest}: " + "; ".join(self.reasons()))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form for `--json` output, the service and the webhook's audit log."""
        return {
            "ok": self.ok,
            "rootDigest": self.root_digest,
            "satisfied": list(self.satisfied),
            "missing": list(self.missing),
            "refused": list(self.refused),
            "ignored": list(self.ignored),
            "evidence": [
                {"kind": e.kind, "source": e.source, "key": e.key, "detail": e.detail} for e in self.evidence
            ],
        }


def find_attestation_bundles(
    model_dir: Path | None, root_digest: str, policy: Policy
) -> list[Path | StoredBundle]:
    """Bundles to consider: the reserved names in the model directory and the policy's store for the digest.

    The policy's store (`Policy.attestation_store`, opened with `modelsec.verifier.stores.open_store`)
    files bundles by digest, so they are found without reading any model file; a directory store that does
    not exist holds nothing. Nothing returned is trusted yet.

    Raises:
        PolicyError: The policy's store reference has an unknown scheme.
        BackendUnavailableError: The store cannot be reached or read.
        MalformedArtifactError: The store holds more bundles for the digest than it reads.
    """
    found: list[Path | StoredBundle] = []
    if model_dir is not None:
        found += [model_dir / n for n in ATTESTATION_FILE_NAMES if os.path.lexists(model_dir / n)]
    if policy.attestation_store is not None:
        store = open_store(policy.attestation_store, StoreOptions(limits=policy.limits, must_exist=False))
        try:
            found += store.entries(root_digest)
        finally:
            store.close()
    return found


def store_bundle(store: Path, data: bytes, *, limits: Limits | None = None) -> Path:
    """File a bundle in a directory store under its subject's root digest: `<store>/sha256/<digest>/<id>.sig`.

    `modelsec.verifier.stores.directory.DirectoryStore.put`, kept under its older name. Nothing is trusted
    here (a verifier checks the signature and the subject again when it reads the store).

    Raises:
        MalformedArtifactError: The bundle or its statement cannot be parsed, or has no sha256 subject.
        PolicyError: The store directory or the file cannot be written.
    """
    directory = DirectoryStore(store, max_bundle_bytes=(limits or Limits()).max_bundle_bytes)
    return Path(directory.put(data)[0].source)


def _name(item: Path | bytes | StoredBundle, index: int) -> str:
    if isinstance(item, StoredBundle):
        return item.source
    return str(item) if isinstance(item, Path) else f"bundle[{index}]"


def _load(item: Path | bytes | StoredBundle, policy: Policy, index: int) -> Bundle:
    if isinstance(item, Path):
        return read_bundle(item, policy.limits)
    what = _name(item, index)
    data = item.data if isinstance(item, StoredBundle) else item
    if len(data) > policy.limits.max_bundle_bytes:
        raise AttestationError(f"{what}: larger than {policy.limits.max_bundle_bytes} bytes")
    return parse_bundle(data, source=what)


def _check_gate(predicate: Mapping[str, Any], req: RobustnessRequirement, what: str, now: datetime) -> str:
    return _gate_meets(parse_gate_predicate(predicate, what=what), req, what, now)


def _gate_meets(pred: GatePredicate, req: RobustnessRequirement, what: str, now: datetime) -> str:
    if pred.attack != req.attack:
        raise AttestationError(f"{what}: gate attack {pred.attack!r} is not the policy's {req.attack!r}")
    if pred.eps < req.min_eps:
        raise AttestationError(f"{what}: gate eps {pred.eps} is below the policy's minEps {req.min_eps}")
    if pred.verdict != "PASSED":
        raise AttestationError(f"{what}: gate verdict is {pred.verdict!r}, not 'PASSED'")
    if pred.robust_total < req.min_samples:
        raise AttestationError(
            f"{what}: gate evaluated {pred.robust_total} samples, policy needs {req.min_samples}"
        )
    if req.rule == "strict":
        value, label = pred.robust_wilson95[0], "Wilson 95% lower bound"
    else:
        value, label = pred.robust_accuracy, "robust accuracy"
    if value < req.min_robust_accuracy:
        raise AttestationError(f"{what}: {label} {value:.4f} is below the policy's {req.min_robust_accuracy}")
    if pred.failed_checks:
        raise AttestationError(f"{what}: gate sanity checks failed: {pred.failed_checks}")
    if req.max_age_seconds is not None:
        if pred.finished_at is None:
            raise AttestationError(f"{what}: finishedAt is missing")
        age = (now - pred.finished_at).total_seconds()
        if age > req.max_age_seconds:
            raise AttestationError(
                f"{what}: gate result is stale ({age / 86400:.1f} days old; maxAge "
                f"{req.max_age_seconds / 86400:.1f} days)"
            )
        if age < -300:
            raise AttestationError(f"{what}: gate finishedAt lies in the future")
    run = check_gate_run(pred, req, what=what)  # steps, restarts, dataset, who ran it
    return (
        f"robustness: {pred.attack} eps {pred.eps} >= {req.min_eps}, "
        f"{label} {value:.4f} >= {req.min_robust_accuracy}" + (f", {run}" if run else "")
    )


def _check_watermark(predicate: Mapping[str, Any], req: WatermarkRequirement, what: str) -> str:
    return _watermark_meets(parse_watermark_predicate(predicate, what=what), req, what)


def _watermark_meets(pred: WatermarkPredicate, req: WatermarkRequirement, what: str) -> str:
    if not pred.detected:
        raise AttestationError(f"{what}: the watermark was not detected at embed time")
    confidence, fpp = pred.confidence, pred.false_positive_probability
    if confidence < req.min_confidence:
        raise AttestationError(f"{what}: watermark confidence {confidence:.4f} < policy {req.min_confidence}")
    if fpp > req.max_false_positive:
        raise AttestationError(
            f"{what}: watermark false-positive probability {fpp:.3g} > policy {req.max_false_positive:.3g}"
        )
    run = check_watermark_run(pred, require_server_run=req.require_server_run, what=what)
    return f"watermark: detected at embed time, confidence {confidence:.3f}, false-positive p {fpp:.2g}" + (
        f", {run}" if run else ""
    )


def verify_attestations(
    root_digest: str,
    bundles: Sequence[Path | bytes | StoredBundle],
    policy: Policy,
    *,
    require_signatures: bool = True,
    every_bundle_counts: bool = False,
    now: datetime | None = None,
) -> AttestationVerdict:
    """Check every bundle about a model against one policy (see the module docstring for the order).

    Args:
        root_digest: The model root digest (hex SHA-256) the evidence must be about.
        bundles: Bundle files, bundle bytes or bundles read from a store (weights signatures and
            attestations, in any order).
        policy: Keys with roles, required algorithms and attestation requirements.
        require_signatures: Also require weights signatures of every `policy.require_algorithms` (and at
            least one) among `bundles`; False when the caller verified the weights itself.
        every_bundle_counts: The caller submits `bundles` as evidence (the gRPC VerifyBundle, a store
            admitting one): any bundle that is not trusted evidence about the model makes the verdict
            negative, and at least one must verify. False for bundles read from a shared store, where a
            stranger's bundle is only ignored.
        now: The time freshness is measured against (default: now, UTC).

    Returns:
        The verdict; check `.ok` or call `.raise_for_policy()`.

    Raises:
        Nothing for untrusted bundles (they are listed in `refused`); `PolicyError` only for a bad policy.
    """
    now = now or datetime.now(UTC)
    satisfied: list[str] = []
    refused: list[str] = []
    evidence: list[Evidence] = []
    signed_algorithms: set[str] = set()
    gates = watermarks = 0
    ignored: list[str] = []
    for index, item in enumerate(bundles):
        what = _name(item, index)
        # Evidence that is not this model's under this policy (unparseable, signed by no key trusted for
        # its role, about another model) does not count, but does not veto either: a shared store may
        # hold other teams' bundles, and anyone who can write to it must not be able to deny a model.
        # Evidence a trusted key signed about this very model that fails a requirement is a refusal.
        try:
            bundle = _load(item, policy, index)
            statement = parse_statement(bundle.envelope.payload, what=what)
            claimed = statement.predicate_type
            role = _ROLE.get(claimed)
            if role is None:
                signer = verify_bundle_signature(bundle, policy.keys, role=None)
                refused.append(
                    f"{what}: unknown predicateType {claimed!r} signed by trusted key {signer.name!r}"
                )
                continue
            key = verify_statement_bundle(bundle, statement, policy.keys, root_digest, what=what)
        except Error as e:
            ignored.append(
                e.diagnostics() if e.diagnostics().startswith(what) else f"{what}: {e.diagnostics()}"
            )
            continue
        try:
            if claimed == OMS_PREDICATE_TYPE:
                parse_manifest(statement, what=what, limits=policy.limits)
                signed_algorithms.add(key.algorithm.value)
                detail = f"signature: {key.algorithm.value}"
            elif claimed == GATE_PREDICATE_TYPE:
                gates += 1
                if policy.robustness is None:
                    detail = "robustness: present (not required by the policy)"
                else:
                    detail = _check_gate(statement.predicate, policy.robustness, what, now)
            else:
                watermarks += 1
                if policy.watermark is None:
                    detail = "watermark: present (not required by the policy)"
                else:
                    detail = _check_watermark(statement.predicate, policy.watermark, what)
        except Error as e:  # a trusted statement about this model that fails the policy: fail closed
            refused.append(
                e.diagnostics() if e.diagnostics().startswith(what) else f"{what}: {e.diagnostics()}"
            )
            continue
        satisfied.append(f"{detail} ({key.name}, {what})")
        evidence.append(Evidence(_KIND[claimed], what, key.name, detail, key.keyid, key.algorithm.value))
    missing: list[str] = []
    if require_signatures:
        if not signed_algorithms:
            missing.append("signature: no weights signature by a trusted key")
        missing += [
            f"signature: {a.value}"
            for a in sorted(policy.require_algorithms)
            if a.value not in signed_algorithms
        ]
    if policy.robustness is not None and not gates:
        missing.append("robustness: no robustness-gate attestation")
    if policy.watermark is not None and not watermarks:
        missing.append("watermark: no watermark attestation")
    if every_bundle_counts and not evidence:
        missing.append("evidence: no bundle verified")
    return AttestationVerdict(
        root_digest,
        tuple(satisfied),
        tuple(missing),
        tuple(refused),
        tuple(evidence),
        tuple(ignored),
        every_bundle_counts,
    )


@dataclass(frozen=True, slots=True)
class AdmittedAttestation:
    """A bundle `admit_to_store` accepted: the parsed bundle and statement, and the evidence it is."""

    bundle: Bundle
    statement: Statement
    root_digest: str
    evidence: Evidence


def admit_to_store(data: bytes, policy: Policy, *, now: datetime | None = None) -> AdmittedAttestation:
    """Whether an attestation store may hold this bundle, under `policy`.

    The bundle must be about exactly one model (one subject with a sha256 root digest) and be trusted
    evidence about it (`verify_attestations` with `every_bundle_counts`). Admission is stricter than the
    policy: a gate or watermark statement must meet at least the baseline requirements (a PASSED gate, a
    detected watermark, a well-formed predicate) even where the policy requires none, so a store never holds
    evidence that would veto the model for a reader whose policy does require it.

    Raises:
        MalformedArtifactError: Malformed, too large, or not exactly one sha256 subject.
        AttestationError: Not trusted under `policy`, or refused by its (baseline) requirements.
    """
    bundle = _load(data, policy, 0)
    statement = parse_statement(bundle.envelope.payload, what="bundle")
    if len(statement.subjects) != 1:
        raise MalformedArtifactError(
            f"bundle: a stored attestation has exactly one subject, this one {len(statement.subjects)}"
        )
    digest = statement.subjects[0].digest.get("sha256", "")
    if not is_sha256_hex(digest):
        raise MalformedArtifactError("bundle: the subject has no sha256 model root digest (64 lowercase hex)")
    baseline = dataclasses.replace(
        policy,
        robustness=policy.robustness or RobustnessRequirement(),
        watermark=policy.watermark or WatermarkRequirement(),
    )
    verdict = verify_attestations(
        digest, [data], baseline, require_signatures=False, every_bundle_counts=True, now=now
    )
    if verdict.refused or verdict.ignored or not verdict.evidence:
        reasons = [f"refused {r}" for r in verdict.refused] + [f"not trusted: {i}" for i in verdict.ignored]
        raise AttestationError("; ".join(reasons) or "no evidence")
    return AdmittedAttestation(bundle, statement, digest, verdict.evidence[0])
