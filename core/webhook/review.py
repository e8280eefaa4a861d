"""AdmissionReview v1 decisions: which models a workload names, and whether each one may run.

Pure logic, no HTTP: `Reviewer.parse` reads a request body, `Reviewer.decide` answers it. The server
(`modelsec.webhook.server`) only moves bytes, enforces the deadline from the outside as well, logs and
counts. Order, failing closed at every step (any error is a deny naming the reference and the reason):

1. the body must be strict JSON (duplicate keys refused) holding an object `request` whose `uid` is a
   non-empty string; otherwise `BadRequestError` (the server answers HTTP 400, never a verdict);
2. the review must be `admission.k8s.io/v1` `AdmissionReview` for CREATE or UPDATE of a covered kind with
   an `object`; anything else is a deny in the same apiVersion with the uid echoed (a `v1beta1` review
   gets a `v1beta1`-shaped deny);
3. model references are collected from the annotation `modelsec.dev/models` (comma-separated
   `<uri>@sha256:<model root digest>`) on Pods (also for the `pods/ephemeralcontainers` subresource) and
   on the workload and its pod template for Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and
   CronJob (`spec.jobTemplate.spec.template`), and for a KServe InferenceService from its annotations,
   `spec.predictor.annotations`, `spec.predictor.storageUri`, `spec.predictor.model.storageUri` and
   `spec.predictor.<framework>.storageUri`. A workload naming no model is allowed;
4. per reference: a malformed reference (bad digest such as `sha256:zz`, no scheme, whitespace) is
   refused; the URI (without the digest) must match a policy of the `PolicySet` (`noMatch: deny`); a
   reference without a digest is refused when the matched policy has `requireDigest` (tags are mutable),
   and also otherwise, since there is then no model root digest to look bundles up by;
5. the bundles filed for the digest are read from the attestation store and checked with
   `verify_attestations(digest, bundles, policy)` (weights signatures required); the reference is
   allowed only when the verdict is `ok`. Only positive results are cached, keyed by (policy generation,
   matched policy name, digest), for `cache_ttl_seconds`, together with a fingerprint of the bundles they
   were computed from. The store is read on every decision, cached or not: a cached result is reused only
   while the store returns exactly those bundles (a withdrawn or added bundle means a full verification);
   a store that cannot be read denies (`cache_on_outage: deny`, the default) unless the operator chose
   `serve`, which reuses an unexpired positive result during the outage (and says so in the decision);
6. the whole decision must finish within `deadline_seconds` (checked between steps; the server also stops
   waiting at the deadline): an overrun is a deny.

Modes (`WebhookConfig.mode`, set with `modelsec webhook serve --mode`): `enforce` answers the verdict;
`warn` allows and returns every refusal as an AdmissionReview `warnings` entry; `audit` allows silently and
leaves the refusal to the audit log, metrics and `auditAnnotations`. Requests that are not a valid v1
AdmissionReview (step 2) are denied in every mode.

Dry-run requests (`request.dryRun: true`) are evaluated exactly like others; they read the cache but never
write it, so a dry run leaves no trace in the webhook's state besides logs and metrics.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelsec._strict_json import strict_loads
from modelsec.errors import (
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    PolicyViolationError,
)
from modelsec.policy import Policy, PolicySet
from modelsec.verifier.pinning import MODELS_ANNOTATION, split_models_annotation, split_reference
from modelsec.verifier.stores import AttestationStore
from modelsec.verifier.stores.directory import DirectoryStore

__all__ = [
    "ANNOTATION",
    "AdmissionRequest",
    "AttestationStore",
    "BadRequestError",
    "CacheOnOutage",
    "DeadlineExceededError",
    "Decision",
    "DirectoryStore",
    "Mode",
    "ModelReference",
    "PositiveCache",
    "ReferenceResult",
    "Reviewer",
    "WebhookConfig",
    "bundles_fingerprint",
    "parse_reference",
]

ANNOTATION = MODELS_ANNOTATION
API_V1 = "admission.k8s.io/v1"
API_V1BETA1 = "admission.k8s.io/v1beta1"
_UID_MAX = 256
_WORKLOAD_KINDS = {
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}
_KSERVE = ("serving.kserve.io", "InferenceService")


class Mode(enum.StrEnum):
    """What a refusal does: block (`enforce`), allow with warnings (`warn`), or only record it (`audit`)."""

    ENFORCE = "enforce"
    WARN = "warn"
    AUDIT = "audit"


class BadRequestError(MalformedArtifactError):
    """The body is not an AdmissionReview with a readable `request.uid`: answer HTTP 400, not a verdict."""


class CacheOnOutage(enum.StrEnum):
    """What a cached positive result is worth while the attestation store cannot be read."""

    DENY = "deny"  # nothing: the store confirms every decision (the default; README: an outage denies)
    SERVE = "serve"  # reused until its TTL ends, though a withdrawal during the outage goes unseen


class DeadlineExceededError(BackendUnavailableError):
    """The decision could not be finished within the internal deadline (the request is denied)."""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Settings of one webhook process (one limits object, the python-tuf habit).

    Attributes:
        mode: `enforce`, `warn` or `audit` (see the module docstring).
        deadline_seconds: Internal deadline for one decision; keep it below the webhook's `timeoutSeconds`
            (at most 10 s in Kubernetes) so that an overrun is our deny, not the apiserver's timeout.
        cache_ttl_seconds: How long a positive result is reused (0 disables the cache).
        cache_max_entries: Bound on cached positive results.
        cache_on_outage: `deny` (default): a store outage denies even a cached model; `serve`: an
            unexpired cached positive result is reused while the store cannot be read.
        max_body_bytes: Largest request body read (the apiserver's own request limit is 3 MiB).
        max_references: Most model references one workload may name.
        max_bundles: Most bundles read from the store for one digest.
        require_models_in: Namespace globs (`fnmatch`) whose workloads must name at least one model: a
            workload there without a model reference is denied instead of allowed.
    """

    mode: Mode = Mode.ENFORCE
    deadline_seconds: float = 8.0
    cache_ttl_seconds: float = 60.0
    cache_max_entries: int = 4096
    cache_on_outage: CacheOnOutage = CacheOnOutage.DENY
    max_body_bytes: int = 4 * 2**20
    max_references: int = 32
    max_bundles: int = 1024
    require_models_in: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelReference:
    """One model reference as named by a workload.

    Attributes:
        raw: The reference as written.
        uri: The part matched against the policies (everything before `@sha256:`).
        digest: The model root digest (64 hex), or None when the reference pins none.
        source: Where it was found (e.g. `spec.template.metadata.annotations`).
    """

    raw: str
    uri: str
    digest: str | None
    source: str


