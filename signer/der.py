"""Strict DER for (EC)DSA-style signatures: `Ecdsa-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }`.

Used for ECDSA (RFC 5480 / SEC 1) and SM2 (GB/T 35276-2017, same structure). Decoding is strict DER
(X.690 §10): definite short/long lengths in minimal form, INTEGERs minimal and non-negative, no trailing
bytes, and both scalars in [1, n-1] (FIPS 186-5 §6.4.2 step 1; GB/T 32918.2 §7.1 B1/B2). A signature that
fails any of these is refused *before* any curve arithmetic, so `(0, 0)` (CVE-2022-21449), `r + n`
forms (malleability) and BER variants never reach a backend.
"""

from __future__ import annotations

from modelsec.errors import SignatureError

__all__ = ["decode_signature", "encode_integer", "encode_length", "encode_signature"]

_MAX_SIGNATURE_BYTES = 256


def _read_length(data: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(data):
        raise SignatureError("signature DER truncated (length)")
    first = data[pos]
    pos += 1
    if first < 0x80:
        return first, pos
    count = first & 0x7F
    if count == 0 or count > 2:
        raise SignatureError("signature DER uses an indefinite or oversized length")
    if pos + count > len(data):
        raise SignatureError("signature DER truncated (long length)")
    value = int.from_bytes(data[pos : pos + count], "big")
    if value < 0x80 or (count == 2 and value < 0x100):
        raise SignatureError("signature DER length is not minimally encoded")
    return value, pos + count


def _read_integer(data: bytes, pos: int, name: str) -> tuple[int, int]:
    if pos >= len(data) or data[pos] != 0x02:
        raise SignatureError(f"signature DER: {name} is not an INTEGER")
    length, pos = _read_length(data, pos + 1)
    if length == 0 or pos + length > len(data):
        raise SignatureError(f"signature DER: {name} has an invalid length")
    body = data[pos : pos + length]
    if body[0] & 0x80:
        raise SignatureError(f"signature DER: {name} is negative")
    if length > 1 and body[0] == 0 and not body[1] & 0x80:
        raise SignatureError(f"signature DER: {name} is not minimally encoded")
    return int.from_bytes(body, "big"), pos + length


def decode_signature(signature: bytes, order: int) -> tuple[int, int]:
    """Decode a DER `SEQUENCE { r, s }` strictly and range-check it.

    Args:
        signature: The DER bytes exactly as carried by the DSSE envelope.
        order: The group order n of the curve.

    Returns:
        `(r, s)`, both in [1, n-1].

    Raises:
        SignatureError: Not strict DER, trailing bytes, or r or s outside [1, n-1].
    """
    if not 8 <= len(signature) <= _MAX_SIGNATURE_BYTES:
        raise SignatureError(f"signature has an invalid length ({len(signature)} bytes)")
    if signature[0] != 0x30:
        raise SignatureError("signature DER is not a SEQUENCE")
    length, pos = _read_length(signature, 1)
    if pos + length != len(signature):
        raise SignatureError("signature DER length does not match its size (trailing or missing bytes)")
    r, pos = _read_integer(signature, pos, "r")
    s, pos = _read_integer(signature, pos, "s")
    if pos != len(signature):
        raise SignatureError("signature DER has trailing bytes inside the SEQUENCE")
    if not 1 <= r < order:
        raise SignatureError("invalid signature: r is outside [1, n-1]")
    if not 1 <= s < order:
        raise SignatureError("invalid signature: s is outside [1, n-1]")
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
    body = encode_integer(r) + encode_integer(s)
    return b"\x30" + encode_length(len(body)) + body
