"""`modelsec.v1.AttestationService`: the attestation store that webhooks and loaders query by digest.

`PutAttestation` verifies before it stores: the bundle must parse strictly, be signed by a key of the
default policy holding the role for its predicate type, be about a sha256 model root digest, and meet the
policy's requirements for its kind (a FAILED gate, a stale one or a weak watermark is refused, not stored:
the store holds only acceptable evidence). Readers verify again whatever they read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.statement import parse_statement
from modelsec.errors import AttestationError, MalformedArtifactError
from modelsec.service.convert import record_to_proto
from modelsec.service.state import ServiceState
from modelsec.service.verification import check_root_digest
from modelsec.v1 import attestation_pb2, attestation_pb2_grpc
from modelsec.verifier.attestations import verify_attestations

__all__ = ["AttestationServicer"]

_MAX_PAGE = 1000


class AttestationServicer(attestation_pb2_grpc.AttestationServiceServicer):
    """PutAttestation, GetAttestations, ListAttestations over the SQLite store in the data directory."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def PutAttestation(
        self, request: attestation_pb2.PutAttestationRequest, context: aio.ServicerContext[Any, Any]
    ) -> attestation_pb2.PutAttestationResponse:
        """Verify the bundle against the default policy, then store it under its subject digest."""
        identity = self.state.require("putAttestation")
        policy = self.state.default_policy
        if len(request.bundle) > policy.limits.max_bundle_bytes:
            raise MalformedArtifactError(f"bundle larger than {policy.limits.max_bundle_bytes} bytes")
        bundle = parse_bundle(request.bundle, source="bundle")
        statement = parse_statement(bundle.envelope.payload, what="bundle")
        digest = statement.subjects[0].digest.get("sha256", "")
        if not digest:
            raise MalformedArtifactError("bundle: the statement's subject has no sha256 model root digest")
        check_root_digest(digest)
        verdict = verify_attestations(digest, [request.bundle], policy, require_signatures=False)
        if verdict.refused or verdict.ignored or not verdict.evidence:
            reasons = [f"refused {r}" for r in verdict.refused] + [
                f"not trusted: {i}" for i in verdict.ignored
            ]
            raise AttestationError(
                f"bundle not stored under policy {policy.name!r}: " + ("; ".join(reasons) or "no evidence")
            )
        evidence = verdict.evidence[0]
        key = next(k for k in policy.keys if k.name == evidence.key)
        record, created = self.state.store.put(
            request.bundle,
            root_digest=digest,
            predicate_type=statement.predicate_type,
            signer=evidence.key,
            algorithm=key.algorithm.value,
            stored_by=identity,
        )
        return attestation_pb2.PutAttestationResponse(attestation=record_to_proto(record), created=created)

    async def GetAttestations(
        self, request: attestation_pb2.GetAttestationsRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[attestation_pb2.GetAttestationsResponse]:
        """Stream every stored bundle about the digest, one per message (each below the message limit)."""
        self.state.require("readAttestations")
        digest = check_root_digest(request.root_digest)
        for record, bundle in self.state.store.records(digest):
            yield attestation_pb2.GetAttestationsResponse(attestation=record_to_proto(record), bundle=bundle)

    async def ListAttestations(
        self, request: attestation_pb2.ListAttestationsRequest, context: aio.ServicerContext[Any, Any]
    ) -> attestation_pb2.ListAttestationsResponse:
        """A page of stored records, newest first."""
        self.state.require("readAttestations")
        if request.root_digest:
            check_root_digest(request.root_digest)
        if not 0 <= request.page_size <= _MAX_PAGE:
            raise MalformedArtifactError(f"page_size must be in [0, {_MAX_PAGE}], got {request.page_size}")
        records, token = self.state.store.page(
            root_digest=request.root_digest, page_size=request.page_size or 100, page_token=request.page_token
        )
        return attestation_pb2.ListAttestationsResponse(
            attestations=[record_to_proto(r) for r in records], next_page_token=token
        )
