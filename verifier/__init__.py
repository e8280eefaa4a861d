"""Verify models against signed bundles and a policy, and load them only after verification.

`verify_model` checks a directory or shard; `load_model` / `open_model` return tensors built from the
verified bytes (torch is imported only when tensors are built; this package imports neither torch nor grpc).
"""

from __future__ import annotations

from modelsec.verifier.attestations import (
    AttestationVerdict,
    Evidence,
    find_attestation_bundles,
    verify_attestations,
)
from modelsec.verifier.loader import (
    LoadedModel,
    VerifiedSafeOpen,
    load_model,
    load_signed_model,
    open_model,
    resolve_policy,
)
from modelsec.verifier.trust.bundles import read_bundle, verify_bundle_signature
from modelsec.verifier.verification import (
    SignedModel,
    VerifiedBundle,
    VerifiedModel,
    check_digests,
    check_file_set,
    verify_model,
    verify_signatures,
)

__all__ = [
    "AttestationVerdict",
    "Evidence",
    "LoadedModel",
    "SignedModel",
    "VerifiedBundle",
    "VerifiedModel",
    "VerifiedSafeOpen",
    "check_digests",
    "check_file_set",
    "find_attestation_bundles",
    "load_model",
    "load_signed_model",
    "open_model",
    "read_bundle",
    "resolve_policy",
    "verify_attestations",
    "verify_bundle_signature",
    "verify_model",
    "verify_signatures",
]
