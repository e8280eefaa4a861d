"""Conversions between modelsec's Python types and the modelsec.v1 messages (no logic, no trust)."""

from __future__ import annotations

from modelsec.algorithms import SignatureAlgorithm
from modelsec.service.state import LoadedKey
from modelsec.service.store import StoredRecord
from modelsec.v1 import attestation_pb2, common_pb2, signing_pb2
from modelsec.verifier.attestations import AttestationVerdict

__all__ = [
    "algorithm_from_proto",
    "algorithm_to_proto",
    "key_to_proto",
    "record_to_proto",
    "verdict_to_proto",
]

_ALGORITHMS = {
    SignatureAlgorithm.ECDSA_P256: common_pb2.SIGNATURE_ALGORITHM_ECDSA_P256,
    SignatureAlgorithm.ECDSA_P384: common_pb2.SIGNATURE_ALGORITHM_ECDSA_P384,
    SignatureAlgorithm.SM2: common_pb2.SIGNATURE_ALGORITHM_SM2,
    SignatureAlgorithm.ML_DSA_44: common_pb2.SIGNATURE_ALGORITHM_ML_DSA_44,
    SignatureAlgorithm.ML_DSA_65: common_pb2.SIGNATURE_ALGORITHM_ML_DSA_65,
    SignatureAlgorithm.ML_DSA_87: common_pb2.SIGNATURE_ALGORITHM_ML_DSA_87,
}
_FROM_PROTO = {v: k for k, v in _ALGORITHMS.items()}


def algorithm_to_proto(algorithm: SignatureAlgorithm | str) -> common_pb2.SignatureAlgorithm.ValueType:
    """`SignatureAlgorithm` (or its value) -> the proto enum."""
    return _ALGORITHMS[SignatureAlgorithm(algorithm)]


def algorithm_from_proto(value: int) -> SignatureAlgorithm | None:
    """The proto enum -> `SignatureAlgorithm` (None for UNSPECIFIED or an unknown number)."""
    for proto_value, algorithm in _FROM_PROTO.items():
        if proto_value == value:
            return algorithm
    return None


def key_to_proto(key: LoadedKey) -> signing_pb2.KeyVersion:
    """A loaded key version -> `KeyVersion`."""
    return signing_pb2.KeyVersion(
        name=key.config.key_version,
        algorithm=algorithm_to_proto(key.backend.algorithm),
        keyid=key.keyid,
        roles=sorted(key.config.roles),
    )


def verdict_to_proto(verdict: AttestationVerdict) -> common_pb2.AttestationVerdict:
    """`AttestationVerdict` -> its message."""
    return common_pb2.AttestationVerdict(
        ok=verdict.ok,
        root_digest=verdict.root_digest,
        satisfied=verdict.satisfied,
        missing=verdict.missing,
        refused=verdict.refused,
        ignored=verdict.ignored,
        evidence=[
            common_pb2.Evidence(kind=e.kind, source=e.source, key=e.key, detail=e.detail)
            for e in verdict.evidence
        ],
    )


def record_to_proto(record: StoredRecord) -> attestation_pb2.StoredAttestation:
    """A store record -> `StoredAttestation`."""
    algorithm = SignatureAlgorithm(record.algorithm) if record.algorithm else None
    return attestation_pb2.StoredAttestation(
        id=record.id,
        root_digest=record.root_digest,
        predicate_type=record.predicate_type,
        signer=record.signer,
        algorithm=algorithm_to_proto(algorithm) if algorithm else common_pb2.SIGNATURE_ALGORITHM_UNSPECIFIED,
        stored_at=record.stored_at,
        stored_by=record.stored_by,
    )
