"""One table maps every modelsec error class to its gRPC status code (the interceptor's contract)."""

from __future__ import annotations

import grpc
import pytest

from modelsec import errors
from modelsec.service.interceptor import clip, status_for
from modelsec.service.store import StoreFullError
from modelsec.service.work import CancelledWorkError, DeadlinePassedError

S = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.AuthenticationError, S.UNAUTHENTICATED),
        (errors.PermissionDeniedError, S.PERMISSION_DENIED),
        (errors.NotFoundError, S.NOT_FOUND),
        (errors.MalformedArtifactError, S.INVALID_ARGUMENT),
        (errors.PolicyError, S.INVALID_ARGUMENT),
        (errors.UnsupportedAlgorithmError, S.INVALID_ARGUMENT),
        (errors.SignatureError, S.FAILED_PRECONDITION),
        (errors.DigestMismatchError, S.FAILED_PRECONDITION),
        (errors.AttestationError, S.FAILED_PRECONDITION),
        (errors.PolicyViolationError, S.FAILED_PRECONDITION),
        (errors.KeyMaterialError, S.FAILED_PRECONDITION),
        (errors.GateFailedError, S.FAILED_PRECONDITION),
        (errors.BackendUnavailableError, S.UNAVAILABLE),
        (StoreFullError, S.RESOURCE_EXHAUSTED),
        (CancelledWorkError, S.CANCELLED),
        (DeadlinePassedError, S.DEADLINE_EXCEEDED),
    ],
)
def test_status_for(error: type[errors.Error], code: grpc.StatusCode) -> None:
    instance = error("f", "a", "b") if error is errors.DigestMismatchError else error("x")
    assert status_for(instance) == code


def test_clip() -> None:
    assert clip("short") == "short"
    assert clip("x" * 5000) == "x" * 1024 + "… (3976 more characters)"
