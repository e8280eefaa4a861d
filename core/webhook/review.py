"""AdmissionReview v1 decisions: which models a workload names, and whether each one may run.

Pure logic, no HTTP: `Reviewer.parse` reads a request body, `Reviewer.decide` answers it. The server
(`modelsec.webhook.server`) only moves bytes, enforces the deadline from the outside as well, logs and
counts. Order, failing closed at every step (any error is a deny naming the reference and the reason):

1. the body must be strict JSON (duplicate keys refused) holding an object `request` whose `uid` is a
   non-empty string; otherwise `BadRequestError` (the server answers HTTP 400, never a verdict);
2. the review must be `admission.k8s.io/v1` `AdmissionReview` for CREATE or UPDATE of a covered kind with
   an `object`; anything else is a deny in the same apiVersion with the uid echoed (a `v1beta1` review
   gets a `v1beta1`-shaped deny);
3. model sources are collected (`modelsec.webhook.sources`): references in the annotation
   `modelsec.dev/models` and in every KServe storage field, and the OCI images of every container, init
   container, ephemeral container and image volume;
4. every image and `oci://` reference is compared normalised, as the runtime pulls it
   (`modelsec.registry.reference`: Docker Hub spellings, `library/`, host case, `:443`), and so are the
   policies' patterns; an image that is not a valid reference is refused (its repository is unknown). An
   image is a model when a policy applying in the namespace matches `oci://<repository>`, or when a model
   reference names that repository; other images (the runtime, a non-model image volume) are not reviewed.
   A model image must be pinned by digest (a tag is mutable: refused), and when a reference names its
   repository, the image's digest must be one that reference names (a volume mounting `evil:latest`, or
   another digest, next to an annotation `oci://…/evil@sha256:<attested>` is refused); it is then verified as
   the reference `oci://<repository>@sha256:<digest>`;
5. a workload naming no model is allowed, unless its namespace's rule (`namespaceRules[].requireModel`,
   or the deprecated `WebhookConfig.require_models_in`) requires one;
6. per reference: a malformed reference (bad digest such as `sha256:zz`, no scheme, whitespace) is
   refused; every policy that matches the URI and applies in the namespace must pass (policy-controller and
   Kyverno semantics); a failing policy in `mode: warn` adds a warning instead of denying. A reference no
   policy matches follows its namespace's `noMatch` (`deny`, the default; `warn`; `allow`). A reference
   without a digest is refused by the policies that match it (there is no model root digest to look
   bundles up by);
7. the bundles filed for the digest are read once from the webhook's own store (`--store`, optional) and
   from the stores that `modelsec.verifier.stores.evidence_stores` resolves for the reference under each
   matching policy, the one resolution every front door uses: the policy's `attestationStore` when it names
   one, and, for an `oci://` reference or a model image, the referrers of the artifact in its own registry
   (OCI 1.1 referrers API, tag-schema fallback; read only when the reviewer is given `registry` options,
   as `modelsec webhook serve` always is). Each registry manifest's referrers are listed once per reference
   (`modelsec.registry.referrers.listing_once`): the binding lookup and the bundles read share the listing,
   through the process's shared registry client (kept-alive connections and tokens). A bundle a store
   listed but did not read is passed on with its reason, which a deny then names. They are checked with
   `verify_attestations(digest, bundles, policy)` for each matching policy (weights signatures required).
   What a resolved store answers is kept in the registry-evidence cache (`EvidenceCache`, bounded): for
   `evidence_ttl_seconds` (the bound on how long a withdrawn attestation can still be served), a miss for
   `evidence_negative_ttl_seconds`. A resolved store that cannot be reached is a deny, reason
   `registry-unavailable` for a registry, naming it and saying it could not be reached (fail closed; an
   outage is never cached);
   An `oci://` reference that no evidence supports under its own digest may name an OCI manifest: with a
   `bindings` resolver (the CLI passes `modelsec.distribution.push_pull.bound_root_digests`), the model root
   digests that a binding signed by the policy's `weights` key attaches to that manifest are looked up, and
   the reference passes that policy when the evidence filed for one of them does (a registry that cannot be
   read is an outage, as the store is; the bindings read is kept in the registry-evidence cache too).
   Only positive results are cached, keyed by (policy generation, policy name, digest), for
   `cache_ttl_seconds`, together with a fingerprint of the bundles they were computed from and the stores'
   revision taken before those bundles were read: the webhook's store's change token
   (`AttestationStore.revision`: a stat of a directory store's digest directory and files, SQLite's
   `data_version` and own writes, PostgreSQL's generation row) and the serial of each registry-evidence
   answer used (and of the bindings answer, for a result reached through a binding). A cached decision
   checks that revision, reading no bundle (`Reviewer.decide_cached` does this much and no more, for the
   server's event loop: where memory and a local directory listing cannot vouch, `decide` runs in a worker):
   the same revision reuses the result; any other (a write or
   withdrawal by any process, an expired registry answer, a store that cannot tell, such as the gRPC
   service) reads the bundles, and the result is reused only when they are exactly those it was computed
   from. So a withdrawn or superseded
   attestation is never served from the cache: a store's next token sees it, a registry's within
   `evidence_ttl_seconds`. A store that cannot be read denies (`cache_on_outage: deny`, the default) unless
   the operator chose `serve`, which reuses unexpired positive results during the outage (and says so);
8. the whole decision must finish within `deadline_seconds` (checked between steps; the server also stops
   waiting at the deadline): an overrun is a deny.

The policy file is reloaded when it changes (`modelsec.webhook.reload`): `Reviewer.replace_policies` swaps
it and its cache generation at once, and a decision uses the policies it started with.

Modes (`WebhookConfig.mode`, set with `modelsec webhook serve --mode`): `enforce` answers the verdict (each
policy's own mode applies); `warn` allows and returns every refusal as an AdmissionReview `warnings` entry;
`audit` allows silently and leaves the refusal to the audit log, metrics and `auditAnnotations`. Requests
that are not a valid v1 AdmissionReview (step 2) are denied in every mode.

Dry-run requests (`request.dryRun: true`) are evaluated exactly like others; they read the cache but never
write it, so a dry run leaves no trace in the webhook's state besides logs and metrics.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from modelsec.errors import (
    AttestationError,
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    PolicyViolationError,
)
from modelsec.policy import Policy, PolicySet
from modelsec.registry.reference import oci_scheme
from modelsec.registry.referrers import listing_once
from modelsec.strict_json import strict_loads
from modelsec.verifier.admission import AdmissionVerdict, DigestRequiredError, evaluate
from modelsec.verifier.pinning import MODELS_ANNOTATION
from modelsec.verifier.stores import AttestationStore, StoredBundle, StoreOptions, evidence_stores, open_store
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.webhook.cache import EvidenceCache, PositiveCache, bundles_fingerprint
from modelsec.webhook.decision import (
    AdmissionRequest,
    BadRequestError,
    CacheOnOutage,
    DeadlineExceededError,
    Decision,
    InvalidReviewError,
    Mode,
    ModelReference,
    ReferenceResult,
    WebhookConfig,
    parse_reference,
)
from modelsec.webhook.sources import ImageSource, PendingReference, collect

__all__ = [
    "ANNOTATION",
    "AdmissionRequest",
    "AttestationStore",
    "BadRequestError",
    "CacheOnOutage",
    "DeadlineExceededError",
    "Decision",
    "DirectoryStore",
    "EvidenceCache",
    "Mode",
    "ModelReference",
    "PositiveCache",
    "ReferenceResult",
    "Reviewer",
    "WebhookConfig",
    "admission_review",
    "bundles_fingerprint",
    "parse_reference",
]

ANNOTATION = MODELS_ANNOTATION
API_V1 = "admission.k8s.io/v1"
API_V1BETA1 = "admission.k8s.io/v1beta1"


def admission_review(
    request: AdmissionRequest,
    mode: Mode,
    verdict: str,
    reason: str,
    messages: tuple[str, ...],
    *,
    annotation: str,
) -> tuple[dict[str, Any], list[str]]:
    """The AdmissionReview answering `request` with `verdict` in `mode`, shared by both webhooks.

    `allowed` is true for "allow", and for "deny" outside enforce mode unless the review itself was invalid
    (reason "malformed-request": warn/audit soften model verdicts, not the protocol). A refusal carries a
    403 status naming `messages`. The answer has the request's apiVersion (v1 or v1beta1; v1 otherwise).

    Args:
        request: The parsed request (its uid and apiVersion).
        mode: The configured mode.
        verdict: "allow" or "deny".
        reason: Short reason code, recorded in the audit annotations.
        messages: Why, one line each.
        annotation: The audit-annotation key that records `verdict` ("decision", "mutation").

    Returns:
        The review (its `response` a dict the caller may add warnings or a patch to) and the warn-mode
        lines of an allowed refusal (not yet cut to the API server's length).
    """
    allowed = verdict == "allow" or (mode is not Mode.ENFORCE and reason != "malformed-request")
    api_version = request.api_version if request.api_version in (API_V1, API_V1BETA1) else API_V1
    response: dict[str, Any] = {
        "uid": request.uid,
        "allowed": allowed,
        "auditAnnotations": {annotation: verdict, "reason": reason, "mode": mode.value},
    }
    shown: list[str] = []
    if verdict == "deny":
        if not allowed:
            text = "modelsec: " + "; ".join(messages)
            response["status"] = {"code": 403, "reason": "Forbidden", "message": text}
        elif mode is Mode.WARN:
            shown = [f"modelsec ({mode.value} mode): {m}" for m in messages]
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}, shown


_UID_MAX = 256


_MAX_OPEN_STORES = 256  # resolved stores kept open (one per registry repository or policy store)


class _NotCachedError(Exception):
    """`Reviewer.decide_cached`: a reference cannot be answered from memory and a local listing alone.

    Not an `Error`: it is no refusal, and no handler may turn it into a verdict; `decide_cached` returns None
    and the caller decides the whole request again with `decide`.
    """


class _PolicyRefusedError(AttestationError):
    """The evidence filed for a reference does not satisfy one matching policy (bindings included)."""


class _EvidenceUnavailableError(BackendUnavailableError):
    """The store that holds a reference's evidence (its registry, or its policy's store) cannot be read."""

    def __init__(self, where: str, registry: bool, cause: BackendUnavailableError) -> None:
        super().__init__(
            f"{where} could not be reached, so the evidence about this model cannot be read and it is "
            f"denied (fail closed): {cause.diagnostics()}"
        )
        self.where, self.registry = where, registry


def _unavailable(spec: str, e: BackendUnavailableError) -> _EvidenceUnavailableError:
    """The outage of store `spec`, naming the registry for an `oci://` store."""
    if spec.startswith("oci://"):
        from modelsec.registry.reference import parse_reference

        try:
            return _EvidenceUnavailableError(f"registry {parse_reference(spec).registry}", True, e)
        except Error:
            pass
    return _EvidenceUnavailableError(f"attestation store {spec}", False, e)


def _reason_for(e: BaseException) -> str:
    if isinstance(e, _PolicyRefusedError):
        return "attestation"
    if isinstance(e, DigestRequiredError):
        return "digest-required"
    if isinstance(e, DeadlineExceededError):
        return "deadline"
    if isinstance(e, _EvidenceUnavailableError) and e.registry:
        return "registry-unavailable"
    if isinstance(e, BackendUnavailableError):
        return "store-unavailable"
    if isinstance(e, PolicyViolationError):
        return "no-policy"
    if isinstance(e, MalformedArtifactError):
        return "malformed-reference"
    return "error"


def _unreachable(policy: Policy) -> str:
    """The check of a reference that pins no digest or that no policy matches: never called."""
    raise MalformedArtifactError(f"policy {policy.name!r} cannot be checked without a model root digest")


def _fingerprint(root: str, entries: Sequence[StoredBundle]) -> str:
    """What a cached result was computed from: the root digest and every bundle (or why it was not read)."""
    parts = [b"\0unread:" + e.note.encode() if e.note else e.data for e in entries]
    return f"{root}:{bundles_fingerprint(parts)}"


def _bound(
    bindings: Callable[[str, Policy], set[str]], raw: str, policy: Policy, reasons: list[str]
) -> list[str]:
    """The root digests trusted bindings attach to the manifest `raw` names (none: why, in `reasons`).

    Raises:
        BackendUnavailableError: The registry cannot be read (an outage denies).
    """
    try:
        bound = sorted(bindings(raw, policy))
    except _EvidenceUnavailableError:
        raise
    except BackendUnavailableError as e:
        raise _unavailable(raw, e) from e
    except Error as e:
        reasons.append(f"no signed binding read for this OCI manifest: {e.diagnostics()}")
        return []
    if not bound:
        reasons.append("no binding signed by a trusted key names this OCI manifest")
    return bound


class _Evidence(NamedTuple):
    """What the stores hold about a root digest for one policy, read once per decision.

    `revision`: the change tokens of those stores taken before the read (the webhook's store's `revision`,
    then the serial of each resolved store's answer in the registry evidence cache), or None when one of
    them cannot tell.
    """

    entries: list[StoredBundle]
    fingerprint: str
    revision: tuple[Hashable, ...] | None


def _links(evidence: Callable[[str, Policy], _Evidence], policy: Policy, digest: str) -> list[bytes]:
    """Lineage links about `digest` (a base model) from the stores this reviewer reads for `policy`."""
    return [e.data for e in evidence(digest, policy).entries if not e.note]


def _bound_tuple(
    bindings: Callable[[str, Policy], set[str]], raw: str, policy: Policy, reasons: list[str]
) -> tuple[str, ...]:
    """`_bound` as an immutable value (what the registry-evidence cache keeps)."""
    return tuple(_bound(bindings, raw, policy, reasons))


def _result(raw: str, verdict: AdmissionVerdict) -> ReferenceResult:
    """The decision about one reference, from the admission verdict of its matching policies."""
    warnings = tuple(f"model {raw}: {w}" for w in verdict.warnings())
    if not verdict.outcomes:
        return ReferenceResult(raw, verdict.allowed, "no-policy", verdict.no_match_detail, warnings=warnings)
    names = ", ".join(p.name for p in verdict.matched)
    cause = verdict.outcomes[0].error
    if cause is not None and all(o.error is cause for o in verdict.outcomes):
        # One cause refused every policy (no digest, a store outage, the deadline): it is said once.
        detail = verdict.outcomes[0].detail
        return ReferenceResult(raw, verdict.allowed, _reason_for(cause), detail, names, warnings=warnings)
    enforced = verdict.enforced_failures
    if enforced:
        detail = "; ".join(f"policy {o.policy.name!r}: {o.detail}" for o in enforced)
        reason = _reason_for(enforced[0].error) if enforced[0].error is not None else "error"
        return ReferenceResult(raw, False, reason, detail, enforced[0].policy.name, warnings=warnings)
    satisfied = [f"{o.policy.name}: {o.detail}" for o in verdict.outcomes if o.passed]
    cached = len(satisfied) == len(verdict.outcomes) and all(s.endswith("(cached)") for s in satisfied)
    detail = "; ".join(satisfied) or "no enforcing policy failed"
    return ReferenceResult(raw, True, "verified", detail, names, cached, warnings)


class Reviewer:
    """Answers AdmissionReviews for one policy set, attestation store and configuration.

    Example:
        >>> reviewer = Reviewer(PolicySet.from_file(Path("policy.yaml")), None, registry=RegistryOptions())
        >>> decision = reviewer.review(body)  # raises BadRequestError when the uid is unreadable
        >>> decision.response["response"]["allowed"]
    """

    def __init__(
        self,
        policies: PolicySet,
        store: AttestationStore | None,
        config: WebhookConfig | None = None,
        *,
        generation: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        bindings: Callable[[str, Policy], set[str]] | None = None,
        registry: Any = None,
    ) -> None:
        """Create a reviewer.

        Args:
            policies: The validated policy file.
            store: A store read for every reference besides those `evidence_stores` resolves (the
                `--store` directory or gRPC service), or None.
            config: Mode, deadline, cache and size limits; defaults to `WebhookConfig()`.
            generation: Identifies this policy version in cache keys (e.g. the SHA-256 of the policy file);
                defaults to a digest of `policies.source` and the policy names.
            clock: Monotonic clock in seconds (tests inject one).
            bindings: For `oci://…@sha256:<manifest digest>` and a policy, the model root digests that
                trusted bindings attach to the manifest
                (`modelsec.distribution.push_pull.bound_root_digests`); it raises `BackendUnavailableError`
                when the registry cannot be read. None: references are verified by their own digest only.
            registry: A `modelsec.registry.client.RegistryOptions` (CA, credentials, timeout): the evidence
                of an `oci://` reference or model image is read from the referrers of the artifact in its
                own registry, and a policy's `attestationStore` is read as well (step 7). None: only `store`
                and the policies' stores are read, registries never (in-process tests without one).
        """
        self.store = store
        self.bindings = bindings
        self.registry = registry
        self.config = config or WebhookConfig()
        self._opened: dict[str, AttestationStore] = {}
        self._opened_lock = threading.Lock()
        self._state = (policies, generation or self._generation_of(policies))
        self._reloads = itertools.count(1)
        self._clock = clock
        self.cache = PositiveCache(self.config.cache_ttl_seconds, self.config.cache_max_entries, clock)
        self.evidence_cache = EvidenceCache(
            self.config.evidence_ttl_seconds,
            self.config.evidence_negative_ttl_seconds,
            self.config.evidence_cache_max_entries,
            clock,
        )

    @staticmethod
    def _generation_of(policies: PolicySet) -> str:
        return (
            policies.digest
            or hashlib.sha256(
                repr((policies.source, [p.name for p in policies.policies])).encode()
            ).hexdigest()
        )

    @property
    def policies(self) -> PolicySet:
        """The policy set decisions start with now."""
        return self._state[0]

    @property
    def generation(self) -> str:
        """The cache generation of `policies`."""
        return self._state[1]

    def replace_policies(self, policies: PolicySet) -> None:
        """Use `policies` for every decision that starts from now on (a reloaded policy file).

        The cache generation changes with every replacement, even when the file's bytes did not (a key file
        beside it may have changed), so no positive result of an earlier policy is reused.
        """
        generation = f"{self._generation_of(policies)}#{next(self._reloads)}"
        self._state = (policies, generation)
        self.cache.clear()
        self.evidence_cache.clear()

    def review(self, body: bytes) -> Decision:
        """Parse and decide in one call (see `parse` and `decide`).

        Raises:
            BadRequestError: No readable `request.uid` (answer HTTP 400).
        """
        return self.decide(self.parse(body))

    def parse(self, body: bytes) -> AdmissionRequest:
        """Read just enough of a body to answer it: strict JSON, an object `request` and its `uid`.

        Args:
            body: The raw HTTP request body.

        Returns:
            The request with its uid and apiVersion; its content is checked by `decide`.

        Raises:
            BadRequestError: Too large, not strict JSON, not an object, or no non-empty string
                `request.uid` of at most 256 characters.
        """
        if len(body) > self.config.max_body_bytes:
            raise BadRequestError(f"request body larger than {self.config.max_body_bytes} bytes")
        try:
            doc = strict_loads(body, what="AdmissionReview")
        except MalformedArtifactError as e:
            raise BadRequestError(e.diagnostics()) from e
        request = doc.get("request") if isinstance(doc, dict) else None
        uid = request.get("uid") if isinstance(request, dict) else None
        if not isinstance(uid, str) or not uid or len(uid) > _UID_MAX or not uid.isprintable():
            raise BadRequestError("AdmissionReview has no readable request.uid")
        api_version = doc.get("apiVersion")
        return AdmissionRequest(uid, api_version if isinstance(api_version, str) else API_V1, doc)

    def decide(self, request: AdmissionRequest, *, started: float | None = None) -> Decision:
        """Decide on a parsed request; never raises (every failure is a deny with its reason).

        Args:
            request: From `parse`.
            started: When the deadline started (monotonic seconds; default now).

        Returns:
            The decision, with the response in the request's apiVersion and the uid echoed.
        """
        return self._decide(request, started, cached_only=False)

    def decide_cached(self, request: AdmissionRequest, *, started: float | None = None) -> Decision | None:
        """`decide`, if it can be done without waiting on anything: else None (call `decide`).

        The same steps and the same answer as `decide`, but a reference whose policies all have a cached
        positive result is answered only when the stores' revision it was confirmed at is still theirs, as
        memory and a local directory tell it: the registry-evidence cache's serials and, for the webhook's
        own store, a `DirectoryStore`'s `revision` (one listing of the digest's directory, no bundle read).
        Anything else (a result not cached, a revision changed or unknown, a store that must be asked over
        a connection: SQLite, PostgreSQL, the gRPC service) gives None, and nothing is written: the caller
        then runs `decide`, which reads the evidence. What is allowed here is exactly what `decide` would
        allow from its cache at this revision, and a refusal (a malformed review, a missing or unmatched
        reference) is the refusal `decide` gives. For the server's event loop, which answers a cached
        decision without handing it to a worker thread (`modelsec.webhook.server`).

        Args:
            request: From `parse`.
            started: When the deadline started (monotonic seconds; default now).

        Returns:
            The decision, or None when the evidence must be read (or a store asked) first.
        """
        if self.store is not None and not isinstance(self.store, DirectoryStore):
            return None
        try:
            return self._decide(request, started, cached_only=True)
        except _NotCachedError:
            return None

    def _decide(self, request: AdmissionRequest, started: float | None, *, cached_only: bool) -> Decision:
        """`decide`; with `cached_only`, `_NotCachedError` where a reference needs more than its cache."""
        deadline = (self._clock() if started is None else started) + self.config.deadline_seconds
        policies, generation = self._state
        dry_run = False
        info = self.request_info(request.review["request"])
        namespace = info.get("namespace", "")
        try:
            req = self.check_review(request)
            dry_run = req.get("dryRun") is True
            kind = req["kind"]
            refs, images = collect(kind.get("group", ""), kind.get("kind"), req["object"])
            refs, image_results = self._model_images(policies, namespace, refs, images)
            if len(refs) + len(image_results) > self.config.max_references:
                raise InvalidReviewError(
                    f"{len(refs) + len(image_results)} model references, more than the limit of "
                    f"{self.config.max_references}"
                )
        except Error as e:
            return self._answer(request, "deny", "malformed-request", (e.diagnostics(),), (), dry_run, info)
        except Exception as e:  # noqa: BLE001 - fail closed: any bug in parsing is a deny, never an allow
            message = f"internal error while reading the request: {type(e).__name__}"
            return self._answer(request, "deny", "malformed-request", (message,), (), dry_run, info)
        if not refs and not image_results:
            required = policies.rule_for(namespace).require_model or any(
                fnmatch.fnmatchcase(namespace, p) for p in self.config.require_models_in
            )
            if required:
                message = f"namespace {namespace!r} requires a model reference (annotation {ANNOTATION})"
                return self._answer(request, "deny", "missing-references", (message,), (), dry_run, info)
            return self._answer(request, "allow", "no-references", (), (), dry_run, info)
        results = image_results + tuple(
            self._decide_reference(ref, policies, generation, namespace, deadline, dry_run, cached_only)
            for ref in refs
        )
        refused = [r for r in results if not r.allowed]
        if refused:
            messages = tuple(f"model {r.reference}: {r.detail}" for r in refused)
            return self._answer(request, "deny", refused[0].reason, messages, results, dry_run, info)
        reasons = [r.reason for r in results if r.reason != "verified"]
        return self._answer(
            request, "allow", reasons[0] if reasons else "verified", (), results, dry_run, info
        )

    def deny(self, request: AdmissionRequest, reason: str, message: str) -> Decision:
        """A deny for a request the caller could not get decided (e.g. `reason="deadline"`, `"error"`).

        The mode applies as for any other refusal (warn and audit allow and record it).
        """
        dry_run = request.review["request"].get("dryRun") is True
        return self._answer(
            request, "deny", reason, (message,), (), dry_run, self.request_info(request.review["request"])
        )

    def deny_deadline(self, request: AdmissionRequest) -> Decision:
        """The answer when the server stopped waiting for `decide` at the deadline."""
        message = f"verification did not finish within the {self.config.deadline_seconds:g} s deadline"
        return self.deny(request, "deadline", message)

    def check_review(self, request: AdmissionRequest) -> Mapping[str, Any]:
        """Step 2 (also the mutating webhook's): the `request` of a v1 CREATE or UPDATE with an object.

        Raises:
            InvalidReviewError: Another apiVersion, kind or operation, or no `object` or `kind`.
        """
        review = request.review
        if review.get("apiVersion") != API_V1 or review.get("kind") != "AdmissionReview":
            raise InvalidReviewError(
                f"only {API_V1} AdmissionReview is supported, got {review.get('apiVersion')!r} "
                f"{review.get('kind')!r}"
            )
        req: Mapping[str, Any] = review["request"]
        operation = req.get("operation")
        if operation not in ("CREATE", "UPDATE"):
            raise InvalidReviewError(f"operation {operation!r} is not reviewed (only CREATE and UPDATE)")
        if not isinstance(req.get("object"), dict):
            raise InvalidReviewError("request.object is missing or not an object")
        if not isinstance(req.get("kind"), dict):
            raise InvalidReviewError("request.kind is missing")
        return req

    @staticmethod
    def request_info(req: Mapping[str, Any]) -> dict[str, str]:
        """Who asked for what, for the audit log; best effort on an unchecked request (never raises)."""
        kind = req.get("kind")
        if not isinstance(kind, Mapping):
            kind = {}
        return {
            key: str(value)
            for key, value in (
                ("kind", f"{kind.get('group') or 'core'}/{kind.get('kind')}" if kind else None),
                ("namespace", req.get("namespace")),
                ("name", req.get("name")),
                ("operation", req.get("operation")),
                ("subResource", req.get("subResource")),
            )
            if isinstance(value, str) and value
        }

    @staticmethod
    def _model_images(
        policies: PolicySet, namespace: str, refs: list[PendingReference], images: list[ImageSource]
    ) -> tuple[list[PendingReference], tuple[ReferenceResult, ...]]:
        """The references to verify, model images included, and the images refused outright (step 4)."""
        named: dict[str, set[str | None]] = {}
        for pending in refs:
            try:
                ref = parse_reference(pending.raw, pending.where)
            except MalformedArtifactError:
                continue  # refused when the reference itself is decided
            named.setdefault(ref.uri, set()).add(ref.digest)
        out, seen, refused = list(refs), {p.raw for p in refs}, []
        for image in images:
            if image.invalid is not None:
                # Which repository it names cannot be known, so whether it is a model cannot either; the
                # runtime would refuse to pull it anyway.
                detail = f"{image.where}: invalid image reference: {image.invalid}"
                refused.append(ReferenceResult(image.image, False, "malformed-reference", detail))
                continue
            uri = image.uri
            if uri not in named and not policies.matching(uri, namespace):
                continue  # not a model: runtime images and other image volumes are not reviewed here
            if image.malformed:
                detail = f"{image.where}: malformed image reference (want <repository>@sha256:<64 hex>)"
                refused.append(ReferenceResult(image.image, False, "malformed-reference", detail))
            elif image.digest is None:
                detail = (
                    f"{image.where}: model image referenced by tag; pin it as "
                    f"{image.repository}@sha256:<digest> (tags are mutable)"
                )
                refused.append(ReferenceResult(image.image, False, "digest-required", detail))
            elif uri in named and image.digest not in named[uri]:
                pinned = ", ".join(sorted(f"sha256:{d}" for d in named[uri] if d)) or "no digest"
                detail = (
                    f"{image.where}: digest differs from the one the workload's model reference names for "
                    f"{uri} ({pinned}): only the verified digest may be mounted"
                )
                refused.append(ReferenceResult(image.image, False, "image-digest-mismatch", detail))
            elif (raw := f"{uri}@sha256:{image.digest}") not in seen:
                seen.add(raw)
                out.append(PendingReference(raw, image.where))
        return out, tuple(refused)

    def _decide_reference(
        self,
        pending: PendingReference,
        policies: PolicySet,
        generation: str,
        namespace: str,
        deadline: float,
        dry_run: bool,
        cached_only: bool = False,
    ) -> ReferenceResult:
        """Step 6: one admission evaluation of the reference (`modelsec.verifier.admission.evaluate`)."""
        raw = pending.raw
        uri, matched = raw, ()  # type: tuple[str, tuple[Policy, ...]]
        try:
            self._check_deadline(deadline)
            ref = parse_reference(raw, pending.where)
            uri, matched = ref.uri, policies.matching(ref.uri, namespace)
            if ref.digest is None or not matched:
                verdict = evaluate(policies, uri, _unreachable, namespace=namespace, pinned=False)
                return _result(raw, verdict)
            return self._verify(
                raw, ref.uri, ref.digest, policies, namespace, generation, deadline, dry_run, cached_only
            )
        except _NotCachedError:
            raise
        except Error as e:
            if not matched:  # a malformed reference: no policy's mode applies to it
                return ReferenceResult(raw, False, _reason_for(e), e.diagnostics())
            return _result(raw, AdmissionVerdict.refused(uri, namespace, matched, e, policies.source))
        except Exception as e:  # noqa: BLE001 - fail closed: a bug while verifying is a deny, never an allow
            return ReferenceResult(raw, False, "error", f"internal error: {type(e).__name__}: {e}")

    def _verify(
        self,
        raw: str,
        uri: str,
        digest: str,
        policies: PolicySet,
        namespace: str,
        generation: str,
        deadline: float,
        dry_run: bool,
        cached_only: bool = False,
    ) -> ReferenceResult:
        """Every matching policy checked against the bundles filed for `digest` (read once).

        With `cached_only`, a policy without a cached result that its stores' revision still vouches for
        raises `_NotCachedError` (nothing is read, nothing written).
        """
        own: dict[str, tuple[list[StoredBundle], Hashable]] = {}
        read: dict[tuple[tuple[str, ...], str], _Evidence] = {}

        def store_entries(root: str) -> tuple[list[StoredBundle], Hashable]:
            if self.store is None:
                return [], ()
            if root not in own:
                # The revision is taken before the read: a write after it changes it, so a result computed
                # from what is read is never vouched for by a revision older than the read.
                revision = self.store.revision(root)
                own[root] = (self.store.entries(root), revision)
                self._check_deadline(deadline)
            return own[root]

        def evidence(root: str, policy: Policy) -> _Evidence:
            specs = self._resolved(raw, policy)
            if (specs, root) not in read:
                entries, own_revision = store_entries(root)
                parts: list[Hashable] = [own_revision]
                for spec in specs:
                    more, serial = self._resolved_entries(spec, root, policy)
                    entries = entries + more
                    parts.append(serial)
                    self._check_deadline(deadline)
                revision = None if any(p is None for p in parts) else tuple(parts)
                read[specs, root] = _Evidence(entries, _fingerprint(root, entries), revision)
            return read[specs, root]

        def check(policy: Policy) -> str:
            key = (generation, policy.name, digest)
            if cached_only:
                return self._cached_policy(raw, digest, policy, key, generation)
            return self._verify_policy(raw, digest, policy, key, evidence, deadline, dry_run, generation)

        try:
            # One view of each registry manifest's referrers for the whole reference: the binding lookup
            # and the store read that follows it share one listing (and one request).
            with listing_once():
                return _result(raw, evaluate(policies, uri, check, namespace=namespace))
        except BackendUnavailableError:
            if cached_only:
                raise _NotCachedError from None  # `decide` reads, and says what is unavailable
            matched = policies.matching(uri, namespace)
            keys = [(generation, p.name, digest) for p in matched]
            if self.config.cache_on_outage is CacheOnOutage.SERVE and all(self.cache.get(k) for k in keys):
                names = ", ".join(p.name for p in matched)
                detail = "verified (cached; the attestation store is unavailable, cacheOnOutage: serve)"
                return ReferenceResult(raw, True, "verified", detail, names, True)
            raise

    def _revision_now(self, raw: str, policy: Policy, generation: str, cached: Hashable) -> Hashable:
        """The revision of the evidence a cached result was confirmed at, as the stores give it now.

        Nothing is read but change tokens: the webhook's store's `revision`, the serials of the registry
        evidence cache's answers (an expired answer has none) and, for a result reached through a binding,
        the serial of the bindings answer. None when any of them cannot tell (the bundles must be read).

        Raises:
            BackendUnavailableError: The webhook's store cannot be read.
        """
        if not isinstance(cached, tuple) or len(cached) < 2:
            return None
        root, through = cached[0], cached[1]
        parts: list[Hashable] = [root]
        if through:
            parts.append(self.evidence_cache.serial(("bindings", generation, policy.name, raw)))
        else:
            parts.append(0)
        parts.append(self.store.revision(root) if self.store is not None else ())
        parts += [self.evidence_cache.serial(("entries", spec, root)) for spec in self._resolved(raw, policy)]
        return None if any(p is None for p in parts) else tuple(parts)

    def _cached_policy(
        self, raw: str, digest: str, policy: Policy, key: tuple[str, str, str], generation: str
    ) -> str:
        """What satisfied `policy`, from the cache, while the stores' revision is the one it was confirmed at.

        Raises:
            _NotCachedError: No unexpired positive result for `key`, or the revision changed or is unknown.
            BackendUnavailableError: The webhook's store cannot be read.
        """
        cached = self.cache.revision(key)
        if cached is None or self._revision_now(raw, policy, generation, cached) != cached:
            raise _NotCachedError
        root = cached[0]  # type: ignore[index]  # a tuple: `_revision_now` checked it
        via = "" if root == digest else f" through a signed binding to model root digest {root}"
        return f"verified{via} (cached)"

    def _verify_policy(
        self,
        raw: str,
        digest: str,
        policy: Policy,
        key: tuple[str, str, str],
        evidence: Callable[[str, Policy], _Evidence],
        deadline: float,
        dry_run: bool,
        generation: str,
    ) -> str:
        """What satisfied `policy`, bindings included.

        A positive result cached for `key` is reused without reading any bundle while every store it was
        computed from gives the revision it was confirmed at (`_revision_now`); otherwise the bundles are
        read, and the result reused only when they are the ones it was computed from (their fingerprint).

        Raises:
            _PolicyRefusedError: Why `policy` refuses the reference.
            BackendUnavailableError: The store or the registry cannot be read, or the deadline passed.
        """
        from modelsec.verifier.attestations import verify_attestations

        with contextlib.suppress(_NotCachedError):
            return self._cached_policy(raw, digest, policy, key, generation)
        roots = [(digest, 0)]  # type: list[tuple[str, int | None]]  # (root, serial of the bindings read)
        reasons: list[str] = []
        while roots:
            root, through = roots.pop(0)
            entries, fingerprint, revision = evidence(root, policy)
            if revision is not None and through is not None:
                revision = (root, through, *revision)
            else:
                revision = None
            via = "" if root == digest else f" through a signed binding to model root digest {root}"
            if self.cache.hit(key, fingerprint, None if dry_run else revision):
                return f"verified{via} (cached)"
            verdict = verify_attestations(
                root,
                entries,
                policy,
                require_signatures=True,
                lookup=functools.partial(_links, evidence, policy),
            )
            self._check_deadline(deadline)
            if verdict.ok:
                if not dry_run:
                    self.cache.put(key, fingerprint, revision)
                return f"verified{via}: " + "; ".join(verdict.satisfied)
            why = "; ".join(verdict.reasons())
            reasons.append(why if root == digest else f"bound model root digest {root}: {why}")
            if root == digest and oci_scheme(raw) and self.bindings is not None:
                bound, serial = self.evidence_cache.get_or_load(
                    ("bindings", generation, policy.name, raw),
                    functools.partial(_bound_tuple, self.bindings, raw, policy, reasons),
                )
                roots = [(r, serial) for r in bound]
                if not roots and not reasons:  # a cached miss: say why again
                    reasons.append("no binding signed by a trusted key names this OCI manifest")
                self._check_deadline(deadline)
        self.cache.discard(key)
        raise _PolicyRefusedError("; ".join(reasons))

    def _resolved(self, raw: str, policy: Policy) -> tuple[str, ...]:
        """The stores `evidence_stores` resolves for `raw` under `policy` that this reviewer reads (step 7).

        Without `registry` options a reference's own registry is not read (the policy's store still is).
        """
        try:
            specs = evidence_stores(raw if self.registry is not None else "", policy)
        except MalformedArtifactError:
            specs = evidence_stores("", policy)  # not an image reference: refused before it gets here
        return specs

    def _resolved_entries(
        self, spec: str, root: str, policy: Policy
    ) -> tuple[list[StoredBundle], int | None]:
        """What store `spec` files for `root`, through the registry-evidence cache, and the answer's serial.

        Raises:
            _EvidenceUnavailableError: The store cannot be reached (never cached).
        """

        def load() -> list[StoredBundle]:
            try:
                return self._open(spec, policy).entries(root)
            except BackendUnavailableError as e:
                raise _unavailable(spec, e) from e

        return self.evidence_cache.get_or_load(("entries", spec, root), load)

    def _open(self, spec: str, policy: Policy) -> AttestationStore:
        """The resolved store `spec`, opened once (at most `_MAX_OPEN_STORES` are kept open)."""
        with self._opened_lock:
            store = self._opened.get(spec)
            if store is None:
                if len(self._opened) >= _MAX_OPEN_STORES:
                    for old in self._opened.values():
                        old.close()
                    self._opened.clear()
                options = StoreOptions(
                    limits=policy.limits,
                    max_bundles=self.config.max_bundles,
                    must_exist=False,
                    registry=self.registry,
                )
                store = self._opened[spec] = open_store(spec, options)
            return store

    def check(self) -> None:
        """Raise `BackendUnavailableError` unless the configured store (if any) can be read (readiness).

        Registries are per reference and not probed: an unreachable one denies what it holds.
        """
        if self.store is not None:
            self.store.check()

    def _check_deadline(self, deadline: float) -> None:
        if self._clock() > deadline:
            raise DeadlineExceededError(
                f"verification did not finish within the {self.config.deadline_seconds:g} s deadline"
            )

    def _answer(
        self,
        request: AdmissionRequest,
        verdict: str,
        reason: str,
        messages: tuple[str, ...],
        results: tuple[ReferenceResult, ...],
        dry_run: bool,
        info: Mapping[str, str],
    ) -> Decision:
        mode = self.config.mode
        warnings = tuple(w for r in results for w in r.warnings)
        review, shown = admission_review(request, mode, verdict, reason, messages, annotation="decision")
        response = review["response"]
        if mode is not Mode.AUDIT:
            shown += [f"modelsec: {w}" for w in warnings]
        if shown:
            response["warnings"] = [w[:512] for w in shown]
        return Decision(
            response=review,
            uid=request.uid,
            verdict=verdict,
            allowed=response["allowed"],
            reason=reason,
            mode=mode,
            dry_run=dry_run,
            messages=messages,
            references=results,
            request_info=dict(info),
            warnings=warnings,
        )
