"""Watermark keys and messages: parsing, loading, HKDF subkeys, AES-CTR keystreams and public commitments.

The key schedule is described in `modelsec.watermark.spread_spectrum` (HKDF-SHA256, RFC 5869; AES-256-CTR,
NIST SP 800-38A). The raw key bytes are never kept, written or logged: only the HKDF pseudo-random key is
held. This module lives below the verifier (it imports neither numpy nor torch) so that a
policy can load the owner's key and commit to the message it expects (`watermark.message` in a policy file)
with the same key schedule and message encoding as `modelsec watermark embed`; `modelsec.watermark` (and
`modelsec.watermark.spread_spectrum`) re-export it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from modelsec.errors import KeyMaterialError, PolicyError
from modelsec.safe_io import read_regular_file

__all__ = [
    "KEY_FILE_MAX_BYTES",
    "KEY_MAX_BYTES",
    "KEY_MIN_BYTES",
    "WatermarkKey",
    "generate_key_file_text",
    "load_key_file",
    "parse_key",
    "parse_message",
]

KEY_MIN_BYTES = 32
KEY_MAX_BYTES = 64
KEY_FILE_MAX_BYTES = 4096
_HKDF_SALT = b"modelsec.watermark.v1 hkdf salt"
_INFO_PREFIX = b"modelsec.watermark.v1/"
_HEX_KEY = re.compile(r"[0-9a-fA-F]+")


@dataclass(frozen=True, slots=True, repr=False)
class WatermarkKey:
    """A watermark key, held as its HKDF pseudo-random key (the raw bytes are not kept).

    The object never prints its material (`repr` shows only the public commitment prefix). Use
    `load_key_file` or `parse_key` to build one.
    """

    _prk: bytes = field(repr=False)

    @classmethod
    def from_bytes(cls, key: bytes, *, source: str = "watermark key") -> WatermarkKey:
        """Wrap raw key bytes (HKDF-Extract with a fixed scheme salt, RFC 5869 section 2.2).

        Args:
            key: 32 to 64 uniformly random bytes.
            source: Names the key in errors.

        Returns:
            The key.

        Raises:
            KeyMaterialError: The key is shorter than 32 or longer than 64 bytes, or all one byte value.
        """
        if key.lstrip().startswith(b"-----BEGIN"):
            raise KeyMaterialError(
                f"{source}: is a PEM file (a signing, public or TLS key?), not a watermark key; a watermark "
                "key is 32-64 raw random bytes (run `modelsec watermark keygen`)"
            )
        if len(key) < KEY_MIN_BYTES:
            raise KeyMaterialError(
                f"{source}: watermark key too short: {len(key)} bytes, need at least {KEY_MIN_BYTES} random "
                "bytes (run `modelsec watermark keygen`)"
            )
        if len(key) > KEY_MAX_BYTES:
            raise KeyMaterialError(
                f"{source}: watermark key too long: {len(key)} bytes, at most {KEY_MAX_BYTES}"
            )
        if len(set(key)) == 1:
            raise KeyMaterialError(f"{source}: watermark key is one repeated byte; generate a random key")
        return cls(hmac.new(_HKDF_SALT, key, hashlib.sha256).digest())

    def __repr__(self) -> str:
        return f"<WatermarkKey commitment={self.commitment()[:16]}...>"

    def subkey(self, label: bytes, context: bytes = b"") -> bytes:
        """HKDF-Expand (RFC 5869 section 2.3, SHA-256, one block) of `label` and `context`.

        Args:
            label: Purpose, e.g. `b"blocks"`; distinct labels give independent subkeys.
            context: Length-prefixed binding data (tensor name and shape).

        Returns:
            A 32-byte subkey.
        """
        info = _INFO_PREFIX + label + b"\x00" + context
        return hmac.new(self._prk, info + b"\x01", hashlib.sha256).digest()

    def stream(self, label: bytes, context: bytes, nbytes: int) -> bytes:
        """`nbytes` of AES-256-CTR keystream under `subkey(label, context)` from a zero counter.

        Raises:
            PolicyError: `nbytes` is negative or above 2**36 (a tensor far beyond any model).
        """
        if nbytes < 0 or nbytes > 2**36:
            raise PolicyError(f"keystream of {nbytes} bytes requested; refusing")
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        encryptor = Cipher(algorithms.AES(self.subkey(label, context)), modes.CTR(bytes(16))).encryptor()
        out = encryptor.update(bytes(nbytes))
        encryptor.finalize()  # CTR has no tail; finalizing checks the context is complete
        return out

    def commitment(self) -> str:
        """A public commitment to the key: hex HMAC-SHA256 output under a dedicated subkey.

        Hiding (a PRF output of a 256-bit random key) and binding (finding another key with the same value is
        a second-preimage search on HMAC-SHA256). Safe to publish in attestations and logs.
        """
        return self.subkey(b"key-commitment").hex()

    def message_commitment(self, message: bytes) -> str:
        """A keyed commitment to `message`: hex HMAC-SHA256(subkey, len || message).

        Only holders of the key can test a candidate message, so low-entropy messages stay hidden.
        """
        body = len(message).to_bytes(8, "big") + message
        return hmac.new(self.subkey(b"message-commitment"), body, hashlib.sha256).hexdigest()


def generate_key_file_text() -> bytes:
    """A new key file's contents: 32 bytes from `os.urandom` as 64 lowercase hex digits and a newline."""
    return os.urandom(KEY_MIN_BYTES).hex().encode("ascii") + b"\n"


