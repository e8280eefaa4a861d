"""Verify models against signed bundles and a policy (imports neither torch nor grpc)."""

from __future__ import annotations

from modelsec.verifier.verification import (
    VerifiedBundle,
    VerifiedModel,
    find_default_bundles,
    read_bundle,
    verify_bundle_signature,
    verify_model,
)

__all__ = [
    "VerifiedBundle",
    "VerifiedModel",
    "find_default_bundles",
    "read_bundle",
    "verify_bundle_signature",
    "verify_model",
]
