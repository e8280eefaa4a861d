"""Hash and sign sharded safetensors models (ECDSA P-256/P-384 and SM2 with SM3).

Public verbs: `sign_model`, `compute_manifests`, `key_source`, `load_private_key_file`,
`generate_private_key_pem`; signature schemes: `modelsec.signer.schemes` (the registry);
the model-format kernel is `modelsec.modelformat`, the OMS predicate `modelsec.attestations.predicates.oms`.
Heavy modules (SM2 backends) load lazily, and the names here load their modules on first use (PEP 562):
`modelsec.signer.keys`, which the verifier imports, then costs no more than itself (no signing pipeline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelsec.lazy import lazy_exports

if TYPE_CHECKING:
    from modelsec.signer.keys import (
        KeyBackend,
        KeySource,
        TrustedKey,
        generate_private_key_pem,
        key_source,
        load_private_key,
        load_private_key_file,
        load_trusted_key,
        load_trusted_key_file,
    )
    from modelsec.signer.layout import ATTESTATION_FILE_NAMES, MODEL_IGNORE_PATHS, SIGNATURE_FILE_NAMES
    from modelsec.signer.signing import (
        BundleSigner,
        SignedBundle,
        SigningResult,
        compute_manifests,
        sign_model,
    )

__all__ = [
    "ATTESTATION_FILE_NAMES",
    "MODEL_IGNORE_PATHS",
    "SIGNATURE_FILE_NAMES",
    "BundleSigner",
    "KeyBackend",
    "KeySource",
    "SignedBundle",
    "SigningResult",
    "TrustedKey",
    "compute_manifests",
    "generate_private_key_pem",
    "key_source",
    "load_private_key",
    "load_private_key_file",
    "load_trusted_key",
    "load_trusted_key_file",
    "sign_model",
]

_HOMES = {
    "KeyBackend": "keys",
    "KeySource": "keys",
    "TrustedKey": "keys",
    "generate_private_key_pem": "keys",
    "key_source": "keys",
    "load_private_key": "keys",
    "load_private_key_file": "keys",
    "load_trusted_key": "keys",
    "load_trusted_key_file": "keys",
    "ATTESTATION_FILE_NAMES": "layout",
    "MODEL_IGNORE_PATHS": "layout",
    "SIGNATURE_FILE_NAMES": "layout",
    "BundleSigner": "signing",
    "SignedBundle": "signing",
    "SigningResult": "signing",
    "compute_manifests": "signing",
    "sign_model": "signing",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals(), __all__)
