"""DSSE v1.0 envelopes and the pre-authentication encoding (PAE).

Source: https://github.com/secure-systems-lab/dsse/blob/v1.0.0/protocol.md. The signature covers
`PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, where LEN is the ASCII decimal
*byte* length. Signing the raw payload, the base64 text, or character counts are all different messages
(corpus DSSE02); only this function builds the signed bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PAYLOAD_TYPE_IN_TOTO", "Envelope", "EnvelopeSignature", "pae"]

PAYLOAD_TYPE_IN_TOTO = "application/vnd.in-toto+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """Return the DSSE v1 pre-authentication encoding of `payload` under `payload_type`.

    Args:
        payload_type: The envelope's payloadType (UTF-8 encoded into the message).
        payload: The raw (decoded) payload bytes.

    Returns:
        `b"DSSEv1 <len(type)> <type> <len(payload)> <payload>"` with byte lengths.

    Example:
        >>> pae("http://example.com/HelloWorld", b"hello world")
        b'DSSEv1 29 http://example.com/HelloWorld 11 hello world'
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(payload), payload)


@dataclass(frozen=True, slots=True)
class EnvelopeSignature:
    """One DSSE signature: raw signature bytes and the (untrusted, informational) keyid."""

    sig: bytes
    keyid: str = ""


@dataclass(frozen=True, slots=True)
class Envelope:
    """A DSSE envelope as carried by a sigstore bundle.

    Attributes:
        payload: The exact payload bytes that were signed (never re-serialised).
        payload_type: The payloadType string.
        signatures: The signatures; modelsec bundles carry exactly one.
    """

    payload: bytes
    payload_type: str
    signatures: tuple[EnvelopeSignature, ...]

    def pae(self) -> bytes:
        """The bytes the signatures must cover."""
        return pae(self.payload_type, self.payload)
