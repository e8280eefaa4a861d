"""Names of the signature and hash algorithms modelsec speaks (no cryptography here).

What each signature scheme does (its keys, the manifest it signs, its default bundle name) lives in its
module under `modelsec.signer.schemes`; ask `modelsec.signer.schemes.scheme_for(algorithm)`.
"""

from __future__ import annotations

import enum

__all__ = ["HashAlgorithm", "SignatureAlgorithm"]


class SignatureAlgorithm(enum.StrEnum):
    """A signature scheme with its fixed hash (the CLI and policy spelling is the value)."""

    ECDSA_P256 = "ecdsa-p256"  # ECDSA over NIST P-256 with SHA-256 (FIPS 186-5), the OMS interop profile
    ECDSA_P384 = "ecdsa-p384"  # ECDSA over NIST P-384 with SHA-384
    SM2 = "sm2"  # SM2 signature with SM3 (GB/T 32918.2-2016), distinguishing ID 1234567812345678
    ML_DSA_44 = "ml-dsa-44"  # pure ML-DSA (FIPS 204), empty context, over the DSSE PAE
    ML_DSA_65 = "ml-dsa-65"
    ML_DSA_87 = "ml-dsa-87"


class HashAlgorithm(enum.StrEnum):
    """A digest algorithm of manifests and per-tensor digests (OMS `hash_type` spelling)."""

    SHA256 = "sha256"
    SM3 = "sm3"
    BLAKE3 = "blake3"
