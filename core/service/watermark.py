"""`modelsec.v1.WatermarkService`: embed and detect keyed parameter watermarks in server-side models.

The watermark keys are server-held and named in the configuration (`watermarkKeys`), like signing keys: a
caller names a key it is allowed to use and never sees its material. The key file is read for each call
(rotating a key file needs no restart) and is never put into a response, an error or a log line; neither is
the message. Model paths must lie under the read roots, output paths under the write roots.

An undetected watermark is a normal answer (`detected = false`), never an RPC error. Neither
`embed_model` nor `detect` takes a progress callback, so a cancelled call is noticed only before the
library call starts (the worker's result is then discarded); an embedding (with its attestation) or a
detection that has started runs to its end.

numpy loads inside the RPC methods, so constructing the servicer at server start imports neither numpy
nor torch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from grpc import aio

from modelsec.errors import KeyMaterialError
from modelsec.limits import Limits
from modelsec.service.attestation import store_produced, storer_for
from modelsec.service.config import WatermarkKeyModel
from modelsec.service.state import ServiceState
from modelsec.service.work import Check, run_blocking
from modelsec.signer.layout import WATERMARK_BUNDLE_NAME, write_bundle_at
from modelsec.v1 import watermark_pb2, watermark_pb2_grpc
from modelsec.watermark.attestation import PREDICATE_TYPE

if TYPE_CHECKING:
    from modelsec.watermark.detection import DetectionResult
    from modelsec.watermark.spread_spectrum import WatermarkKey

__all__ = ["WatermarkServicer", "detection_to_proto"]

_log = logging.getLogger("modelsec.service")


def detection_to_proto(result: DetectionResult) -> watermark_pb2.WatermarkDetection:
    """A detection result -> `WatermarkDetection` (the decoded message is not sent)."""
    return watermark_pb2.WatermarkDetection(
        detected=result.detected,
        bits=result.bits,
        matches=result.bit_matches,
        bit_error_rate=result.bit_error_rate,
        false_positive_probability=result.false_positive_probability,
        log10_false_positive_probability=result.log10_false_positive_probability,
        confidence=result.confidence,
        message_matched=result.message_matched,
        message_bits=(result.message_bits or 0) if result.message_matches is not None else 0,
        message_matches=result.message_matches or 0,
        z_score=result.z_score,
        null_p_value=result.null_p_value,
        binomial_false_positive_probability=result.binomial_false_positive_probability,
        message_code=result.message_code,
        message_decoded=result.message_decoded,
        code_bit_error_rate=result.code_bit_error_rate,
    )


class WatermarkServicer(watermark_pb2_grpc.WatermarkServiceServicer):
    """EmbedWatermark and DetectWatermark with the server's named watermark keys (access op `watermark`)."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self.limits = Limits()

    async def EmbedWatermark(
        self, request: watermark_pb2.EmbedWatermarkRequest, context: aio.ServicerContext[Any, Any]
    ) -> watermark_pb2.EmbedWatermarkResponse:
        """Write a watermarked copy of `model_path` to `out_path`, and sign its attestation when asked.

        Every check runs before any byte is read: access, the watermark key's `allow` list, both paths,
        and the signing key's `allow` list, `watermark` role and `watermarkRecord` operation. The attestation
        records who embedded the mark (`runBy`: this server and the caller) and is written as
        `model.watermark.sig` inside the output directory (a name the manifest ignores) and returned.

        Raises:
            PermissionDeniedError: No `watermark` access, a key the caller may not use, a signing key
                without the `watermark` role or `watermarkRecord` operation, or a path outside the server's
                roots.
            NotFoundError: No such watermark key or signing key version.
            PolicyError: Empty or too long a message, beyond the model's capacity, or an unusable output
                directory (INVALID_ARGUMENT).
            KeyMaterialError: The watermark key file cannot be loaded on the server.
        """
        caller = self.state.require("watermark")
        storer = storer_for(self.state, request.store_attestation, request.attestation_key_version)
        wm = self.state.watermark_key(request.watermark_key)
        model_dir = self.state.readable_path(request.model_path, "model_path")
        out_dir = self.state.writable_path(request.out_path, "out_path")
        signer = (
            self.state.signing_key_for(request.attestation_key_version, PREDICATE_TYPE, "watermarkRecord")
            if request.attestation_key_version
            else None
        )
        run_by = self.state.run_by()
        message = request.message

        def work(check: Check) -> watermark_pb2.EmbedWatermarkResponse:
            from modelsec.watermark.attestation import model_root_digests, sign_watermark_attestation
            from modelsec.watermark.embed import embed_model

            key = _load_key(wm)
            check()
            # Both paths are opened beneath their roots (no link followed) and used through those
            # descriptors: a directory renamed or exchanged for a link meanwhile cannot redirect the read
            # or the write.
            with model_dir.opened() as source, out_dir.opened() as out:
                result = embed_model(source, out, key, message, limits=self.limits)
                # No checkpoint from here on: once the marked copy exists, it gets the attestation the
                # caller asked for, so a cancelled call never leaves an unattested copy behind.
                bundle = b""
                if signer is None:
                    digest = model_root_digests(result.out_dir, limits=self.limits)["sha256"]
                else:
                    digests, bundle = sign_watermark_attestation(
                        result, signer.backend, limits=self.limits, run_by=run_by
                    )
                    self.state.record_signed_bundle(signer, bundle, "EmbedWatermark", caller)
                    write_bundle_at(
                        result.out_dir, WATERMARK_BUNDLE_NAME, bundle, what="watermark attestation"
                    )
                    digest = digests["sha256"]
            return watermark_pb2.EmbedWatermarkResponse(
                root_digest=digest,
                bits=result.message_bits,
                detection=detection_to_proto(result.detection),
                attestation=bundle,
            )

        response = await run_blocking(work, context)
        if storer is not None and response.attestation:
            response.stored_attestation_id, response.not_stored_reason = store_produced(
                self.state, response.attestation, storer
            )
        return response

    async def DetectWatermark(
        self, request: watermark_pb2.DetectWatermarkRequest, context: aio.ServicerContext[Any, Any]
    ) -> watermark_pb2.DetectWatermarkResponse:
        """Detect the named key's watermark in `model_path` (blind when `message` is empty).

        Raises:
            PermissionDeniedError: No `watermark` access, a key the caller may not use, or a path outside
                the read roots.
            NotFoundError: No such watermark key.
            PolicyError: A message longer than the scheme allows (INVALID_ARGUMENT).
            MalformedArtifactError: No safetensors file, or a malformed one.
            KeyMaterialError: The watermark key file cannot be loaded on the server.
        """
        self.state.require("watermark")
        wm = self.state.watermark_key(request.watermark_key)
        model_dir = self.state.readable_path(request.model_path, "model_path")
        message = request.message or None

        def work(check: Check) -> watermark_pb2.DetectWatermarkResponse:
            from modelsec.watermark.detection import detect

            key = _load_key(wm)
            check()
            with model_dir.opened() as source:
                result = detect(source, key, message=message, limits=self.limits)
            return watermark_pb2.DetectWatermarkResponse(detection=detection_to_proto(result))

        return await run_blocking(work, context)


def _load_key(wm: WatermarkKeyModel) -> WatermarkKey:
    """Load a configured key file; the caller learns only the key's name, the log gets the reason."""
    from modelsec.watermark.spread_spectrum import load_key_file

    try:
        return load_key_file(wm.path)
    except KeyMaterialError as e:
        _log.error("watermark key %r cannot be loaded: %s", wm.name, e.diagnostics())
        raise KeyMaterialError(f"watermark key {wm.name!r} cannot be loaded on the server") from None
