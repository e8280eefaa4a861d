"""Strict DER for (EC)DSA-style signatures: `Ecdsa-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }`.

Used for ECDSA (RFC 5480 / SEC 1) and SM2 (GB/T 35276-2017, same structure). Decoding goes through
`cryptography`'s `decode_dss_signature`, whose ASN.1 parser is DER-only (X.690 §10: definite minimal
lengths, minimal non-negative INTEGERs, no trailing bytes); the decoded pair is then re-encoded and must
give back the input byte for byte, so strictness does not rest on the parser alone. Both scalars must lie in
[1, n-1] (FIPS 186-5 §6.4.2 step 1; GB/T 32918.2 §7.1 B1/B2). A signature that fails any of these is
refused *before* any curve arithmetic, so `(0, 0)` (CVE-2022-21449), `r + n` forms (malleability) and BER
variants never reach a backend.
"""

from __future__ import annotations

import re

from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from modelsec.errors import SignatureError

__all__ = ["decode_signature", "encode_integer", "encode_length", "encode_signature"]

_MAX_SIGNATURE_BYTES = 256
_PARSE_ERROR = re.compile(r"kind: (\w+)(?:.*location: \[([^\]]*)\])?", re.S)


def _why(error: ValueError) -> str:
    """`cryptography`'s ASN.1 parse error as `KIND at FIELD` (e.g. `InvalidValue at DssSignature::r`)."""
    found = _PARSE_ERROR.search(str(error))
    if found is None:
        return "malformed"
    kind, location = found.group(1), (found.group(2) or "").replace('"', "")
    return f"{kind} at {location}" if location else kind


def decode_signature(signature: bytes, order: int) -> tuple[int, int]:
    """Decode a DER `SEQUENCE { r, s }` strictly and range-check it.

    Args:
        signature: The DER bytes exactly as carried by the DSSE envelope.
        order: The group order n of the curve.

    Returns:
        `(r, s)`, both in [1, n-1].

    Raises:
        SignatureError: Not strict DER (BER lengths, non-minimal or negative INTEGERs, another type, trailing
            bytes), or r or s outside [1, n-1].
    """
    if not isinstance(signature, bytes | bytearray):
        raise SignatureError("signature must be bytes")
    signature = bytes(signature)
    if not 8 <= len(signature) <= _MAX_SIGNATURE_BYTES:
        raise SignatureError(f"signature has an invalid length ({len(signature)} bytes)")
    try:
        r, s = decode_dss_signature(signature)
    except ValueError as e:
        raise SignatureError(f"signature is not strict DER SEQUENCE {{ r, s }} ({_why(e)})") from None
    if not 1 <= r < order:
        raise SignatureError("invalid signature: r is outside [1, n-1]")
    if not 1 <= s < order:
        raise SignatureError("invalid signature: s is outside [1, n-1]")
    if encode_dss_signature(r, s) != signature:  # a DER value has exactly one encoding
        raise SignatureError("signature is not strict DER SEQUENCE { r, s } (not the canonical encoding)")
    return r, s


def encode_integer(value: int) -> bytes:
    """DER INTEGER of a non-negative `value` (minimal, with a leading zero byte when the top bit is set)."""
    body = value.to_bytes(value.bit_length() // 8 + 1, "big")
    return b"\x02" + encode_length(len(body)) + body


def encode_length(length: int) -> bytes:
    """DER definite length octets (short form below 128, else minimal long form)."""
    if length < 0x80:
        return bytes([length])
    raw = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def encode_signature(r: int, s: int) -> bytes:
    """Encode `(r, s)` as DER `SEQUENCE { r INTEGER, s INTEGER }` (both must be positive)."""
    if r <= 0 or s <= 0:
        raise ValueError("r and s must be positive")
    return encode_dss_signature(r, s)
