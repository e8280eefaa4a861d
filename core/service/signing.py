"""`modelsec.v1.SigningService`: sign in-toto statements with server-held keys (KMS style).

The private key never leaves the server. A statement is parsed strictly (in-toto Statement v1; an OMS weights
manifest is also checked against the limits) and its predicate type decides the role the key must hold
(`weights`, `watermark`, `gate`): a key configured for gate attestations cannot be made to sign a weights
manifest, and a predicate type that is not registered is signed only by a key whose `predicateTypes` names it
(`modelsec.service.config`; the predicate is then signed as it is, uninterpreted). The key must be configured
for the `signStatement` operation, and a key that signs the gate results (watermark records) of runs this
server performs itself never signs a client-made gate (watermark) statement; nor is any gate or watermark
statement carrying `runBy` signed here (only RunGate and EmbedWatermark record it), so a `runBy` under a
server-held key means this server ran the gate or the embed (`modelsec.attestations.predicates.run_by`). The
numbers of a gate or watermark predicate must lie in their fields' ranges
(`modelsec.attestations.predicates`). Each signature is recorded on the audit logger
`modelsec.service.audit` (`ServiceState.record_signature`: caller, key, subject digests, predicate type,
time).
The statement bytes are signed as received (`sign_payload`, the same
DSSE/bundle code as local signing), so remote and local bundles verify identically.
"""

from __future__ import annotations

from typing import Any

from grpc import aio

from modelsec.attestations.bundle import sign_payload
from modelsec.attestations.predicates import PREDICATE_KINDS, check_predicate_numbers
from modelsec.attestations.predicates.oms import Manifest
from modelsec.attestations.predicates.run_by import RUN_BY_FIELD
from modelsec.attestations.statement import parse_statement
from modelsec.errors import MalformedArtifactError, PermissionDeniedError
from modelsec.limits import Limits
from modelsec.service.convert import key_to_proto
from modelsec.service.state import ServiceState
from modelsec.signer.schemes import scheme_for
from modelsec.v1 import signing_pb2, signing_pb2_grpc

__all__ = ["SigningServicer"]

_MAX_STATEMENT_BYTES = 1 << 20


class SigningServicer(signing_pb2_grpc.SigningServiceServicer):
    """SignStatement, GetPublicKey, ListKeys over the keys in the server configuration."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self.limits = Limits()

    async def SignStatement(
        self, request: signing_pb2.SignStatementRequest, context: aio.ServicerContext[Any, Any]
    ) -> signing_pb2.SignStatementResponse:
        """Sign one statement; see the module docstring for what is checked first."""
        self.state.signing_key(request.key_version)  # unknown or not allowed: say so before parsing
        if len(request.statement) > _MAX_STATEMENT_BYTES:
            raise MalformedArtifactError(f"statement larger than {_MAX_STATEMENT_BYTES} bytes")
        statement = parse_statement(request.statement, what="SignStatement")
        key = self.state.signing_key_for(request.key_version, statement.predicate_type, "signStatement")
        check_predicate_numbers(statement, what="SignStatement")  # never sign numbers no verifier can read
        kind = PREDICATE_KINDS.get(statement.predicate_type)  # None: a type the key's predicateTypes names
        if kind is not None and kind.records_run and RUN_BY_FIELD in statement.predicate:
            raise PermissionDeniedError(
                f"SignStatement does not sign a statement claiming a server run ({RUN_BY_FIELD}); only "
                "RunGate and EmbedWatermark record the runs this server performs"
            )
        if kind is not None and kind.role == "weights" and kind.about == "model":
            manifest: Manifest = kind.parse(statement, what="SignStatement", limits=self.limits)
            scheme = scheme_for(key.backend.algorithm)
            if manifest.hash_type not in scheme.signable_hashes:
                raise MalformedArtifactError(
                    f"a {key.backend.algorithm.value} key signs "
                    f"{' or '.join(sorted(h.value for h in scheme.signable_hashes))} "
                    f"manifests; this one is {manifest.hash_type.value}"
                )
        # The exact bytes received are signed (they parsed strictly above; a verifier parses them again):
        # no second serialisation, and `modelsec sign --server` sends the canonical form, so its bundles
        # carry the same payload as local signing.
        bundle = sign_payload(request.statement, key.backend)
        self.state.record_signature(key, statement, "SignStatement")
        return signing_pb2.SignStatementResponse(bundle=bundle, key=key_to_proto(key))

    async def GetPublicKey(
        self, request: signing_pb2.GetPublicKeyRequest, context: aio.ServicerContext[Any, Any]
    ) -> signing_pb2.GetPublicKeyResponse:
        """The public key of a key version the caller may use."""
        key = self.state.signing_key(request.key_version)
        return signing_pb2.GetPublicKeyResponse(key=key_to_proto(key), public_key_pem=key.public_key_pem)

    async def ListKeys(
        self, request: signing_pb2.ListKeysRequest, context: aio.ServicerContext[Any, Any]
    ) -> signing_pb2.ListKeysResponse:
        """The key versions the caller may use."""
        self.state.require("listKeys")
        return signing_pb2.ListKeysResponse(keys=[key_to_proto(k) for k in self.state.visible_keys()])
