"""`modelsec.v1.AttestationService`: the attestation store that webhooks and loaders query by digest.

`PutAttestation` verifies before it stores: the bundle must parse strictly, be signed by a key of the
default policy holding the role for its predicate type, be about exactly one sha256 model root digest, and
meet the policy's requirements for its kind, or at least the baseline ones where the policy has none (a
FAILED gate, a malformed predicate or an undetected watermark is refused, not stored: the store holds only
acceptable evidence). Bundles are stored in canonical form and identified by the signed statement and the
verifying key, so re-formatted copies of one bundle cannot fill a model's slots. Readers verify again
whatever they read.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from modelsec.attestations.bundle import bundle_to_json, parse_bundle
from modelsec.attestations.dsse import Envelope, EnvelopeSignature
from modelsec.attestations.statement import parse_statement
from modelsec.errors import AttestationError, Error, MalformedArtifactError
from modelsec.policy import RobustnessRequirement, WatermarkRequirement
from modelsec.service.convert import record_to_proto
from modelsec.service.state import ServiceState
from modelsec.service.store import StoredRecord
from modelsec.service.verification import check_root_digest
from modelsec.v1 import attestation_pb2, attestation_pb2_grpc
from modelsec.verifier.attestations import role_for_predicate, verify_attestations
from modelsec.verifier.bundles import verify_bundle_signature

__all__ = ["AttestationServicer", "admit_attestation", "store_produced", "storer_for"]

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
        record, created = admit_attestation(self.state, request.bundle, identity)
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


def admit_attestation(state: ServiceState, data: bytes, identity: str) -> tuple[StoredRecord, bool]:
    """Verify a bundle for the store (see the module docstring) and store it; returns (record, created).

    Used by PutAttestation and by the gate and watermark RPCs that store the attestation they sign.

    Raises:
        MalformedArtifactError: Too large, malformed, not exactly one sha256 subject.
        AttestationError: Not trusted under the default policy, or refused by its (baseline) requirements.
        StoreFullError: The model's slots are full.
        BackendUnavailableError: The store cannot be written.
    """
    policy = state.default_policy
    if len(data) > policy.limits.max_bundle_bytes:
        raise MalformedArtifactError(f"bundle larger than {policy.limits.max_bundle_bytes} bytes")
    bundle = parse_bundle(data, source="bundle")
    statement = parse_statement(bundle.envelope.payload, what="bundle")
    if len(statement.subjects) != 1:
        raise MalformedArtifactError(
            f"bundle: a stored attestation has exactly one subject, this one {len(statement.subjects)}"
        )
    digest = check_root_digest(statement.subjects[0].digest.get("sha256", ""))
    # Admission is stricter than the default policy: a gate or watermark statement must pass at least the
    # baseline requirements (PASSED gate, detected watermark, well-formed predicate) even where the policy
    # requires none, so the store never holds evidence that would veto a model for a reader whose policy
    # does require it.
    admission = dataclasses.replace(
        policy,
        robustness=policy.robustness or RobustnessRequirement(),
        watermark=policy.watermark or WatermarkRequirement(),
    )
    verdict = verify_attestations(digest, [data], admission, require_signatures=False)
    if verdict.refused or verdict.ignored or not verdict.evidence:
        reasons = [f"refused {r}" for r in verdict.refused] + [f"not trusted: {i}" for i in verdict.ignored]
        raise AttestationError(
            f"bundle not stored under policy {policy.name!r}: " + ("; ".join(reasons) or "no evidence")
        )
    key = verify_bundle_signature(bundle, policy.keys, role=role_for_predicate(statement.predicate_type))
    # Stored in canonical form, identified by what is signed (payload type, payload) and by which key:
    # unsigned formatting, hints or a re-encoded signature of the same statement are the same record.
    envelope = bundle.envelope
    canonical = bundle_to_json(
        Envelope(
            envelope.payload, envelope.payload_type, (EnvelopeSignature(bundle.signature.sig, key.keyid),)
        ),
        hint=key.keyid,
    )
    record_id = hashlib.sha256(envelope.pae() + b"\x00" + key.keyid.encode()).hexdigest()
    return state.store.put(
        canonical,
        record_id=record_id,
        root_digest=digest,
        predicate_type=statement.predicate_type,
        signer=key.name,
        algorithm=key.algorithm.value,
        stored_by=identity,
    )


def storer_for(state: ServiceState, wanted: bool, key_version: str) -> str | None:
    """Who will store an attestation an RPC produces, checked before any work; None when not asked.

    Raises:
        MalformedArtifactError: Storing is asked without an attestation key version.
        PermissionDeniedError: The caller may not put attestations.
    """
    if not wanted:
        return None
    if not key_version:
        raise MalformedArtifactError("store_attestation needs attestation_key_version")
    return state.require("putAttestation")


def store_produced(state: ServiceState, bundle: bytes, identity: str) -> tuple[str, str]:
    """Store an attestation the service just signed: (record id, "") or ("", why it was not stored).

    The work that produced it stands whatever happens here (a FAILED gate is a result, and is not stored),
    so a refusal is reported in the response rather than raised.
    """
    try:
        record, _ = admit_attestation(state, bundle, identity)
    except Error as e:
        return "", e.diagnostics()
    return record.id, ""
