"""Kubernetes validating admission webhook: refuse workloads whose models lack valid attestations.

`modelsec.webhook.review` holds the decision logic (no HTTP); `modelsec.webhook.server` serves it over
HTTPS (starlette + uvicorn, installed by the `webhook` extra) and is imported only by `modelsec webhook`.
"""

from __future__ import annotations

from modelsec.webhook.review import (
    ANNOTATION,
    AdmissionRequest,
    AttestationStore,
    BadRequestError,
    DeadlineExceededError,
    Decision,
    DirectoryStore,
    Mode,
    ModelReference,
    ReferenceResult,
    Reviewer,
    WebhookConfig,
    parse_reference,
)

__all__ = [
    "ANNOTATION",
    "AdmissionRequest",
    "AttestationStore",
    "BadRequestError",
    "DeadlineExceededError",
    "Decision",
    "DirectoryStore",
    "Mode",
    "ModelReference",
    "ReferenceResult",
    "Reviewer",
    "WebhookConfig",
    "parse_reference",
]
