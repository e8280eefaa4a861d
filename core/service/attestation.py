"""`modelsec.v1.AttestationService`: the attestation store that webhooks and loaders query by digest.

`PutAttestation` verifies before it stores, with `modelsec.verifier.admit_to_store` under the default
policy: the bundle must parse strictly, be signed by a key holding the role for its predicate type, be
about exactly one sha256 model root digest, and meet the policy's requirements for its kind, or at least
the baseline ones where the policy has none (a FAILED gate, a malformed predicate or an undetected
watermark is refused, not stored: the store holds only acceptable evidence). Bundles are stored in
canonical form and identified by the signed statement and the verifying key, so re-formatted copies of one
bundle cannot fill a model's slots. Readers verify again whatever they read.

`SupersedeAttestation` (permission `supersedeAttestation`) withdraws a record from readers and keeps it;
`DeleteAttestation` (permission `deleteAttestation`) removes it. Both default to nobody: an operator grants
them to whoever may retire stale or mistaken evidence.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from modelsec.attestations.bundle import bundle_to_json
from modelsec.attestations.dsse import Envelope, EnvelopeSignature
from modelsec.attestations.statement import is_sha256_hex
from modelsec.errors import AttestationError, Error, MalformedArtifactError
from modelsec.service.convert import record_to_proto
from modelsec.service.state import ServiceState
from modelsec.service.verification import check_root_digest
from modelsec.v1 import attestation_pb2, attestation_pb2_grpc
from modelsec.verifier.attestations import admit_to_store
from modelsec.verifier.stores.records import StoredRecord

__all__ = ["AttestationServicer", "admit_attestation", "store_produced", "storer_for"]

_MAX_PAGE = 1000


class AttestationServicer(attestation_pb2_grpc.AttestationServiceServicer):
    """Put, Get, List, Delete and SupersedeAttestation over the record store (SQLite or PostgreSQL)."""

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

    async def DeleteAttestation(
        self, request: attestation_pb2.DeleteAttestationRequest, context: aio.ServicerContext[Any, Any]
    ) -> attestation_pb2.DeleteAttestationResponse:
        """Remove a stored record (current or superseded) for good; needs `deleteAttestation`."""
        self.state.require("deleteAttestation")
        self.state.store.delete(*_record_key(request.root_digest, request.id))
        return attestation_pb2.DeleteAttestationResponse()

    async def SupersedeAttestation(
        self, request: attestation_pb2.SupersedeAttestationRequest, context: aio.ServicerContext[Any, Any]
    ) -> attestation_pb2.SupersedeAttestationResponse:
        """Withdraw a current record from what readers get, keeping it; needs `supersedeAttestation`."""
        self.state.require("supersedeAttestation")
        self.state.store.supersede(*_record_key(request.root_digest, request.id))
        return attestation_pb2.SupersedeAttestationResponse()


def _record_key(root_digest: str, record_id: str) -> tuple[str, str]:
    """(digest, id) of a Delete/Supersede request, both checked as 64 lowercase hex.

    Raises:
        MalformedArtifactError: Either is not 64 lowercase hex digits.
    """
    digest = check_root_digest(root_digest)
    if not is_sha256_hex(record_id):
        raise MalformedArtifactError(f"record id {record_id[:80]!r} is not 64 lowercase hex digits")
    return digest, record_id


def admit_attestation(state: ServiceState, data: bytes, identity: str) -> tuple[StoredRecord, bool]:
    """Admit a bundle (`modelsec.verifier.admit_to_store` under the default policy) and store it.

    Used by PutAttestation and by the gate and watermark RPCs that store the attestation they sign.
    Returns the record and whether it was new.

    Raises:
        MalformedArtifactError: Too large, malformed, not exactly one sha256 subject.
        AttestationError: Not trusted under the default policy, or refused by its (baseline) requirements.
        StoreFullError: The model's slots are full.
        BackendUnavailableError: The store cannot be written.
    """
    policy = state.default_policy
    try:
        admitted = admit_to_store(data, policy)
    except AttestationError as e:
        raise e.add_context(f"bundle not stored under policy {policy.name!r}") from None
    # Stored in canonical form, identified by what is signed (payload type, payload) and by which key:
    # unsigned formatting, hints or a re-encoded signature of the same statement are the same record.
    envelope, keyid = admitted.bundle.envelope, admitted.evidence.keyid
    canonical = bundle_to_json(
        Envelope(
            envelope.payload,
            envelope.payload_type,
            (EnvelopeSignature(admitted.bundle.signature.sig, keyid),),
        ),
        hint=keyid,
    )
    return state.store.put_record(
        canonical,
        record_id=hashlib.sha256(envelope.pae() + b"\x00" + keyid.encode()).hexdigest(),
        root_digest=admitted.root_digest,
        predicate_type=admitted.statement.predicate_type,
        signer=admitted.evidence.key,
        algorithm=admitted.evidence.algorithm,
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
