"""`modelsec.v1.VerificationService`: bundle verdicts without weights, and whole-directory verification.

An untrusted artifact is a normal answer (`ok = false` with the reasons), never an RPC error; RPC errors
are for bad requests (INVALID_ARGUMENT), callers without access (PERMISSION_DENIED) and server trouble.
"""

from __future__ import annotations

import os
import time
from typing import Any

from grpc import aio

from modelsec.attestations.statement import is_sha256_hex
from modelsec.errors import BackendUnavailableError, Error, MalformedArtifactError
from modelsec.service.convert import algorithm_to_proto, verdict_to_proto
from modelsec.service.state import ServerPath, ServiceState
from modelsec.service.work import run_blocking
from modelsec.v1 import verification_pb2, verification_pb2_grpc
from modelsec.verifier import verify_attestations, verify_model
from modelsec.verifier.admission import admit_model

__all__ = ["MAX_BUNDLES_PER_REQUEST", "VerificationServicer", "check_root_digest"]

MAX_BUNDLES_PER_REQUEST = 64


def check_root_digest(value: str) -> str:
    """Return `value` if it is a model root digest (64 lowercase hex digits).

    Raises:
        MalformedArtifactError: It is not.
    """
    if not is_sha256_hex(value):
        raise MalformedArtifactError(
            f"root_digest must be 64 lowercase hex digits (SHA-256), got {value[:80]!r}"
        )
    return value


class VerificationServicer(verification_pb2_grpc.VerificationServiceServicer):
    """VerifyBundle and VerifyModel under the server's policies."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def VerifyBundle(
        self, request: verification_pb2.VerifyBundleRequest, context: aio.ServicerContext[Any, Any]
    ) -> verification_pb2.VerifyBundleResponse:
        """Check the bundles against the named (or default) policy; the verdict says whether they pass.

        `verdict.ok` holds only when every bundle sent is trusted evidence about `root_digest` (signed by
        a policy key holding the role for its predicate type), the policy's requirements are met, nothing
        was refused, and at least one bundle verified.
        """
        self.state.require("verify")
        digest = check_root_digest(request.root_digest)
        if not request.bundles:
            raise MalformedArtifactError("bundles is empty")
        if len(request.bundles) > MAX_BUNDLES_PER_REQUEST:
            raise MalformedArtifactError(f"more than {MAX_BUNDLES_PER_REQUEST} bundles in one request")
        policy = self.state.policy(request.policy)
        started = time.perf_counter()
        # The caller vouches for every bundle it sends (unlike a shared store, where a stranger's bundle is
        # only ignored): every_bundle_counts.
        verdict = verify_attestations(
            digest,
            list(request.bundles),
            policy,
            require_signatures=request.require_signatures,
            every_bundle_counts=True,
        )
        reason = (
            "verified"
            if verdict.ok
            else "refused"
            if verdict.refused
            else "missing"
            if verdict.missing
            else "ignored"
        )
        self.state.observe_decision(
            "VerifyBundle",
            policy.name,
            "allow" if verdict.ok else "deny",
            reason,
            time.perf_counter() - started,
        )
        return verification_pb2.VerifyBundleResponse(verdict=verdict_to_proto(verdict), policy=policy.name)

    async def VerifyModel(
        self, request: verification_pb2.VerifyModelRequest, context: aio.ServicerContext[Any, Any]
    ) -> verification_pb2.VerifyModelResponse:
        """Verify a directory under the read roots with the policy matching it (`file://<real path>`).

        The path is placed under a read root by its spelling, then opened once beneath the root's
        descriptor with no link followed (a link anywhere below the root is a `PolicyViolationError`
        verdict); everything read afterwards goes through the descriptor.
        """
        self.state.require("verifyModel")
        path = self.state.readable_path(request.path, "path")
        return await run_blocking(lambda check: _verify(self.state, path, lambda _n: check()), context)


def _verify(state: ServiceState, where: ServerPath, progress: Any) -> verification_pb2.VerifyModelResponse:
    # The path is opened once, beneath the read root's descriptor and without following links; the
    # verifier reads bundles, walks and hashes through the descriptor of the directory found there.
    name = ""
    path = where.path
    started = time.perf_counter()
    try:
        admission = admit_model(path, state.policies)
        name = ", ".join(p.name for p in admission.policies)
        parent_fd = where.open_parent()
        try:
            verified = verify_model(path, admission, progress=progress, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
    except BackendUnavailableError:
        raise  # the server cannot verify now (or the call is gone): an RPC error, not a verdict
    except Error as e:
        state.observe_decision("VerifyModel", name, "deny", type(e).__name__, time.perf_counter() - started)
        return verification_pb2.VerifyModelResponse(
            ok=False, error=e.diagnostics(), error_kind=type(e).__name__, policy=name
        )
    state.observe_decision("VerifyModel", name, "allow", "verified", time.perf_counter() - started)
    return verification_pb2.VerifyModelResponse(
        ok=True,
        root_digest=verified.root_digest,
        algorithms=[algorithm_to_proto(a) for a in verified.algorithms],
        files=verified.files,
        tensors=verified.tensors,
        policy=name,
    )
