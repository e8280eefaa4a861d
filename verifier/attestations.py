"""Joint verification: one policy over weights signatures, watermark and robustness-gate attestations.

`verify_attestations(root_digest, bundles, policy)` needs no weights (the webhook and the service use it
with bundles from a store); `verify_model` and `load_model` call it with the bundles found next to the
model when the policy requires attestations. Order for each bundle, failing closed at every step:

1. strict bundle parsing (media type, exactly one DSSE signature, exact payloadType);
2. the predicate type (read from the payload only to choose the signing role) must be registered in
   `modelsec.attestations.predicates`: the OMS weights manifest (role `weights`),
   `https://modelsec.dev/watermark/v1` (role `watermark`) or `https://modelsec.dev/robustness-gate/v1`
   (role `gate`); anything else is refused by name;
3. the signature must verify under a policy key holding that role (keys never come from the bundle), or
   the bundle's certificate through a policy authority holding that role (`modelsec.verifier.trust.identity`);
4. the statement's subject (parsed once, from the payload bytes the signature covers) must be this model's
   root digest (an attestation replayed from another model does not count); the signature's time must lie in
   its key's validity window, by a trusted RFC 3161 timestamp where the policy names TSAs (and must, with
   `requireTimestamp`), as for weights signatures (`modelsec.verifier.trust.bundles.check_signature_time`);
5. the predicate must parse with every number in its field's range (the registered parser of its type,
   before any arithmetic);
6. a gate statement must apply to the policy: its attack, ε and sample count at least the policy's, and
   fresh (`finishedAt` within `maxAge`, not in the future); a watermark record must not be dated in the
   future and, where the policy names a `message`, its `messageCommitment` must be that message's
   commitment under the policy's `keyFile` (`modelsec.verifier._statement_checks`).

Steps 2-6 are one loop over the policy's requirements (`_Requirement`, DESIGN.md decision 19): a statement is
offered to every requirement that names its predicate type, the CEL conditions first
(`modelsec.verifier.conditions`), then the built-in requirement of a registered type. Each selects by
predicate type and signers (`modelsec.verifier.conditions.select_signer`: a condition names its signers;
the built-in weights, gate and watermark requirements are sugar over the same selection, taking every policy
signer that holds the type's role), then the subject and the time, and then applies its check: the CEL
condition, or the built-in one of step 6. A type that no requirement names is refused by name.

A bundle failing any of steps 1-6 is *ignored*, with the reason: it is not this model's evidence under this
policy, and it never vetoes (a shared store must not let whoever writes to it, nor an old result, deny a
model). Evidence is then *selected*, not voted: a weights signature counts for its algorithm; among the gate
statements left, the newest (`finishedAt`) decides: its verdict, robust accuracy under the policy's rule
(point or Wilson lower bound) and sanity checks must meet the policy, or it is *refused* and vetoes (a newer
FAILED beats an older PASSED; at the same time a failure wins); the older ones are ignored as superseded.
The same holds for watermark records (`embeddedAt`; the newest must show a detection meeting the policy).
The verdict lists what was satisfied, what is missing, what was refused and what was ignored and why; it
is acceptable only when nothing is missing and nothing was refused.
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.predicates import PREDICATE_KINDS, predicate_kind
from modelsec.attestations.predicates.gate import GATE_PREDICATE_TYPE, GatePredicate
from modelsec.attestations.predicates.watermark import WATERMARK_PREDICATE_TYPE, WatermarkPredicate
from modelsec.attestations.statement import Statement, is_sha256_hex, parse_statement
from modelsec.errors import AttestationError, Error, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.policy import Authority, Policy, RobustnessRequirement, TimestampAuthority, WatermarkRequirement
from modelsec.signer.keys import TrustedKey
from modelsec.signer.layout import find_attestation_files
from modelsec.verifier._statement_checks import (
    gate_applies,
    gate_outcome,
    watermark_applies,
    watermark_outcome,
)
from modelsec.verifier.conditions import (
    ConditionSelection,
    LinkCandidateError,
    Lookup,
    select_signer,
    store_lookup,
)
from modelsec.verifier.stores import StoredBundle, StoreOptions, evidence_stores, open_store
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.verifier.trust.bundles import check_signature_time, read_bundle, verify_bundle_signature

__all__ = [
    "GATE_PREDICATE_TYPE",
    "WATERMARK_PREDICATE_TYPE",
    "AdmittedAttestation",
    "AttestationVerdict",
    "Evidence",
    "StatementSelection",
    "VerifiedStatement",
    "admit_to_store",
    "find_attestation_bundles",
    "find_statement_files",
    "store_bundle",
    "verified_statements",
    "verify_attestations",
    "verify_statement_bundle",
]

_UNDATED = datetime.min.replace(tzinfo=UTC)


def verify_statement_bundle(
    bundle: Bundle,
    statement: Statement,
    keys: Sequence[TrustedKey],
    root_digest: str,
    *,
    what: str,
    authorities: Sequence[Authority] = (),
    timestamp_authorities: Sequence[TimestampAuthority] = (),
) -> TrustedKey:
    """Steps 3-4 for one bundle of a known predicate type: the signing key and the subject.

    Args:
        bundle: The parsed bundle.
        statement: Its statement, parsed from `bundle.envelope.payload` (the bytes the signature covers).
        keys: Trusted keys; only those holding the role for the statement's predicate type are tried.
        root_digest: The model root digest (hex SHA-256) the statement must be about.
        what: Names the bundle in errors.
        authorities: Certificate and Sigstore authorities; only those holding the role are tried, and only
            for a bundle that carries a certificate (`modelsec.verifier.trust.identity`).
        timestamp_authorities: TSAs whose timestamps in the bundle set the time an X.509 chain is checked at.

    Returns:
        The trusted key that verified (for a certificate: the leaf's key, named after its authority).

    Raises:
        SignatureError: No key or authority allowed the role verifies the signature.
        AttestationError: The predicate type is unknown, or no subject is `root_digest` (constant-time
            comparison).
        MalformedArtifactError: The bundle's certificates are malformed (only read with `authorities`).
        BackendUnavailableError: A Sigstore authority is configured without the `sigstore` package.
        PolicyError: A Sigstore authority's trusted root cannot be loaded.
    """
    role = predicate_kind(statement.predicate_type, what=what).role
    key = verify_bundle_signature(
        bundle, keys, role=role, authorities=authorities, timestamp_authorities=timestamp_authorities
    )
    _check_subject(statement, root_digest, what=what)
    return key


def _check_subject(statement: Statement, root_digest: str, *, what: str) -> None:
    """Step 4's subject check: some subject's SHA-256 is `root_digest` (constant-time comparison)."""
    subjects = [s.digest.get("sha256", "") for s in statement.subjects]
    if not any(hmac.compare_digest(s.encode(), root_digest.encode()) for s in subjects):
        raise AttestationError(f"{what}: is about model {subjects[0] or '?'}, not {root_digest}")


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
        refused: The deciding statement of a requirement when it fails it (the newest applicable gate is
            FAILED or below the accuracy threshold; the newest watermark record shows no detection), with
            its source and reason; any refusal vetoes.
        evidence: The accepted evidence.
        ignored: Bundles that are not evidence for this model under this policy (unparseable, signed by
            no key trusted for their role, about another model, of an unknown predicate type, stale, dated
            in the future, run with settings weaker than the policy's, or superseded by a newer statement),
            with the reason; they do not veto, but explain a requirement left missing.
        every_bundle_counts: The bundles were submitted as evidence (not read from a shared store): an
            ignored bundle (other than a superseded one) vetoes too, and at least one must verify.
        superseded: The entries of `ignored` that are trusted, applicable statements a newer one outranked.
    """

    root_digest: str
    satisfied: tuple[str, ...]
    missing: tuple[str, ...]
    refused: tuple[str, ...]
    evidence: tuple[Evidence, ...] = field(default=())
    ignored: tuple[str, ...] = field(default=())
    every_bundle_counts: bool = False
    superseded: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Whether the policy is met: nothing missing, nothing refused (nothing ignored, if every counts)."""
        return not self.missing and not self.refused and not (self.every_bundle_counts and self._vetoing())

    def _vetoing(self) -> list[str]:
        return [i for i in self.ignored if i not in self.superseded]

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
        """A JSON-ready form (camelCase) for `--json` output, the service and the webhook's audit log."""
        return {
            "ok": self.ok,
            "rootDigest": self.root_digest,
            "satisfied": list(self.satisfied),
            "missing": list(self.missing),
            "refused": list(self.refused),
            "ignored": list(self.ignored),
            "superseded": list(self.superseded),
            "evidence": [
                {"kind": e.kind, "source": e.source, "key": e.key, "detail": e.detail} for e in self.evidence
            ],
        }


def find_attestation_bundles(
    model_dir: Path | None, root_digest: str, policy: Policy, *, reference: str | None = None
) -> list[Path | StoredBundle]:
    """Bundles to consider: those beside the model (`find_statement_files`) and the model's stores.

    The stores are those `modelsec.verifier.stores.evidence_stores` resolves for `reference` under
    `policy` (every front door uses it): the policy's `attestationStore` and, for an `oci://` reference,
    the referrers of the artifact in its registry; a local directory (no reference) has only the policy's
    store. A store files bundles by digest, so they are found without reading any model file; a directory
    store that does not exist holds nothing. Nothing returned is trusted yet.

    Args:
        model_dir: The model directory whose reserved bundle names are read, or None.
        root_digest: The model root digest (64 hex).
        policy: The policy the model is checked under.
        reference: The model's URI (`oci://…`), when it has one besides its directory.

    Raises:
        PolicyError: The policy's store reference has an unknown scheme.
        BackendUnavailableError: The store cannot be reached or read.
        MalformedArtifactError: The store holds more bundles for the digest than it reads.
    """
    found: list[Path | StoredBundle] = []
    if model_dir is not None:
        # The reserved names and `model.attestations/`, where `attest sign`, `attest provenance` and
        # `release` write statements of other types (the policy's `conditions` judge them).
        found += find_statement_files(model_dir, limits=policy.limits)
    for spec in evidence_stores(reference or "", policy):
        store = open_store(spec, StoreOptions(limits=policy.limits, must_exist=False))
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
    if isinstance(item, StoredBundle) and item.note:
        raise AttestationError(f"{what}: {item.note}")
    data = item.data if isinstance(item, StoredBundle) else item
    if len(data) > policy.limits.max_bundle_bytes:
        raise AttestationError(f"{what}: larger than {policy.limits.max_bundle_bytes} bytes")
    return parse_bundle(data, source=what)


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A trusted, fresh, applicable statement about this model, competing to decide one requirement."""

    when: datetime | None
    what: str
    key: TrustedKey
    kind: str
    detail: str  # what it shows when it passes
    failure: str  # why it fails the requirement; empty when it passes


def _candidate(
    kind: str, when: datetime | None, what: str, key: TrustedKey, outcome: Callable[[], str]
) -> _Candidate:
    try:
        return _Candidate(when, what, key, kind, outcome(), "")
    except Error as e:
        return _Candidate(when, what, key, kind, "", _reason(e, what))


def _newest_first(candidates: list[_Candidate]) -> list[_Candidate]:
    # Newest first; an undated statement is older than every dated one; at the same time a failing statement
    # comes first, so a tie never lets a pass hide a failure.
    return sorted(candidates, key=lambda c: (c.when or _UNDATED, bool(c.failure)), reverse=True)


def _reason(e: Error, what: str) -> str:
    text = e.diagnostics()
    return text if text.startswith(what) else f"{what}: {text}"


class _Requirement(Protocol):
    """A policy requirement as `_Selection.read` applies it: the statements it selects, then its check.

    Every requirement selects a statement by its predicate type and its signers (`select_signer`), the
    subject and the signature's time; then checks it. A CEL condition requirement names its signers and
    checks its condition; the built-in weights, gate and watermark requirements are sugar over the same
    selection (any policy signer holding the type's role) with a fixed check.
    """

    def names(self, predicate_type: str) -> bool:
        """Whether it selects statements of `predicate_type`."""
        ...

    def offer(self, selection: _Selection, bundle: Bundle, statement: Statement, what: str) -> None:
        """Select and check one statement: accept it or keep it as a candidate; `Error`: it is ignored."""
        ...

    def decide(self, selection: _Selection) -> list[str]:
        """Once every bundle is read: record the verdict in `selection`, and return what is missing."""
        ...


class _Conditions:
    """The policy's CEL condition requirements (`modelsec.verifier.conditions`), each offered a statement."""

    def __init__(self, conditions: ConditionSelection) -> None:
        self.conditions = conditions

    def names(self, predicate_type: str) -> bool:
        return self.conditions.names(predicate_type)

    def offer(self, selection: _Selection, bundle: Bundle, statement: Statement, what: str) -> None:
        # A statement that satisfies no condition is ignored here; a registered type's built-in requirement
        # still judges it. One of an unregistered type about another model may still be a lineage link.
        try:
            for kind, key, detail in self.conditions.offer(bundle, statement, what):
                selection.accept(kind, what, key, detail, listed=False)
        except LinkCandidateError as e:
            if statement.predicate_type in PREDICATE_KINDS:
                selection.ignored.append(_reason(e, what))
            else:
                selection.link_candidates[what] = _reason(e, what)
        except Error as e:
            selection.ignored.append(_reason(e, what))

    def decide(self, selection: _Selection) -> list[str]:
        met, missing = self.conditions.decide()
        for _kind, key, what, detail in met:
            selection.satisfied.append(f"{detail} ({key.name}, {what})")
        # A statement about an ancestor is evidence when a satisfied lineage chain went through it (so a
        # caller that sends the model's lineage with it is not vetoed by it), and ignored otherwise.
        for link in {link.what: link for link in self.conditions.used}.values():
            selection.link_candidates.pop(link.what, None)
            selection.accept("lineage", link.what, link.key, link.detail, listed=False)
        selection.ignored += selection.link_candidates.values()
        return missing


class _Weights:
    """Weights signatures (the OMS manifest): each one selected counts for its key's algorithm."""

    def __init__(self, required: Sequence[str] | None) -> None:
        self.required = required  # algorithms; None: the caller verified the weights itself

    def names(self, predicate_type: str) -> bool:
        kind = PREDICATE_KINDS.get(predicate_type)
        return kind is not None and kind.role == "weights" and kind.about == "model"

    def offer(self, selection: _Selection, bundle: Bundle, statement: Statement, what: str) -> None:
        key = selection.select(bundle, statement, what)
        PREDICATE_KINDS[statement.predicate_type].parse(statement, what=what, limits=selection.policy.limits)
        selection.signed_algorithms.add(key.algorithm.value)
        selection.accept("signature", what, key, f"signature: {key.algorithm.value}")

    def decide(self, selection: _Selection) -> list[str]:
        if self.required is None:
            return []
        missing = [] if selection.signed_algorithms else ["signature: no weights signature by a trusted key"]
        return missing + [f"signature: {a}" for a in self.required if a not in selection.signed_algorithms]


_P = TypeVar("_P")
_R = TypeVar("_R")


class _Newest(Generic[_P, _R]):
    """A built-in gate or watermark requirement: the newest applicable statement decides (`_Candidate`).

    It selects statements of its predicate type as every requirement does, by any policy signer holding the
    type's role (`_Selection.select`); its check is the built-in one (`modelsec.verifier._statement_checks`)
    in place of a CEL condition: a statement that does not apply to the policy is ignored, and among those
    left the newest decides. A policy without the requirement accepts the statement as present.
    """

    def __init__(
        self,
        predicate_type: str,
        label: str,
        requirement: _R | None,
        check: tuple[
            Callable[[_P, _R, str, datetime], None],
            Callable[[_P, _R, str], str],
            Callable[[_P], datetime | None],
        ],
        absent: str,
    ) -> None:
        self.predicate_type, self.label, self.requirement = predicate_type, label, requirement
        self.absent = absent
        self.applies, self.outcome, self.when = check
        self.candidates: list[_Candidate] = []

    def names(self, predicate_type: str) -> bool:
        return predicate_type == self.predicate_type

    def offer(self, selection: _Selection, bundle: Bundle, statement: Statement, what: str) -> None:
        key = selection.select(bundle, statement, what)
        if self.requirement is None:
            selection.accept(self.label, what, key, f"{self.label}: present (not required by the policy)")
            return
        kind = PREDICATE_KINDS[self.predicate_type]
        predicate: _P = kind.parse(statement, what=what, limits=selection.policy.limits)
        self.applies(predicate, self.requirement, what, selection.now)
        outcome = functools.partial(self.outcome, predicate, self.requirement, what)
        self.candidates.append(_candidate(self.label, self.when(predicate), what, key, outcome))

    def decide(self, selection: _Selection) -> list[str]:
        """The newest candidate decides; the older ones are listed as superseded."""
        if not self.candidates:
            return [self.absent] if self.requirement is not None else []
        newest, *older = _newest_first(self.candidates)
        if newest.failure:
            selection.refused.append(newest.failure)
        else:
            selection.accept(newest.kind, newest.what, newest.key, newest.detail)
        for c in older:
            line = f"{c.what}: superseded by the newer {newest.what}"
            selection.ignored.append(line)
            selection.superseded.append(line)
        return []


class _Selection:
    """What `verify_attestations` collects while it reads the bundles (one instance per call)."""

    def __init__(
        self, policy: Policy, root_digest: str, now: datetime, lookup: Lookup, *, require_signatures: bool
    ) -> None:
        self.policy, self.root_digest, self.now = policy, root_digest, now
        self.satisfied: list[str] = []
        self.refused: list[str] = []
        self.ignored: list[str] = []
        self.superseded: list[str] = []
        self.evidence: list[Evidence] = []
        self.signed_algorithms: set[str] = set()
        self.link_candidates: dict[str, str] = {}  # bundle -> why it is no evidence unless a chain uses it
        self.conditions = _Conditions(ConditionSelection(policy, root_digest, now, lookup))
        self.weights = _Weights(
            [a.value for a in sorted(policy.require_algorithms)] if require_signatures else None
        )
        self.gate: _Newest[GatePredicate, RobustnessRequirement] = _Newest(
            GATE_PREDICATE_TYPE,
            "robustness",
            policy.robustness,
            (gate_applies, gate_outcome, lambda g: g.finished_at),
            "robustness: no robustness-gate attestation",
        )
        self.watermark: _Newest[WatermarkPredicate, WatermarkRequirement] = _Newest(
            WATERMARK_PREDICATE_TYPE,
            "watermark",
            policy.watermark,
            (watermark_applies, watermark_outcome, lambda w: w.embedded_at),
            "watermark: no watermark attestation",
        )
        # Each statement is offered to every requirement naming its type, in this order: the conditions
        # first, then the built-in requirement of a registered type (both judge a gate or watermark).
        self.requirements: tuple[_Requirement, ...] = (
            self.conditions,
            self.weights,
            self.gate,
            self.watermark,
        )

    def accept(self, kind: str, what: str, key: TrustedKey, detail: str, *, listed: bool = True) -> None:
        if listed:
            self.satisfied.append(f"{detail} ({key.name}, {what})")
        self.evidence.append(Evidence(kind, what, key.name, detail, key.keyid, key.algorithm.value))

    def read(self, item: Path | bytes | StoredBundle, index: int) -> None:
        """Steps 1-6 for one bundle: it is ignored, accepted, or becomes a candidate for its requirement."""
        what = _name(item, index)
        try:
            bundle = _load(item, self.policy, index)
            statement = parse_statement(bundle.envelope.payload, what=what)
            named = [r for r in self.requirements if r.names(statement.predicate_type)]
            for requirement in named:
                requirement.offer(self, bundle, statement, what)
            if not named:
                self._unclaimed(bundle, statement, what)
        except Error as e:
            self.ignored.append(_reason(e, what))

    def select(self, bundle: Bundle, statement: Statement, what: str) -> TrustedKey:
        """Steps 3-4 for a built-in requirement: any trusted signer with its role, this model, in time."""
        key = select_signer(self.policy, frozenset(), bundle, statement)
        _check_subject(statement, self.root_digest, what=what)
        check_signature_time(bundle, key, self.policy, now=self.now)
        return key

    def _unclaimed(self, bundle: Bundle, statement: Statement, what: str) -> None:
        """A statement no requirement names: always raises, naming who signed it or what it is about."""
        claimed = statement.predicate_type
        kind = PREDICATE_KINDS.get(claimed)
        if kind is not None:
            self.select(bundle, statement, what)
            raise AttestationError(f"{what}: a statement about an {kind.about}, evidence for no requirement")
        signer = select_signer(self.policy, frozenset(), bundle, statement)
        raise AttestationError(
            f"{what}: unknown predicateType {claimed!r} (signed by trusted key {signer.name!r}): "
            "evidence for no requirement"
        )

    def decide(self, every_bundle_counts: bool) -> list[str]:
        """Every requirement's verdict; what is missing, in the order of `requirements`."""
        # The newest-first decisions settle before the conditions, so their lines come first.
        missing = {id(r): r.decide(self) for r in (self.gate, self.watermark, self.conditions, self.weights)}
        out = [m for r in self.requirements for m in missing[id(r)]]
        if every_bundle_counts and not self.evidence:
            out.append("evidence: no bundle verified")
        return out


def verify_attestations(
    root_digest: str,
    bundles: Sequence[Path | bytes | StoredBundle],
    policy: Policy,
    *,
    require_signatures: bool = True,
    every_bundle_counts: bool = False,
    now: datetime | None = None,
    lookup: Lookup | None = None,
) -> AttestationVerdict:
    """Select, for each requirement of `policy`, the evidence about a model (see the module docstring).

    Args:
        root_digest: The model root digest (hex SHA-256) the evidence must be about.
        bundles: Bundle files, bundle bytes or bundles read from a store (weights signatures and
            attestations, in any order).
        policy: Keys with roles, required algorithms and attestation requirements.
        require_signatures: Also require weights signatures of every `policy.require_algorithms` (and at
            least one) among `bundles`; False when the caller verified the weights itself.
        every_bundle_counts: The caller submits `bundles` as evidence (the gRPC VerifyBundle, a store
            admitting one): any bundle that is not trusted evidence about the model (other than one
            superseded by a newer statement, or a signed provenance statement about an ancestor that a
            satisfied lineage chain goes through) makes the verdict negative, and at least one must verify.
            False for bundles read from a shared store, where a stranger's bundle is only ignored.
        now: The time freshness is measured against (default: now, UTC).
        lookup: Where lineage links (provenance about base models) are read besides `bundles`: bundle bytes
            by root digest (default: the policy's attestation stores, `modelsec.verifier.conditions`).

    Returns:
        The verdict; check `.ok` or call `.raise_for_policy()`.

    Raises:
        Nothing for untrusted, stale or failing bundles (they are listed in `ignored` or `refused`);
        `PolicyError` only for a bad policy.
    """
    selection = _Selection(
        policy,
        root_digest,
        now or datetime.now(UTC),
        lookup or store_lookup(policy),
        require_signatures=require_signatures,
    )
    for index, item in enumerate(bundles):
        selection.read(item, index)
    missing = selection.decide(every_bundle_counts)
    return AttestationVerdict(
        root_digest,
        tuple(selection.satisfied),
        tuple(missing),
        tuple(selection.refused),
        tuple(selection.evidence),
        tuple(selection.ignored),
        every_bundle_counts,
        tuple(selection.superseded),
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


@dataclass(frozen=True, slots=True)
class VerifiedStatement:
    """A statement of the asked predicate type, signed by a trusted signer, about the model.

    Attributes:
        statement: The statement, parsed from the exact payload bytes the signature covers
            (`statement.predicate` is the predicate JSON object, read-only).
        signer: The trusted key that verified the signature: a pinned policy key (`signer.name`,
            `signer.keyid`), or the leaf key of a certificate an authority vouched for (`signer.name` is
            `"<authority>: <identity>"`).
        source: Where the bundle came from (a path, a store entry, `bundle[i]`).
        signed_at: The trusted RFC 3161 times of the signature (empty without a TSA the policy trusts).
    """

    statement: Statement
    signer: TrustedKey
    source: str
    signed_at: tuple[datetime, ...] = ()


@dataclass(frozen=True, slots=True)
class StatementSelection:
    """What `verified_statements` found: the trusted statements of the type, and why others did not count.

    Attributes:
        statements: Verified statements of the predicate type about the model, in the order of the input.
        ignored: `"<source>: <reason>"` for each bundle of the type that did not verify (wrong signer,
            another model, outside its key's validity window, malformed); bundles of other types are not
            listed. As in `verify_attestations`, an ignored bundle never vetoes.
    """

    statements: tuple[VerifiedStatement, ...]
    ignored: tuple[str, ...]


def verified_statements(
    root_digest: str,
    bundles: Sequence[Path | bytes | StoredBundle],
    policy: Policy,
    predicate_type: str,
    *,
    keys: Sequence[TrustedKey] | None = None,
    authorities: Sequence[Authority] | None = None,
    role: str | None = None,
    now: datetime | None = None,
) -> StatementSelection:
    """The statements of `predicate_type` about the model `root_digest` that a trusted signer signed.

    The evidence a requirement selects by predicate type (a CEL condition over SLSA provenance, a user's
    own predicate, a lineage link): any type, registered in `modelsec.attestations.predicates` or not. For
    each bundle, failing closed at every step (the module docstring's steps, with the signers given here):

    1. strict bundle parsing, at most `policy.limits.max_bundle_bytes`;
    2. the statement's `predicateType` must equal `predicate_type` exactly (other bundles are skipped
       without being listed: they are evidence for other requirements);
    3. the DSSE signature must verify under one of `keys` (holding `role`, when given), or the bundle's
       certificate chain through one of `authorities` (holding `role`); keys never come from the bundle;
    4. a subject's SHA-256 must be `root_digest`, and the signature's time must lie in its key's validity
       window (`check_signature_time`: the policy's TSAs and `requireTimestamp` apply);
    5. for a registered type, its parser and number checker accept the predicate. A foreign predicate's
       content is not interpreted: that is the caller's condition.

    What is not done: selecting among several statements (newest, all, any: the requirement's rule) and
    judging the predicate's content.

    Args:
        root_digest: The model root digest (64 lowercase hex) the statements must be about.
        bundles: Bundle files, bytes or store entries (`find_attestation_bundles`, `find_statement_files`).
        policy: Supplies the limits, the TSAs and key validity windows, and the default signers.
        predicate_type: The exact predicateType URI to select.
        keys: The signers a requirement trusts for this type (default: every key of `policy`).
        authorities: Certificate and Sigstore authorities trusted for this type (default: the policy's).
        role: The role each key or authority must hold (`weights`, `watermark`, `gate`), or None: any of
            the given signers (a requirement that names its signers passes exactly those).
        now: The time validity windows are checked at (default: now, UTC).

    Returns:
        The verified statements, each with its signer, and the bundles of the type that were ignored.

    Raises:
        Nothing for an untrusted or malformed bundle (it is listed in `ignored`); `PolicyError` only for a
        Sigstore authority whose trusted root cannot be loaded, and `BackendUnavailableError` when an
        authority needs a package that is missing.
    """
    from modelsec.attestations.predicates import check_predicate_numbers
    from modelsec.errors import BackendUnavailableError, PolicyError

    keys = policy.keys if keys is None else keys
    authorities = policy.authorities if authorities is None else authorities
    moment = now or datetime.now(UTC)
    found: list[VerifiedStatement] = []
    ignored: list[str] = []
    for index, item in enumerate(bundles):
        what = _name(item, index)
        try:
            bundle = _load(item, policy, index)
            statement = parse_statement(bundle.envelope.payload, what=what)
        except Error as e:
            ignored.append(_reason(e, what))  # unreadable: its type is unknown, so it is listed
            continue
        if statement.predicate_type != predicate_type:
            continue
        try:
            key = verify_bundle_signature(
                bundle,
                keys,
                role=role,
                authorities=authorities,
                timestamp_authorities=policy.timestamp_authorities,
            )
            _check_subject(statement, root_digest, what=what)
            times = check_signature_time(bundle, key, policy, now=moment)
            kind = PREDICATE_KINDS.get(predicate_type)
            if kind is not None:
                check_predicate_numbers(statement, what=what)
                kind.parse(statement, what=what, limits=policy.limits)
        except (PolicyError, BackendUnavailableError):
            raise
        except Error as e:
            ignored.append(_reason(e, what))
            continue
        found.append(VerifiedStatement(statement, key, what, tuple(times)))
    return StatementSelection(tuple(found), tuple(ignored))


def find_statement_files(model_dir: Path, *, limits: Limits | None = None) -> list[Path]:
    """The statement bundles beside a model: the reserved attestation names and `model.attestations/*`.

    `attest sign` and `attest provenance` write into the reserved folder `model.attestations/`
    (`modelsec.signer.layout.STATEMENTS_DIR_NAME`, `<type slug>.sig`), which every walk leaves out. Found by
    name and media type only (`find_bundle_files`: a regular file, not a link, at most the bundle limit):
    nothing is read as trusted; pass them to `verified_statements`. A folder that is a link is not read.

    Returns:
        The paths: the reserved attestation names present, then the folder's bundles by name.
    """
    import os

    from modelsec.signer.layout import STATEMENTS_DIR_NAME, find_bundle_files

    found: list[Path] = list(find_attestation_files(model_dir))
    folder = model_dir / STATEMENTS_DIR_NAME
    if folder.is_symlink() or not folder.is_dir():
        return found
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_file(follow_symlinks=False))
    except OSError:
        return found
    return found + [folder / n for n in find_bundle_files(folder, names, limits)]