def parse_reference(raw: str, source: str) -> ModelReference:
    """Parse `<uri>[@sha256:<64 hex>]`.

    Args:
        raw: One reference (already split on commas and stripped).
        source: Where it was found, for diagnostics.

    Returns:
        The reference; its digest is None when none was pinned (refused later if the policy requires one).

    Raises:
        MalformedArtifactError: The URI has no scheme, contains whitespace, `,` or `@`, or the part after
            the last `@` is not `sha256:` and 64 lowercase hex digits.
    """
    uri, digest = split_reference(raw)
    return ModelReference(raw, uri, digest, source)


def bundles_fingerprint(bundles: Sequence[bytes]) -> str:
    """A digest of a set of bundles (order-independent): what a cached result was computed from."""
    h = hashlib.sha256()
    for digest in sorted(hashlib.sha256(b).digest() for b in bundles):
        h.update(digest)
    return h.hexdigest()


class PositiveCache:
    """Positive results only, keyed by (policy generation, policy name, digest), with a TTL. Thread-safe.

    Each entry keeps the fingerprint of the bundles it was computed from (`bundles_fingerprint`).
    """

    def __init__(self, ttl_seconds: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl, self._max, self._clock = ttl_seconds, max_entries, clock
        self._entries: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> str | None:
        """The bundles fingerprint of `key`'s positive result if it is younger than the TTL, else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= self._clock():
                del self._entries[key]
                return None
            return entry[1]

    def hit(self, key: tuple[str, str, str], fingerprint: str) -> bool:
        """Whether `key` was verified positively, from bundles with `fingerprint`, less than the TTL ago."""
        cached = self.get(key)
        return cached is not None and hmac.compare_digest(cached, fingerprint)

    def put(self, key: tuple[str, str, str], fingerprint: str) -> None:
        """Remember a positive result (expired entries, then the oldest, make room)."""
        if self._ttl <= 0:
            return
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self._max:
                for k in [k for k, v in self._entries.items() if v[0] <= now]:
                    del self._entries[k]
                while len(self._entries) >= self._max:
                    del self._entries[next(iter(self._entries))]
            self._entries[key] = (now + self._ttl, fingerprint)

    def discard(self, key: tuple[str, str, str]) -> None:
        """Forget `key` (its bundles changed and no longer verify)."""
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """A body whose uid could be read; everything else about it is still unchecked.

    Attributes:
        uid: `request.uid`, echoed in the response.
        api_version: The review's apiVersion (the response uses the same one).
        review: The decoded AdmissionReview.
    """

    uid: str
    api_version: str
    review: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ReferenceResult:
    """The decision about one model reference.

    Attributes:
        reference: The reference as written.
        allowed: Whether the reference may run.
        reason: A short category for metrics (`verified`, `no-policy`, `digest-required`,
            `malformed-reference`, `attestation`, `store-unavailable`, `deadline`, `error`).
        detail: Human-readable explanation.
        policy: The matched policy's name, if any.
        cached: Whether a cached positive result was used.
    """

    reference: str
    allowed: bool
    reason: str
    detail: str
    policy: str | None = None
    cached: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """An answered review: the response body and what the audit log and metrics record.

    Attributes:
        response: The AdmissionReview to send back (HTTP 200).
        uid: The echoed uid.
        verdict: `allow` or `deny`, before the mode is applied.
        allowed: What the response says (always True in warn and audit modes, except for invalid reviews).
        reason: A short category (`verified`, `no-references`, `malformed-request`, or the first refused
            reference's reason).
        mode: The mode applied.
        dry_run: Whether the request was a dry run.
        messages: Every refusal, in words.
        references: The per-reference results.
        request_info: kind, namespace, name, operation and subresource, for the audit log.
    """

    response: dict[str, Any]
    uid: str
    verdict: str
    allowed: bool
    reason: str
    mode: Mode
    dry_run: bool
    messages: tuple[str, ...]
    references: tuple[ReferenceResult, ...] = ()
    request_info: Mapping[str, str] = field(default_factory=dict)

    def audit_record(self) -> dict[str, Any]:
        """A JSON-ready audit log record of the decision."""
        return {
            "uid": self.uid,
            **self.request_info,
            "dryRun": self.dry_run,
            "mode": self.mode.value,
            "verdict": self.verdict,
            "allowed": self.allowed,
            "reason": self.reason,
            "messages": list(self.messages),
            "references": [
                {
                    "reference": r.reference,
                    "allowed": r.allowed,
                    "reason": r.reason,
                    "detail": r.detail,
                    "policy": r.policy,
                    "cached": r.cached,
                }
                for r in self.references
            ],
        }


@dataclass(frozen=True, slots=True)
class _PendingReference:
    raw: str
    where: str


class _InvalidReviewError(MalformedArtifactError):
    """The review is readable (uid known) but not a valid v1 AdmissionReview we can decide on."""


def _reason_for(e: BaseException) -> str:
    if isinstance(e, DeadlineExceededError):
        return "deadline"
    if isinstance(e, BackendUnavailableError):
        return "store-unavailable"
    if isinstance(e, PolicyViolationError):
        return "no-policy"
    if isinstance(e, MalformedArtifactError):
        return "malformed-reference"
    return "error"


def _get(doc: object, path: Sequence[str], where: str) -> object:
    value = doc
    for part in path:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise _InvalidReviewError(f"{where}: {'.'.join(path)} is not an object")
        value = value.get(part)
    return value


class Reviewer:
    """Answers AdmissionReviews for one policy set, attestation store and configuration.

    Example:
        >>> reviewer = Reviewer(PolicySet.from_file(Path("policy.yaml")), DirectoryStore(Path("/store")))
        >>> decision = reviewer.review(body)  # raises BadRequestError when the uid is unreadable
        >>> decision.response["response"]["allowed"]
    """

    def __init__(
        self,
        policies: PolicySet,
        store: AttestationStore,
        config: WebhookConfig | None = None,
        *,
        generation: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create a reviewer.

        Args:
            policies: The validated policy file.
            store: Where bundles are read from.
            config: Mode, deadline, cache and size limits; defaults to `WebhookConfig()`.
            generation: Identifies this policy version in cache keys (e.g. the SHA-256 of the policy file);
                defaults to a digest of `policies.source` and the policy names.
            clock: Monotonic clock in seconds (tests inject one).
        """
        self.policies = policies
        self.store = store
        self.config = config or WebhookConfig()
        self.generation = (
            generation
            or policies.digest
            or hashlib.sha256(
                repr((policies.source, [p.name for p in policies.policies])).encode()
            ).hexdigest()
        )
        self._clock = clock
        self.cache = PositiveCache(self.config.cache_ttl_seconds, self.config.cache_max_entries, clock)

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
        deadline = (self._clock() if started is None else started) + self.config.deadline_seconds
        dry_run = False
        info = self._request_info(request.review["request"])
        try:
            req = self._check_review(request)
            dry_run = req.get("dryRun") is True
            references = self._references(req)
        except Error as e:
            return self._answer(request, "deny", "malformed-request", (e.diagnostics(),), (), dry_run, info)
        except Exception as e:  # noqa: BLE001 - fail closed: any bug in parsing is a deny, never an allow
            message = f"internal error while reading the request: {type(e).__name__}"
            return self._answer(request, "deny", "malformed-request", (message,), (), dry_run, info)
        try:
            uncovered = self._uncovered_image_volumes(req, references)
        except Exception as e:  # noqa: BLE001 - fail closed
            return self._answer(
                request, "deny", "malformed-request", (f"image volumes: {e}",), (), dry_run, info
            )
        if uncovered:
            messages = tuple(
                f"image volume {ref!r} is not among the workload's verified model references ({ANNOTATION}: "
                f"oci://<repository>@sha256:<model root digest>)"
                for ref in uncovered
            )
            return self._answer(request, "deny", "unverified-image-volume", messages, (), dry_run, info)
        if not references:
            namespace = info.get("namespace", "")
            if any(fnmatch.fnmatchcase(namespace, p) for p in self.config.require_models_in):
                message = f"namespace {namespace!r} requires a model reference (annotation {ANNOTATION})"
                return self._answer(request, "deny", "missing-references", (message,), (), dry_run, info)
            return self._answer(request, "allow", "no-references", (), (), dry_run, info)
        results = tuple(self._decide_reference(ref, deadline, dry_run) for ref in references)
        refused = [r for r in results if not r.allowed]
        if refused:
            messages = tuple(f"model {r.reference}: {r.detail}" for r in refused)
            return self._answer(request, "deny", refused[0].reason, messages, results, dry_run, info)
        return self._answer(request, "allow", "verified", (), results, dry_run, info)

    def deny(self, request: AdmissionRequest, reason: str, message: str) -> Decision:
        """A deny for a request the caller could not get decided (e.g. `reason="deadline"`, `"error"`).

        The mode applies as for any other refusal (warn and audit allow and record it).
        """
        dry_run = request.review["request"].get("dryRun") is True
        return self._answer(
            request, "deny", reason, (message,), (), dry_run, self._request_info(request.review["request"])
        )

    def deny_deadline(self, request: AdmissionRequest) -> Decision:
        """The answer when the server stopped waiting for `decide` at the deadline."""
        message = f"verification did not finish within the {self.config.deadline_seconds:g} s deadline"
        return self.deny(request, "deadline", message)

    def _check_review(self, request: AdmissionRequest) -> Mapping[str, Any]:
        review = request.review
        if review.get("apiVersion") != API_V1 or review.get("kind") != "AdmissionReview":
            raise _InvalidReviewError(
                f"only {API_V1} AdmissionReview is supported, got {review.get('apiVersion')!r} "
                f"{review.get('kind')!r}"
            )
        req: Mapping[str, Any] = review["request"]
        operation = req.get("operation")
        if operation not in ("CREATE", "UPDATE"):
            raise _InvalidReviewError(f"operation {operation!r} is not reviewed (only CREATE and UPDATE)")
        if not isinstance(req.get("object"), dict):
            raise _InvalidReviewError("request.object is missing or not an object")
        if not isinstance(req.get("kind"), dict):
            raise _InvalidReviewError("request.kind is missing")
        return req

    @staticmethod
    def _request_info(req: Mapping[str, Any]) -> dict[str, str]:
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

    def _references(self, req: Mapping[str, Any]) -> list[_PendingReference]:
        kind = req["kind"]
        group, name = kind.get("group", ""), kind.get("kind")
        obj = req["object"]
        sources: list[tuple[object, str]] = []  # (annotation map or URI string, where)
        if (group, name) == ("", "Pod"):
            sources.append((_get(obj, ("metadata", "annotations"), "Pod"), "metadata.annotations"))
        elif (group, name) in _WORKLOAD_KINDS:
            template = _WORKLOAD_KINDS[(group, name)]
            sources.append((_get(obj, ("metadata", "annotations"), name), "metadata.annotations"))
            where = ".".join((*template, "metadata", "annotations"))
            sources.append((_get(obj, (*template, "metadata", "annotations"), name), where))
        elif (group, name) == _KSERVE:
            sources.append((_get(obj, ("metadata", "annotations"), name), "metadata.annotations"))
            predictor = _get(obj, ("spec", "predictor"), name)
            if predictor is not None:
                if not isinstance(predictor, Mapping):
                    raise _InvalidReviewError(f"{name}: spec.predictor is not an object")
                sources.append((predictor.get("annotations"), "spec.predictor.annotations"))
                sources.append((predictor.get("storageUri"), "spec.predictor.storageUri"))
                for key, value in sorted(predictor.items()):
                    if isinstance(value, Mapping) and "storageUri" in value:
                        sources.append((value["storageUri"], f"spec.predictor.{key}.storageUri"))
        else:
            raise _InvalidReviewError(f"kind {group or 'core'}/{name} is not covered by modelsec")
        refs: list[_PendingReference] = []
        seen: set[str] = set()
        for value, where in sources:
            raws: list[str]
            if value is None:
                continue
            if where.endswith("annotations"):
                if not isinstance(value, Mapping):
                    raise _InvalidReviewError(f"{where} is not an object")
                text = value.get(ANNOTATION)
                if text is None:
                    continue
                if not isinstance(text, str):
                    raise _InvalidReviewError(f"{where}[{ANNOTATION}] is not a string")
                try:
                    raws = split_models_annotation(text)
                except MalformedArtifactError:
                    raise _InvalidReviewError(f"{where}[{ANNOTATION}] has an empty entry") from None
            elif isinstance(value, str) and value:
                raws = [value.strip()]
            else:
                raise _InvalidReviewError(f"{where} is not a non-empty string")
            for raw in raws:
                if raw not in seen:
                    seen.add(raw)
                    refs.append(_PendingReference(raw, where))
        if len(refs) > self.config.max_references:
            raise _InvalidReviewError(
                f"{len(refs)} model references, more than the limit of {self.config.max_references}"
            )
        return refs

    @staticmethod
    def _uncovered_image_volumes(req: Mapping[str, Any], references: list[_PendingReference]) -> list[str]:
        """Image volumes whose repository no model reference of the workload names as `oci://<repository>`.

        Image volumes (`spec.volumes[].image.reference`, OCI artifacts mounted as files, Kubernetes 1.31+)
        are how a model can reach a container without being named in the annotation: each one must be
        covered by a reference that is then verified like any other.
        """
        kind = req["kind"]
        group, name = kind.get("group", ""), kind.get("kind")
        obj = req["object"]
        if (group, name) == ("", "Pod"):
            spec = obj.get("spec")
        elif (group, name) in _WORKLOAD_KINDS:
            spec = _get(obj, (*_WORKLOAD_KINDS[(group, name)], "spec"), name)
        else:
            return []
        volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
        if not isinstance(volumes, list):
            return []
        named = set()
        for pending in references:
            uri = pending.raw.split("@", 1)[0]
            if uri.startswith("oci://"):
                named.add(uri[len("oci://") :])
        uncovered = []
        for volume in volumes:
            image = volume.get("image") if isinstance(volume, Mapping) else None
            if image is None:
                continue
            ref = image.get("reference") if isinstance(image, Mapping) else None
            if not isinstance(ref, str) or not ref:
                uncovered.append(repr(ref))
                continue
            repository = ref.split("@", 1)[0]
            last = repository.rsplit("/", 1)[-1]
            if ":" in last:  # a tag, not a registry port
                repository = repository[: len(repository) - len(last)] + last.split(":", 1)[0]
            if repository not in named:
                uncovered.append(ref)
        return uncovered

    def _decide_reference(
        self, pending: _PendingReference, deadline: float, dry_run: bool
    ) -> ReferenceResult:
        raw = pending.raw
        policy: Policy | None = None
        try:
            self._check_deadline(deadline)
            ref = parse_reference(raw, pending.where)
            policy = self.policies.for_uri(ref.uri)
            if ref.digest is None:
                if policy.require_digest:
                    return ReferenceResult(
                        raw,
                        False,
                        "digest-required",
                        f"policy {policy.name!r} requires a pinned @sha256:<model root digest> "
                        "(tags are mutable)",
                        policy.name,
                    )
                return ReferenceResult(
                    raw, False, "digest-required", "no model root digest to verify", policy.name
                )
            key = (self.generation, policy.name, ref.digest)
            try:
                bundles = self.store.bundles(ref.digest)
            except BackendUnavailableError:
                if self.config.cache_on_outage is CacheOnOutage.SERVE and self.cache.get(key) is not None:
                    detail = "verified (cached; the attestation store is unavailable, cacheOnOutage: serve)"
                    return ReferenceResult(raw, True, "verified", detail, policy.name, True)
                raise
            self._check_deadline(deadline)
            fingerprint = bundles_fingerprint(bundles)
            if self.cache.hit(key, fingerprint):
                return ReferenceResult(raw, True, "verified", "verified (cached)", policy.name, True)
            from modelsec.verifier.attestations import verify_attestations

            verdict = verify_attestations(ref.digest, bundles, policy, require_signatures=True)
            self._check_deadline(deadline)
            if not verdict.ok:
                self.cache.discard(key)
                detail = f"policy {policy.name!r}: " + "; ".join(verdict.reasons())
                return ReferenceResult(raw, False, "attestation", detail, policy.name)
            if not dry_run:
                self.cache.put(key, fingerprint)
            detail = "verified: " + "; ".join(verdict.satisfied)
            return ReferenceResult(raw, True, "verified", detail, policy.name)
        except Error as e:
            name = policy.name if policy else None
            return ReferenceResult(raw, False, _reason_for(e), e.diagnostics(), name)
        except Exception as e:  # noqa: BLE001 - fail closed: a bug while verifying is a deny, never an allow
            name = policy.name if policy else None
            return ReferenceResult(raw, False, "error", f"internal error: {type(e).__name__}: {e}", name)

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
        # An invalid review is denied in every mode: warn/audit soften model verdicts, not the protocol.
        allowed = verdict == "allow" or (mode is not Mode.ENFORCE and reason != "malformed-request")
        api_version = request.api_version if request.api_version in (API_V1, API_V1BETA1) else API_V1
        response: dict[str, Any] = {
            "uid": request.uid,
            "allowed": allowed,
            "auditAnnotations": {"decision": verdict, "reason": reason, "mode": mode.value},
        }
        if verdict == "deny":
            text = "modelsec: " + "; ".join(messages)
            if not allowed:
                response["status"] = {"code": 403, "reason": "Forbidden", "message": text}
            elif mode is Mode.WARN:
                response["warnings"] = [f"modelsec ({mode.value} mode): {m}"[:512] for m in messages]
        return Decision(
            response={"apiVersion": api_version, "kind": "AdmissionReview", "response": response},
            uid=request.uid,
            verdict=verdict,
            allowed=allowed,
            reason=reason,
            mode=mode,
            dry_run=dry_run,
            messages=messages,
            references=results,
            request_info=dict(info),
        )
