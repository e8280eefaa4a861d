"""in-toto statements, DSSE envelopes and sigstore bundles (formats only: no keys, no trust decisions)."""

from __future__ import annotations

from modelsec.attestations.bundle import (
    BUNDLE_MEDIA_TYPE,
    Bundle,
    StatementSigner,
    bundle_to_json,
    key_hint,
    parse_bundle,
    sign_payload,
    sign_statement,
)
from modelsec.attestations.dsse import PAYLOAD_TYPE_IN_TOTO, Envelope, EnvelopeSignature, pae
from modelsec.attestations.statement import (
    STATEMENT_TYPE,
    Statement,
    Subject,
    parse_statement,
    serialize_statement,
)

__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "PAYLOAD_TYPE_IN_TOTO",
    "STATEMENT_TYPE",
    "Bundle",
    "Envelope",
    "EnvelopeSignature",
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
]
