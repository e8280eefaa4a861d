"""The public API of each package: its sorted `__all__` equals the committed list (issue 19's surface test).

A package's `__all__` holds its verbs, result types and errors, not every helper. A change here is an API
change: update the list in the same commit, and say so in the changelog. Each name must also resolve, so an
`__all__` entry cannot outlive what it names. Packages whose extras are missing are skipped with the reason.
"""

from __future__ import annotations

import importlib

import pytest

SURFACE: dict[str, list[str]] = {
    "modelsec": ["Policy", "PolicySet", "__version__"],
    "modelsec.errors": [
        "AttestationError",
        "AuthenticationError",
        "BackendUnavailableError",
        "BundleExistsError",
        "DigestMismatchError",
        "Error",
        "FileSetMismatchError",
        "GateFailedError",
        "InvalidReferenceError",
        "KeyMaterialError",
        "MalformedArtifactError",
        "ModelMovedError",
        "NotFoundError",
        "PermissionDeniedError",
        "PickleContentError",
        "PolicyError",
        "PolicyViolationError",
        "ReceiptError",
        "RegistryUnreachableError",
        "ServerUnreachableError",
        "SignatureError",
        "UnsupportedAlgorithmError",
        "UntrustedSignerError",
        "VerificationError",
    ],
    "modelsec.attestations": [
        "BUNDLE_MEDIA_TYPE",
        "Bundle",
        "Envelope",
        "EnvelopeSignature",
        "PAYLOAD_TYPE_IN_TOTO",
        "STATEMENT_TYPE",
        "Statement",
        "StatementSigner",
        "Subject",
        "bundle_to_json",
        "key_hint",
        "pae",
        "parse_bundle",
        "parse_statement",
        "serialize_statement",
        "sign_payload",
        "sign_statement",
    ],
    "modelsec.modelformat": [],
    "modelsec.modelformat.safetensors_header": [
        "DTYPE_BITS",
        "SafetensorsHeader",
        "TensorInfo",
        "parse_header",
        "parse_header_length",
        "read_header",
    ],
    "modelsec.signer": [
        "ATTESTATION_FILE_NAMES",
        "BundleSigner",
        "KeyBackend",
        "KeySource",
        "MODEL_IGNORE_PATHS",
        "SIGNATURE_FILE_NAMES",
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
    ],
    "modelsec.verifier": [
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
    ],
    "modelsec.watermark": [
        "ArraySource",
        "AttentionLayout",
        "DetectionResult",
        "DetectionThresholds",
        "DirectorySource",
        "EmbedResult",
        "NeuronGroup",
        "PREDICATE_TYPE",
        "ResyncReport",
        "SCHEME",
        "TensorRef",
        "TensorReport",
        "TensorSource",
        "WatermarkAttestation",
        "WatermarkKey",
        "WatermarkParams",
        "binomial_tail",
        "detect",
        "embed_fixed",
        "embed_model",
        "generate_key_file_text",
        "infer_groups",
        "load_key_file",
        "model_root_digests",
        "normal_tail",
        "parse_key",
        "parse_message",
        "rademacher_tail_bound",
        "resynchronise",
        "sign_watermark_attestation",
        "verify_watermark_attestation",
        "watermark_statement",
        "write_watermark_attestation",
    ],
    "modelsec.robustness": [
        "Accuracy",
        "Dataset",
        "DistContext",
        "FastPaths",
        "GateConfig",
        "GateOutcome",
        "GateProgress",
        "GateResult",
        "PREDICATE_TYPE",
        "SanityCheck",
        "SanityConfig",
        "VerifiedClassifier",
        "batch_seed",
        "dataset_from_tensors",
        "fgsm_attack",
        "from_environment",
        "gate_statement",
        "load_dataset",
        "load_verified_model",
        "pgd_attack",
        "run_gate",
        "run_pgd_gate",
        "sign_gate_result",
        "wilson_interval",
        "write_attestation",
    ],
    "modelsec.service": [],
    "modelsec.webhook": [
        "ANNOTATION",
        "AdmissionRequest",
        "AttestationStore",
        "BadRequestError",
        "DeadlineExceededError",
        "Decision",
        "DirectoryStore",
        "Mode",
        "ModelReference",
        "ReferenceResult",
        "Reviewer",
        "WebhookConfig",
        "parse_reference",
    ],
}


def _import(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and not e.name.startswith("modelsec"):
            pytest.skip(f"{name} needs {e.name}, which is not installed")
        raise


@pytest.mark.parametrize("package", sorted(SURFACE))
def test_public_surface_is_the_committed_list(package: str) -> None:
    module = _import(package)
    exported = sorted(module.__all__)  # type: ignore[attr-defined]
    expected = SURFACE[package]
    assert exported == expected
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == []
