"""The values of the admission webhook: its configuration, a parsed request, and the decisions it returns.

No logic beyond parsing one reference lives here; `modelsec.webhook.review` decides.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelsec.errors import BackendUnavailableError, MalformedArtifactError
from modelsec.registry.reference import normalize_model_uri
from modelsec.verifier.pinning import split_reference

__all__ = [
    "AdmissionRequest",
    "BadRequestError",
    "CacheOnOutage",
    "DeadlineExceededError",
    "Decision",
    "InvalidReviewError",
    "Mode",
    "ModelReference",
    "ReferenceResult",
    "WebhookConfig",
    "parse_reference",
]


class Mode(enum.StrEnum):
    """What a refusal does: block (`enforce`), allow with warnings (`warn`), or only record it (`audit`)."""

    ENFORCE = "enforce"
    WARN = "warn"
    AUDIT = "audit"


class BadRequestError(MalformedArtifactError):
    """The body is not an AdmissionReview with a readable `request.uid`: answer HTTP 400, not a verdict."""


class CacheOnOutage(enum.StrEnum):
    """What a cached positive result is worth while the attestation store cannot be read."""

    DENY = "deny"  # nothing: the store confirms every decision (the default; docs/workflows/admission.md)
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
        require_models_in: Deprecated (use the policy file's `namespaceRules[].requireModel`, which is
            reloaded with the policy): namespace globs whose workloads must name at least one model.
        evidence_ttl_seconds: How long what a registry (or a policy's store) answered is reused: the bound
            on how long an attestation withdrawn from the registry can still be served (0: read each time).
        evidence_negative_ttl_seconds: How long a miss (no manifest, referrer or binding) is reused.
        evidence_cache_max_entries: Bound on the registry-evidence cache.
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
    evidence_ttl_seconds: float = 30.0
    evidence_negative_ttl_seconds: float = 5.0
    evidence_cache_max_entries: int = 4096


@dataclass(frozen=True, slots=True)
class ModelReference:
    """One model reference as named by a workload.

    Attributes:
        raw: The reference as written.
        uri: The part matched against the policies: everything before `@sha256:`, an `oci://` URI
            normalised to its repository (`modelsec.registry.reference.normalize_model_uri`).
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
        InvalidReferenceError: An `oci://` URI that is not a valid image reference (e.g. an upper-case
            repository).
    """
    uri, digest = split_reference(raw)
    return ModelReference(raw, normalize_model_uri(uri), digest, source)


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
        warnings: Failures of matching policies in `warn` mode (or `noMatch: warn`), which do not deny.
    """

    reference: str
    allowed: bool
    reason: str
    detail: str
    policy: str | None = None
    cached: bool = False
    warnings: tuple[str, ...] = ()


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
        warnings: Refusals that only warn (per-policy `mode: warn`, `noMatch: warn`), in words.
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
    warnings: tuple[str, ...] = ()

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
            "warnings": list(self.warnings),
            "references": [
                {
                    "reference": r.reference,
                    "allowed": r.allowed,
                    "reason": r.reason,
                    "detail": r.detail,
                    "policy": r.policy,
                    "cached": r.cached,
                    "warnings": list(r.warnings),
                }
                for r in self.references
            ],
        }


class InvalidReviewError(MalformedArtifactError):
    """The review is readable (uid known) but not a valid v1 AdmissionReview we can decide on."""