def parse_key(data: bytes, *, source: str) -> WatermarkKey:
    """Parse watermark key file contents.

    Format (decided here): either text of 64 to 128 hex digits (32 to 64 bytes; surrounding ASCII
    whitespace allowed, `modelsec watermark keygen` writes 64 digits and a newline), or the raw 32 to 64
    bytes. Contents that are entirely hex digits are always read as hex.

    Args:
        data: The file contents.
        source: Names the key in errors (usually the path).

    Returns:
        The key.

    Raises:
        KeyMaterialError: Empty, odd-length hex, wrong length, or a degenerate key.
    """
    text = data.strip(b" \t\r\n")
    if not text:
        raise KeyMaterialError(f"{source}: watermark key file is empty")
    try:
        decoded = text.decode("ascii")
    except UnicodeDecodeError:
        decoded = ""
    if decoded and _HEX_KEY.fullmatch(decoded):
        if len(decoded) % 2:
            raise KeyMaterialError(f"{source}: watermark key has an odd number of hex digits")
        return WatermarkKey.from_bytes(bytes.fromhex(decoded), source=source)
    return WatermarkKey.from_bytes(data, source=source)


def load_key_file(path: Path) -> WatermarkKey:
    """Read and parse a watermark key file (symlinks refused; see `parse_key` for the format).

    Args:
        path: The key file.

    Returns:
        The key.

    Raises:
        KeyMaterialError: The file is missing, unreadable, a symlink, not a regular file, too large, or not
            a valid key.
    """
    data = read_regular_file(
        path,
        "watermark key file",
        max_bytes=KEY_FILE_MAX_BYTES,
        error=KeyMaterialError,
        follow_symlinks=False,
    )
    return parse_key(data, source=str(path))


def parse_message(text: str) -> bytes:
    """Message bytes from command-line or policy text: `hex:<digits>` or `0x<digits>` hex, otherwise UTF-8.

    The one encoding of `modelsec watermark embed -m`, `watermark detect -m` and a policy's
    `attestations.watermark.message`.

    Raises:
        PolicyError: Empty message or invalid hex.
    """
    for prefix in ("hex:", "0x"):
        if text.startswith(prefix):
            try:
                value = bytes.fromhex(text[len(prefix) :])
            except ValueError as e:
                raise PolicyError(f"message {text[:40]!r}: invalid hex ({e})") from None
            break
    else:
        value = text.encode("utf-8")
    if not value:
        raise PolicyError("the watermark message is empty")
    return value
