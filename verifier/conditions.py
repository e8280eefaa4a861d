"""Condition requirements, and base-model lineage through signed SLSA provenance (DESIGN.md decision 19).

A condition requirement wants a statement of any predicate type, signed as the policy says, whose CEL
condition holds.

Called by `modelsec.verifier.attestations.verify_attestations` (the one evaluation every front door uses) for
each bundle whose predicateType a `policy.conditions` requirement names, then once to decide. For one bundle
and one requirement, in order, failing closed:

1. the signature verifies under a policy key or authority named in the requirement's `signers` (all of
   them when empty) that holds the predicate type's role when modelsec registers the type (gate, watermark,
   weights), and its time lies in the key's window (`check_signature_time`);
2. a subject is the model root digest (constant-time); a statement about another digest is kept, unverified,
   only as a candidate lineage link;
3. the CEL condition (`modelsec.policy.cel`) is true within its step and time budget; a false, failing or
   stopped condition makes the statement no evidence (listed as ignored, with the reason).

A requirement is satisfied by one statement passing 1-3 (evidence is selected, not voted) and, with `lineage`,
from which a chain of provenance leads to an approved root: each base model a statement names (see
`base_models`) is either a root in `lineage.from`, or the subject of another provenance statement of the same
predicate type that passes step 1 under the same signers (its condition is not applied: it describes another
build) and continues the chain, at most `maxDepth` links in all. Link statements are looked up among the
bundles given (any subject) and through `lookup` (by default the policy's attestation stores,
`evidence_stores`; the webhook adds its own `--store`). A cycle, a missing link, an unsigned or untrusted link
or a chain longer than `maxDepth` leaves the requirement missing, with the reason naming the link. A bundle
given about another model is evidence (a lineage link) when a satisfied chain goes through it, and ignored
otherwise, so a caller that submits a model's lineage with it (the gRPC VerifyBundle) is not vetoed by it.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.predicates import PREDICATE_KINDS
from modelsec.attestations.statement import Statement, is_sha256_hex, parse_statement
from modelsec.errors import AttestationError, Error
from modelsec.policy import Policy
from modelsec.policy.cel import ConditionInput
from modelsec.policy.requirements import ConditionRequirement
from modelsec.signer.keys import TrustedKey
from modelsec.verifier.trust.bundles import check_signature_time, verify_bundle_signature

__all__ = [
    "BASE_MODEL_NAMES",
    "ConditionSelection",
    "LinkCandidateError",
    "UsedLink",
    "base_models",
    "select_signer",
]

BASE_MODEL_NAMES = frozenset({"base-model", "base_model", "baseModel", "base"})
"""`resolvedDependencies[].name` values that mark an entry as the base model (with a `digest.sha256`)."""

Lookup = Callable[[str], Sequence[bytes]]


def base_models(statement: Statement) -> list[str]:
    """The base-model root digests a SLSA v1 provenance statement names (hex SHA-256).

    An entry of `predicate.buildDefinition.resolvedDependencies` names a base model when it has a
    `digest.sha256` of 64 lowercase hex and either its `name` is one of `BASE_MODEL_NAMES`, or its `uri`
    starts with `model:` / `oci://` and an `annotations` value is `base-model`. Other entries (code,
    datasets) are not followed. Nothing here is trusted: the caller verified the statement.
    """
    definition = statement.predicate.get("buildDefinition")
    deps = definition.get("resolvedDependencies") if isinstance(definition, Mapping) else None
    found: list[str] = []
    for dep in deps if isinstance(deps, Sequence) and not isinstance(deps, str) else ():
        if not isinstance(dep, Mapping):
            continue
        digest = dep.get("digest")
        sha = digest.get("sha256") if isinstance(digest, Mapping) else None
        if not is_sha256_hex(sha):
            continue
        notes = dep.get("annotations")
        marked = isinstance(notes, Mapping) and "base-model" in [
            v for v in notes.values() if isinstance(v, str)
        ]
        if dep.get("name") in BASE_MODEL_NAMES or marked:
            found.append(sha)
    return found


def select_signer(
    policy: Policy, signers: frozenset[str], bundle: Bundle, statement: Statement
) -> TrustedKey:
    """The signer a requirement selects a statement by: one of `signers`, holding the type's role.

    Every requirement selects its statements this way (a condition names its `signers`; the built-in gate,
    watermark and weights requirements name none): the DSSE signature must verify under a policy key, or the
    bundle's certificate through a policy authority, whose name is in `signers` (all of them when empty)
    and that holds the predicate type's role when modelsec registers the type (any role otherwise). Keys
    never come from the bundle. The subject and the signature's time are the caller's next steps.

    Raises:
        SignatureError: No such key or authority verifies the signature.
        MalformedArtifactError: The bundle's certificates are malformed.
        BackendUnavailableError: A Sigstore authority is configured without the `sigstore` package.
        PolicyError: A Sigstore authority's trusted root cannot be loaded.
    """
    kind = PREDICATE_KINDS.get(statement.predicate_type)
    keys = [k for k in policy.keys if not signers or k.name in signers]
    authorities = [a for a in policy.authorities if not signers or a.name in signers]
    return verify_bundle_signature(
        bundle,
        keys,
        role=kind.role if kind is not None else None,
        authorities=authorities,
        timestamp_authorities=policy.timestamp_authorities,
    )


@dataclass(frozen=True, slots=True)
class _Passed:
    what: str
    key: TrustedKey
    statement: Statement


class LinkCandidateError(AttestationError):
    """A statement about another model, kept as a candidate lineage link: ignored unless a chain uses it."""


@dataclass(frozen=True, slots=True)
class UsedLink:
    """A provenance statement about an ancestor that a satisfied lineage chain went through.

    Attributes:
        what: Where it came from (a bundle given to `verify_attestations`, or a store entry).
        key: The trusted key that signed it (step 1 under the requirement's signers).
        detail: `condition NAME: lineage link sha256:DIGEST`.
    """

    what: str
    key: TrustedKey
    detail: str


def _about(statement: Statement, digest: str) -> bool:
    return any(
        hmac.compare_digest(s.digest.get("sha256", "").encode(), digest.encode()) for s in statement.subjects
    )


class ConditionSelection:
    """What the condition requirements collect during one `verify_attestations` call."""

    def __init__(self, policy: Policy, root_digest: str, now: datetime, lookup: Lookup) -> None:
        self.policy, self.root_digest, self.now, self.lookup = policy, root_digest, now, lookup
        self.passed: dict[str, list[_Passed]] = {r.name: [] for r in policy.conditions}
        self.failed: dict[str, list[str]] = {r.name: [] for r in policy.conditions}
        self.pool: dict[str, list[tuple[str, Bundle, Statement]]] = {}
        self.used: list[UsedLink] = []

    def names(self, predicate_type: str) -> bool:
        """Whether any condition requirement names `predicate_type`."""
        return any(r.predicate_type == predicate_type for r in self.policy.conditions)

    def _signer(self, req: ConditionRequirement, bundle: Bundle, statement: Statement) -> TrustedKey:
        """Step 1: the key (or certificate) that signed, among the requirement's signers, in its window."""
        key = select_signer(self.policy, req.signers, bundle, statement)
        check_signature_time(bundle, key, self.policy, now=self.now)
        return key

    def offer(self, bundle: Bundle, statement: Statement, what: str) -> list[tuple[str, TrustedKey, str]]:
        """Steps 1-3 for one bundle, for every requirement naming its predicate type.

        Returns:
            (kind, key, detail) for each requirement it satisfies (lineage is decided in `decide`).

        Raises:
            LinkCandidateError: It satisfies none and is about another model, so it is kept as a candidate
                lineage link (`decide` lists it in `used` when a satisfied chain goes through it).
            AttestationError: It satisfies none: untrusted, about another model, or a condition is false,
                fails or was stopped; the reasons of every requirement, joined.
            SignatureError: Step 1 failed for every requirement.
        """
        accepted: list[tuple[str, TrustedKey, str]] = []
        reasons: list[str] = []
        pooled = False
        # Converted to CEL values once, and each signature checked once per set of signers, however many
        # requirements name the predicate type.
        prepared: ConditionInput | None = None
        signed_by: dict[frozenset[str], TrustedKey | Error] = {}
        for req in self.policy.conditions:
            if req.predicate_type != statement.predicate_type:
                continue
            try:
                if not _about(statement, self.root_digest):
                    if req.lineage is not None and not pooled:
                        pooled = True
                        for s in statement.subjects:
                            digest = s.digest.get("sha256", "")
                            self.pool.setdefault(digest, []).append((what, bundle, statement))
                    subjects = [s.digest.get("sha256", "?") for s in statement.subjects]
                    raise AttestationError(f"is about model {subjects[0]}, not {self.root_digest}")
                if req.signers not in signed_by:
                    try:
                        signed_by[req.signers] = self._signer(req, bundle, statement)
                    except Error as e:
                        signed_by[req.signers] = e
                signer = signed_by[req.signers]
                if isinstance(signer, Error):
                    raise signer
                key = signer
                if req.condition is not None:
                    prepared = prepared or ConditionInput(statement.to_json_object(), bundle.envelope.payload)
                    if not req.condition.evaluate(prepared):
                        raise AttestationError(f"condition {req.name}: is false ({req.condition.source!r})")
            except Error as e:
                text = e.diagnostics()
                reasons.append(text if text.startswith("condition ") else f"condition {req.name}: {text}")
                self.failed[req.name].append(f"{what}: {reasons[-1]}")
                continue
            self.passed[req.name].append(_Passed(what, key, statement))
            accepted.append(("condition", key, f"condition {req.name}: {req.predicate_type}"))
        if not accepted:
            error = LinkCandidateError if pooled else AttestationError
            raise error(f"{what}: " + "; ".join(reasons))
        return accepted

    def decide(self) -> tuple[list[tuple[str, TrustedKey, str, str]], list[str]]:
        """Per requirement: satisfied (kind, key, what, detail) or missing (the reason, naming the link).

        The links of each satisfied chain are added to `used`.
        """
        satisfied: list[tuple[str, TrustedKey, str, str]] = []
        missing: list[str] = []
        for req in self.policy.conditions:
            passed = self.passed[req.name]
            if not passed:
                why = "".join(f"; {f}" for f in self.failed[req.name])
                missing.append(
                    f"condition {req.name}: no signed {req.predicate_type} statement satisfies it{why}"
                )
                continue
            if req.lineage is None:
                first = passed[0]
                satisfied.append(("condition", first.key, first.what, f"condition {req.name}"))
                continue
            failures: list[str] = []
            for p in passed:
                links: list[UsedLink] = []
                chain = self._walk(req, p.statement, self.root_digest, [self.root_digest], failures, links)
                if chain is not None:
                    path = " <- ".join(f"sha256:{d}" for d in chain)
                    satisfied.append(("lineage", p.key, p.what, f"condition {req.name}: lineage {path}"))
                    self.used += links
                    break
            else:
                missing.append(f"condition {req.name}: lineage: " + "; ".join(dict.fromkeys(failures)))
        return satisfied, missing

    def _links(
        self, req: ConditionRequirement, digest: str
    ) -> tuple[list[tuple[str, TrustedKey, Statement]], list[str]]:
        """Signed provenance statements about `digest` (step 1 under `req`), and why the others are not."""
        candidates = list(self.pool.get(digest, ()))
        why: list[str] = []
        for i, data in enumerate(self.lookup(digest)):
            what = f"store entry {i} for sha256:{digest}"
            try:
                bundle = parse_bundle(data, source=what)
                candidates.append((what, bundle, parse_statement(bundle.envelope.payload, what=what)))
            except Error as e:
                why.append(f"{what}: {e.diagnostics()}")
        good: list[tuple[str, TrustedKey, Statement]] = []
        for what, bundle, statement in candidates:
            if statement.predicate_type != req.predicate_type or not _about(statement, digest):
                continue
            try:
                key = self._signer(req, bundle, statement)
            except Error as e:
                why.append(f"{what}: {e.diagnostics()}")
                continue
            good.append((what, key, statement))
        return good, why

    def _walk(
        self,
        req: ConditionRequirement,
        statement: Statement,
        digest: str,
        chain: list[str],
        failures: list[str],
        links: list[UsedLink],
    ) -> list[str] | None:
        """The chain from the model to an approved root through `statement` (about `digest`), or None.

        On success `links` holds the ancestor statements the chain went through, nearest first.
        """
        if req.lineage is None:  # only called for lineage requirements
            return None
        link = len(chain)
        bases = base_models(statement)
        if not bases:
            failures.append(f"link {link} (sha256:{digest}): its provenance names no base model")
            return None
        for base in bases:
            if base in req.lineage.roots:
                return [*chain, base]
            if base in chain:
                failures.append(f"link {link} (sha256:{digest}): cycle back to sha256:{base}")
                continue
            if link >= req.lineage.max_depth:
                failures.append(
                    f"link {link} (sha256:{digest}): base model sha256:{base} is not an approved root and "
                    f"maxDepth {req.lineage.max_depth} is reached"
                )
                continue
            parents, why = self._links(req, base)
            if not parents:
                detail = f" ({'; '.join(why)})" if why else ""
                failures.append(
                    f"link {link + 1} (sha256:{base}): no provenance signed by a trusted signer{detail}"
                )
                continue
            for what, key, parent in parents:
                found = self._walk(req, parent, base, [*chain, base], failures, links)
                if found is not None:
                    links.insert(0, UsedLink(what, key, f"condition {req.name}: lineage link sha256:{base}"))
                    return found
        return None


def store_lookup(policy: Policy) -> Lookup:
    """Bundle bytes about a digest from the policy's attestation stores (`evidence_stores`, no reference)."""
    from modelsec.verifier.stores import StoreOptions, evidence_stores, open_store

    def lookup(digest: str) -> list[bytes]:
        found: list[bytes] = []
        for spec in evidence_stores("", policy):
            store = open_store(spec, StoreOptions(limits=policy.limits, must_exist=False))
            try:
                found += [e.data for e in store.entries(digest) if not e.note]
            finally:
                store.close()
        return found

    return lookup
