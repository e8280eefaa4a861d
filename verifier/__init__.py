"""Verify models against signed bundles and a policy, and load them only after verification.

`verify_model` checks a directory or shard; `load_model` / `open_model` return tensors built from the
verified bytes (torch is imported only when tensors are built; this package imports neither torch nor grpc).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# The public names load their modules on first use (PEP 562): `import modelsec.verifier`, which the runtime
# guard's start-up hook and every front door pay for, then costs no more than this file.
_HOMES = {
    "AttestationVerdict": "modelsec.verifier.attestations",
    "Evidence": "modelsec.verifier.attestations",
    "LoadedModel": "modelsec.verifier.loader",
    "SignedModel": "modelsec.verifier.verification",
    "VerifiedBundle": "modelsec.verifier.verification",
    "VerifiedModel": "modelsec.verifier.verification",
    "VerifiedSafeOpen": "modelsec.verifier.loader",
    "check_digests": "modelsec.verifier.verification",
    "check_file_set": "modelsec.verifier.verification",
    "find_attestation_bundles": "modelsec.verifier.attestations",
    "load_model": "modelsec.verifier.loader",
    "load_signed_model": "modelsec.verifier.loader",
    "open_model": "modelsec.verifier.loader",
    "read_bundle": "modelsec.verifier.trust.bundles",
    "resolve_policy": "modelsec.verifier.loader",
    "verify_attestations": "modelsec.verifier.attestations",
    "verify_bundle_signature": "modelsec.verifier.trust.bundles",
    "verify_model": "modelsec.verifier.verification",
    "verify_signatures": "modelsec.verifier.verification",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
