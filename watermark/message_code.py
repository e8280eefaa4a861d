"""Error correction of the watermark message (issue 30): a CRC and a convolutional code, soft-decoded.

Codes (the `message_code` parameter of `modelsec.watermark.spread_spectrum.WatermarkParams`, recorded in the
attestation as `parameters.messageCode`):

* `none`: the `L` message bits are the code bits; each is read as the sign of its correlation, nothing is
  corrected or checked. Every mark made before issue 30's error correction (an attestation without
  `messageCode`) uses it; blind detection still tries it.
* `crc32-conv7` (new marks, wherever the model can carry it: the default `auto` falls back to `none`
  when the longer code word exceeds the model's capacity or the relative-change bound, and the result and
  attestation record which code was used): the message bits, then their CRC-32 (the IEEE 802.3 / zlib
  polynomial 0x04C11DB7, reflected, initial value and final XOR 0xFFFFFFFF, over the message bytes; 32
  bits, most significant first), then 6 zero tail bits, are encoded by the rate-1/2, constraint-length-7
  convolutional code with generators 133 and 171 (octal), the code of IEEE 802.11-2020 section 17.3.5.6
  and CCSDS 131.0-B (free distance 10). The code word has `2 * (L + 38)` bits, emitted as the 133 output
  then the 171 output of every step. Decoding is the soft-decision Viterbi algorithm (Viterbi 1967; Forney,
  "The Viterbi algorithm", Proc. IEEE 61(3), 1973) with the correlation metric `sum_b y_b (2 v_b - 1)` over
  the per-bit statistics `y_b` (here `z_b` of `modelsec.watermark.detection`; a bit without carriers has
  `y_b = 0`, an erasure), which is the maximum-likelihood path for equal-variance Gaussian noise on the
  `z_b`, the model of additive weight noise. The trellis starts and ends in state 0.

What is and is not verified. The decoder returns the most likely message under that model and whether
its CRC-32 holds. A message is reported as read only when the CRC holds; otherwise it is reported as not
decoded, never as a guess. False accept: when the message part is garbage (wrong length hypothesis, or a
channel far beyond the code's correcting power), the decoded bits are a function of `z` values that are
independent of the CRC, so the CRC holds with probability `2**-32` (about 2.3e-10) per decoding; detection
decodes once per result, at the single message length chosen by the pilot bits, so that is the false-
accept probability of a read message. The CRC is not keyed and is no authentication: the message is
bound to the key by the whitening pad and to the signer by the attestation's message commitment.

Shapes and units: bits are Python ints 0/1; soft values are float64 arrays, positive favouring bit 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "AUTO_MESSAGE_CODE",
    "CRC_BITS",
    "DEFAULT_MESSAGE_CODE",
    "LEGACY_MESSAGE_CODE",
    "MESSAGE_CODES",
    "DecodedBits",
    "coded_length",
    "decode",
    "encode",
    "message_capacity",
]

LEGACY_MESSAGE_CODE = "none"
DEFAULT_MESSAGE_CODE = "crc32-conv7"
#: The codes a mark can carry (what attestations record).
MESSAGE_CODES: tuple[str, ...] = (LEGACY_MESSAGE_CODE, DEFAULT_MESSAGE_CODE)
#: The parameters' default: embedding uses crc32-conv7 where the model can carry its longer code word and
#: `none` otherwise (and records which); detection tries both.
AUTO_MESSAGE_CODE = "auto"
CRC_BITS = 32
_K = 7  # constraint length
_MEMORY = _K - 1
_GENERATORS = (0o133, 0o171)  # bit 6 taps the current input, bit 0 the oldest
_RATE = len(_GENERATORS)
_STATES = 1 << _MEMORY


def coded_length(message_bits: int, code: str) -> int:
    """Code bits that carry an `L`-bit message: `L` for none, `2 * (L + 38)` for crc32-conv7 and auto."""
    if code == LEGACY_MESSAGE_CODE:
        return message_bits
    return _RATE * (message_bits + CRC_BITS + _MEMORY)


def message_capacity(code_bits: int, code: str) -> int:
    """Longest message (bits, a multiple of 8) whose code word fits in `code_bits` bits (auto: none's).

    0 when no message fits.
    """
    coded = code == DEFAULT_MESSAGE_CODE
    bits = code_bits // _RATE - CRC_BITS - _MEMORY if coded else code_bits
    return max(0, bits - bits % 8)


def _bits_of(data: bytes) -> list[int]:
    return [(byte >> (7 - i)) & 1 for byte in data for i in range(8)]


def _bytes_of(bits: Sequence[int]) -> bytes:
    return bytes(
        sum(bit << (7 - j) for j, bit in enumerate(bits[i : i + 8])) for i in range(0, len(bits) - 7, 8)
    )


def _parity(x: int) -> int:
    return bin(x).count("1") & 1


def encode(bits: Sequence[int], code: str) -> list[int]:
    """The code bits (0/1) of message bits (0/1, a multiple of 8 for crc32-conv7).

    Raises:
        ValueError: An unknown code, or a message that is not whole bytes (a programming error: messages
            are bytes).
    """
    if code == LEGACY_MESSAGE_CODE:
        return list(bits)
    if code != DEFAULT_MESSAGE_CODE:
        raise ValueError(f"unknown message code {code!r}")
    if len(bits) % 8:
        raise ValueError("crc32-conv7 encodes whole bytes")
    crc = zlib.crc32(_bytes_of(bits))
    return _convolve([*bits, *((crc >> (CRC_BITS - 1 - i)) & 1 for i in range(CRC_BITS)), *([0] * _MEMORY)])


def _convolve(info: Sequence[int]) -> list[int]:
    out: list[int] = []
    state = 0
    for u in info:
        reg = (u << _MEMORY) | state
        out.extend(_parity(reg & g) for g in _GENERATORS)
        state = reg >> 1
    return out


@dataclass(frozen=True, slots=True)
class DecodedBits:
    """What the decoder found.

    Attributes:
        bits: The `L` most likely message bits (0/1), whether or not the check holds.
        valid: Whether the check holds (crc32-conv7: the CRC-32; `none`: always None, nothing is checked).
        code_bit_errors: Code bits whose sign disagrees with the re-encoded decision (for `none`: 0; ties
            count as errors): the channel's raw errors as far as the decoder can tell.
    """

    bits: list[int]
    valid: bool | None
    code_bit_errors: int

    @property
    def message(self) -> bytes:
        """The decided bits as bytes (most significant bit first)."""
        return _bytes_of(self.bits)


def decode(soft: npt.NDArray[np.float64], message_bits: int, code: str) -> DecodedBits:
    """Decode soft code-bit values (positive favours 1; 0: no information) into `message_bits` bits.

    Args:
        soft: float64 (coded_length(message_bits, code),) soft values, e.g. the unwhitened `z_b`.
        message_bits: `L`.
        code: One of `MESSAGE_CODES`.

    Returns:
        The decision; for `none` the signs (0 decodes as bit 0), for crc32-conv7 the Viterbi path and its
        CRC check.

    Raises:
        ValueError: An unknown code or a length that does not match (programming errors).
    """
    import numpy as np

    y = np.asarray(soft, dtype=np.float64)
    if y.shape != (coded_length(message_bits, code),):
        raise ValueError(f"{y.size} soft values for a {code} code word of {message_bits} message bits")
    if code == LEGACY_MESSAGE_CODE:
        return DecodedBits([1 if v > 0 else 0 for v in y], None, 0)
    if code != DEFAULT_MESSAGE_CODE:
        raise ValueError(f"unknown message code {code!r}")
    y = np.where(np.isfinite(y), y, 0.0).reshape(-1, _RATE)
    regs = np.arange(2 * _STATES)
    signs = np.stack(
        [np.array([2 * _parity(int(r) & g) - 1 for r in regs], dtype=np.float64) for g in _GENERATORS], axis=1
    )  # (128, 2): the ±1 outputs of each register value
    # Next state n is reached from registers 2n (previous state 2n mod 64) and 2n + 1.
    nxt = np.arange(_STATES)
    reg_a, reg_b = 2 * nxt, 2 * nxt + 1
    prev_a, prev_b = reg_a & (_STATES - 1), reg_b & (_STATES - 1)
    metric = np.full(_STATES, -np.inf)
    metric[0] = 0.0
    decisions = np.zeros((y.shape[0], _STATES), dtype=bool)
    for t, obs in enumerate(y):
        branch = signs @ obs  # (128,)
        cand_a = metric[prev_a] + branch[reg_a]
        cand_b = metric[prev_b] + branch[reg_b]
        take_b = cand_b > cand_a
        decisions[t] = take_b
        metric = np.where(take_b, cand_b, cand_a)
    state = 0  # terminated trellis
    info = [0] * y.shape[0]
    for t in range(y.shape[0] - 1, -1, -1):
        info[t] = state >> (_MEMORY - 1)
        state = (2 * state + int(decisions[t, state])) & (_STATES - 1)
    bits = info[:message_bits]
    crc = sum(bit << (CRC_BITS - 1 - i) for i, bit in enumerate(info[message_bits : message_bits + CRC_BITS]))
    valid = crc == zlib.crc32(_bytes_of(bits)) and not any(info[message_bits + CRC_BITS :])
    expected = np.asarray(_convolve(info), dtype=np.float64) * 2 - 1
    errors = int((np.sign(y.reshape(-1)) != expected).sum())
    return DecodedBits(bits, valid, errors)
