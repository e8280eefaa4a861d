"""Keyed parameter watermark for safetensors models: embed, extract/detect, re-synchronise, attest.

Public API (imported lazily, so `import modelsec.watermark` loads neither numpy nor torch):

* `load_key_file`, `parse_key`, `generate_key_file_text`, `WatermarkKey`: the secret key (32 to 64 random
  bytes, hex text or raw; never written to weights, attestations or logs).
* `embed_model(model_dir, out_dir, key, message)`: write a watermarked copy, shard by shard: for a causal
  LM the careful mark (graded, weakest detectable, measured against the greedy-fidelity bar or refused;
  `modelsec.watermark.careful`); `embed_fixed` (or `careless=True`) for the fixed-strength mark.
* `detect(model, key, message=None, reference=None)`: blind detection by the Stouffer statistic of the
  pilot bits, with a false-positive bound that holds for any host (Hoeffding/Pinelis), the exact binomial
  tail of the sign rule and the confidence (cosine of ±1 bit vectors) beside it.
* `resynchronise`, `infer_groups`, `NeuronGroup`, `AttentionLayout`: undo function-preserving transforms
  (residual stream, neurons, dummy neurons, attention heads and RoPE pairs) against the registered
  reference model before extraction.
* `sign_watermark_attestation`, `write_watermark_attestation`, `verify_watermark_attestation`: the
  DSSE-signed in-toto statement (`https://modelsec.dev/watermark/v1`) about the watermarked model's root
  digest.

The scheme, its parameters and sources are documented in `modelsec.watermark.spread_spectrum`; detection in
`modelsec.watermark.detection`; what re-synchronisation can and cannot undo in `modelsec.watermark.resync`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelsec.lazy import lazy_exports

if TYPE_CHECKING:
    from modelsec.watermark.attestation import (
        PREDICATE_TYPE,
        WatermarkAttestation,
        model_root_digests,
        sign_watermark_attestation,
        verify_watermark_attestation,
        watermark_statement,
        write_watermark_attestation,
    )
    from modelsec.watermark.detection import (
        DetectionResult,
        DetectionThresholds,
        binomial_tail,
        detect,
        normal_tail,
        rademacher_tail_bound,
    )
    from modelsec.watermark.embed import EmbedResult, TensorReport, embed_fixed, embed_model
    from modelsec.watermark.io import ArraySource, DirectorySource, TensorRef, TensorSource
    from modelsec.watermark.resync import (
        AttentionLayout,
        NeuronGroup,
        ResyncReport,
        infer_groups,
        resynchronise,
    )
    from modelsec.watermark.spread_spectrum import (
        SCHEME,
        WatermarkKey,
        WatermarkParams,
        generate_key_file_text,
        load_key_file,
        parse_key,
        parse_message,
    )

__all__ = [
    "PREDICATE_TYPE",
    "SCHEME",
    "ArraySource",
    "AttentionLayout",
    "DetectionResult",
    "DetectionThresholds",
    "DirectorySource",
    "EmbedResult",
    "NeuronGroup",
    "ResyncReport",
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
]

_HOME = {
    "PREDICATE_TYPE": "attestation",
    "WatermarkAttestation": "attestation",
    "model_root_digests": "attestation",
    "verify_watermark_attestation": "attestation",
    "watermark_statement": "attestation",
    "sign_watermark_attestation": "attestation",
    "write_watermark_attestation": "attestation",
    "DetectionResult": "detection",
    "DetectionThresholds": "detection",
    "binomial_tail": "detection",
    "normal_tail": "detection",
    "rademacher_tail_bound": "detection",
    "detect": "detection",
    "EmbedResult": "embed",
    "TensorReport": "embed",
    "embed_fixed": "embed",
    "embed_model": "embed",
    "ArraySource": "io",
    "DirectorySource": "io",
    "TensorRef": "io",
    "TensorSource": "io",
    "AttentionLayout": "resync",
    "NeuronGroup": "resync",
    "ResyncReport": "resync",
    "infer_groups": "resync",
    "resynchronise": "resync",
    "SCHEME": "spread_spectrum",
    "WatermarkKey": "spread_spectrum",
    "WatermarkParams": "spread_spectrum",
    "generate_key_file_text": "spread_spectrum",
    "load_key_file": "spread_spectrum",
    "parse_key": "spread_spectrum",
    "parse_message": "spread_spectrum",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals(), __all__)
