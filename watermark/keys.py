"""Watermark keys: moved to `modelsec.signer.watermark_keys` (below the verifier); re-exported here."""

from __future__ import annotations

from modelsec.signer.watermark_keys import (
    KEY_FILE_MAX_BYTES,
    KEY_MAX_BYTES,
    KEY_MIN_BYTES,
    WatermarkKey,
    generate_key_file_text,
    load_key_file,
    parse_key,
)

__all__ = [
    "KEY_FILE_MAX_BYTES",
    "KEY_MAX_BYTES",
    "KEY_MIN_BYTES",
    "WatermarkKey",
    "generate_key_file_text",
    "load_key_file",
    "parse_key",
]
