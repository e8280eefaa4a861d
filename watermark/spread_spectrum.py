"""The keyed spread-spectrum parameter watermark: keys, parameters, carrier selection and embedding math.

Scheme `modelsec-ss-mult/v1` (post hoc: no retraining, no training data):

* **Sources.** Spread-spectrum watermarking with a pseudo-random ±1 chip sequence and the multiplicative
  rule `v' = v (1 + alpha x)` is Cox, Kilian, Leighton & Shamoon, "Secure spread spectrum watermarking
  for multimedia", IEEE Trans. Image Processing 6(12), 1997. Carrying a bit string in the weights of a
  network and reading it back as the sign of a keyed projection of the weights is Uchida, Nagai, Sakazawa
  & Satoh, "Embedding Watermarks into Deep Neural Networks", ICMR 2017 (they embed during training with a
  regulariser; this scheme embeds after training by *informed* embedding, i.e. it measures the host's
  correlation first and adds only what is missing, as in Cox et al.'s informed-embedding follow-ups).
* **Key schedule.** The watermark key (32 to 64 random bytes, see `load_key_file`) enters HKDF-SHA256
  (RFC 5869) once; every stream below uses its own HKDF-Expand subkey with a distinct `info` label (domain
  separation). Streams are AES-256-CTR keystreams (NIST SP 800-38A) from a zero counter, one subkey per
  (purpose, tensor name, tensor shape); AES-CTR is a standard PRF stream and runs at GB/s with AES-NI.
  Python's `random` is never used. The key itself is held only in memory and never written or logged.
* **Carriers.** Eligible tensors are floating-point (F16, BF16, F32, F64) tensors with at least two
  dimensions and at least `min_tensor_elements` elements (Linear and embedding matrices, Conv kernels as
  their flattened row-major bytes). Each tensor's flattened elements are cut into blocks of `block_size`
  contiguous elements and the blocks into super-blocks of `2**density_log2` blocks; the keystream picks
  exactly one carrier block per super-block (stratified sampling), a 32-bit slot for it and a ±1 sign for
  each of its elements. `density_log2` follows from the model's total eligible element count so that a
  model carries about `2**target_carriers_log2` to twice that many carriers whatever its size (all
  weights of small models); it is recorded in the attestation and re-derived from the headers at
  detection time.
* **Code word.** `pilot_bits` key-derived pilot bits followed by the code bits of the `L = 8 * len(message)`
  message bits under `message_code` (`modelsec.watermark.message_code`: `crc32-conv7`, a CRC-32 and a
  rate-1/2 convolutional code of `2 * (L + 38)` bits, by default; `none`, the `L` bits themselves, for
  marks made before issue 30's error correction), XOR-ed with a key-derived whitening pad (so any message
  gives a balanced ±1 code word). A carrier block with slot `u` carries code bit `u mod n`, `n` the code
  word's length. Because the pilot does not depend on the message, detection needs only the key (the
  message length and code are searched, with a Bonferroni correction).
* **Statistic.** For each tensor, `x = w / rms` where `rms` is the root mean square of its carrier
  elements (this makes detection invariant to rescaling a whole tensor). Bit `b` has correlation
  `c_b = sum(s_i x_i)` and energy `E_b = sum(x_i**2)` over its carriers; `z_b = c_b / sqrt(E_b)` is
  standard normal for a model that does not carry the mark (the signs are independent of the weights),
  and the extracted bit is `sign(c_b)`.
* **Embedding** (informed, multiplicative, bounded). Every carrier of bit `b` becomes
  `w' = w + m_b t_b s_i |w_i|` (`m_b` = ±1 code bit), i.e. its magnitude changes by the same fraction
  `t_b` and its sign never flips; `t_b >= 0` is the smallest value that makes `m_b z_b >= kappa`
  after embedding (`code_margin * kappa` for the crc32-conv7 code bits of the message, which the soft
  decoder and the CRC protect; a closed-form quadratic, see `solve_strength`), and
  `t_b <= max_relative_change` is enforced, so no weight changes by more than that fraction of its
  magnitude. The margin `kappa` (in standard deviations of the host correlation) sets robustness:
  additive noise of `a` times each tensor's RMS moves `z_b` by a standard normal times `a`, whatever the
  number of carriers.

Shapes and units: weights are handled as float32 (float64 for F64 tensors); per-bit arrays have length
`n = pilot_bits + coded_length(L, message_code)`; relative changes are fractions of |w| (0.05 = 5 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modelsec.errors import PolicyError
from modelsec.signer.watermark_keys import (
    KEY_FILE_MAX_BYTES,
    KEY_MAX_BYTES,
    KEY_MIN_BYTES,
    WatermarkKey,
    generate_key_file_text,
    load_key_file,
    parse_key,
    parse_message,
)
from modelsec.watermark.message_code import (
    AUTO_MESSAGE_CODE,
    DEFAULT_MESSAGE_CODE,
    LEGACY_MESSAGE_CODE,
    MESSAGE_CODES,
    DecodedBits,
    coded_length,
    decode,
    encode,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "AUTO_MESSAGE_CODE",
    "CARRIER_SETS",
    "DEFAULT_CODE_MARGIN",
    "DEFAULT_MESSAGE_CODE",
    "FLOAT_DTYPES",
    "KEY_FILE_MAX_BYTES",
    "KEY_MAX_BYTES",
    "KEY_MIN_BYTES",
    "LEGACY_MESSAGE_CODE",
    "MESSAGE_CODES",
    "SCHEME",
    "BitStatistics",
    "CarrierPlan",
    "WatermarkKey",
    "WatermarkParams",
    "carrier_count",
    "carrier_plan",
    "code_word",
    "decode_message",
    "decode_message_bits",
    "density_log2_for",
    "generate_key_file_text",
    "is_eligible",
    "load_key_file",
    "message_bits",
    "parse_key",
    "parse_message",
    "solve_strength",
]

SCHEME = "modelsec-ss-mult/v1"
#: dtypes that can carry the mark (safetensors names); everything else is left untouched.
FLOAT_DTYPES: frozenset[str] = frozenset({"F16", "BF16", "F32", "F64"})
#: Carrier sets: `all` eligible tensors; `embeddings`: only token/position embeddings and the output head (a
#: name component containing `embed`, or equal to `lm_head`, `wte`, `wpe` or `shared`), of which each input
#: reads a few rows; `no-embeddings`: all but those. Decided from tensor names alone, so blind detection can
#: re-derive it.
CARRIER_SETS: tuple[str, ...] = ("all", "embeddings", "no-embeddings")
_EMBEDDING_NAMES = frozenset({"lm_head", "wte", "wpe", "shared"})

_MAX_DENSITY_LOG2 = 32
#: `WatermarkParams.code_margin`'s default (measured: `bench/README.md`, "Code margin").
DEFAULT_CODE_MARGIN = 0.45


@dataclass(frozen=True, slots=True)
class WatermarkParams:
    """Parameters of the scheme (all recorded in the attestation; the defaults are what blind detection uses).

    Attributes:
        kappa: Margin: every pilot (and uncoded message) bit's normalised correlation `m_b z_b` is at least
            this after embedding (units: standard deviations of the host correlation; crc32-conv7 code bits:
            `code_margin * kappa`). 3.0 keeps the expected bit error rate
            under additive noise of 1.0 x RMS at about 0.13 % (P(N(0,1) > 3)).
        pilot_bits: Key-derived bits embedded with every message; blind detection tests them.
        block_size: Contiguous elements per carrier block (multiple of 8).
        target_carriers_log2: Density rule: a model with `N` eligible elements uses one carrier block per
            `2**k` blocks, `k = max(0, floor(log2(N / 2**target_carriers_log2)))`.
        density_log2: Fixed `k` instead of the rule (None: the rule).
        min_tensor_elements: Smaller tensors never carry the mark.
        max_relative_change: Hard bound on |w' - w| / |w| for every weight (fraction).
        max_message_bits: Longest message (also bounds the blind search over message lengths).
        min_carriers_per_bit: Capacity rule: a message is refused if a code bit would get fewer carriers.
        margin_slack: Embedding aims at `kappa * (1 + margin_slack)` so that the per-tensor RMS change and
            the dtype cast cannot pull a bit below `kappa`.
        carrier_set: Which eligible tensors carry bits (`CARRIER_SETS`).
        message_code: Error correction of the message (`modelsec.watermark.message_code`): `crc32-conv7`,
            `none` (what every mark made before it used; an attestation without `messageCode`), or `auto`
            (default): embedding uses crc32-conv7 where the model can carry it and `none` otherwise
            (`EmbedResult.params` holds the one used), detection tries both.
        code_margin: The margin of the message's crc32-conv7 code bits as a fraction of `kappa` (recorded
            as `codeMargin`): those bits are embedded at `m_b z_b >= code_margin * kappa`, the pilot and
            uncoded (`none`) message bits at `kappa`. Soft-decision Viterbi decoding of the K=7 rate-1/2
            code gains about 5 dB over uncoded bits (Heller and Jacobs, IEEE Trans. Commun. 19(5), 1971)
            and the CRC-32 rejects a wrong decode, so the code word does not need the pilot's margin; at
            the default `DEFAULT_CODE_MARGIN` the coded mark costs no more relative L2 change than the
            uncoded one at kappa 3 (figures: `bench/README.md`). Detection does not use it (presence is
            the pilot; the message is decoded from its soft values); 1.0 is what marks made before it
            used (an attestation without `codeMargin`).
    """

    kappa: float = 3.0
    pilot_bits: int = 64
    block_size: int = 32
    target_carriers_log2: int = 21
    density_log2: int | None = None
    min_tensor_elements: int = 4096
    max_relative_change: float = 0.25
    max_message_bits: int = 512
    min_carriers_per_bit: int = 1024
    margin_slack: float = 0.02
    carrier_set: str = "all"
    message_code: str = AUTO_MESSAGE_CODE
    code_margin: float = DEFAULT_CODE_MARGIN

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.kappa) and 0 < self.kappa <= 100):
            problems.append("kappa must be in (0, 100]")
        if not 16 <= self.pilot_bits <= 4096:
            problems.append("pilot_bits must be in [16, 4096]")
        if self.block_size < 8 or self.block_size % 8 or self.block_size > 4096:
            problems.append("block_size must be a multiple of 8 in [8, 4096]")
        if not 8 <= self.target_carriers_log2 <= 40:
            problems.append("target_carriers_log2 must be in [8, 40]")
        if self.density_log2 is not None and not 0 <= self.density_log2 <= _MAX_DENSITY_LOG2:
            problems.append(f"density_log2 must be in [0, {_MAX_DENSITY_LOG2}]")
        if self.min_tensor_elements < self.block_size:
            problems.append("min_tensor_elements must be at least block_size")
        if not (0 < self.max_relative_change < 1):
            problems.append("max_relative_change must be in (0, 1)")
        if not (8 <= self.max_message_bits <= 65536 and self.max_message_bits % 8 == 0):
            problems.append("max_message_bits must be a multiple of 8 in [8, 65536]")
        if self.min_carriers_per_bit < 1:
            problems.append("min_carriers_per_bit must be positive")
        if not (0 <= self.margin_slack < 1):
            problems.append("margin_slack must be in [0, 1)")
        if self.carrier_set not in CARRIER_SETS:
            problems.append(f"carrier_set must be one of {', '.join(CARRIER_SETS)}")
        if self.message_code not in (*MESSAGE_CODES, AUTO_MESSAGE_CODE):
            problems.append(f"message_code must be one of {', '.join((*MESSAGE_CODES, AUTO_MESSAGE_CODE))}")
        if not (math.isfinite(self.code_margin) and 0 < self.code_margin <= 1):
            problems.append("code_margin must be in (0, 1]")
        if problems:
            raise PolicyError("invalid watermark parameters: " + "; ".join(problems))

    def to_json(self) -> dict[str, object]:
        """The parameters as recorded in the attestation (camelCase keys)."""
        return {
            "kappa": self.kappa,
            "pilotBits": self.pilot_bits,
            "blockSize": self.block_size,
            "targetCarriersLog2": self.target_carriers_log2,
            "minTensorElements": self.min_tensor_elements,
            "maxRelativeChange": self.max_relative_change,
            "maxMessageBits": self.max_message_bits,
            "minCarriersPerBit": self.min_carriers_per_bit,
            "carrierSet": self.carrier_set,
            "messageCode": self.message_code,
            "codeMargin": self.code_margin,
        }

    def bit_margins(self, code_bits: int, message_code: str | None = None) -> npt.NDArray[np.float64]:
        """The margin each bit of an `code_bits`-bit code word (pilot first) is embedded at.

        Returns:
            float64 (code_bits,): `kappa` for the pilot and uncoded (`none`) message bits,
            `code_margin * kappa` for crc32-conv7 code bits (`auto` is crc32-conv7); before `margin_slack`.
        """
        import numpy as np

        code = message_code or self.message_code
        scale = 1.0 if code == LEGACY_MESSAGE_CODE else self.code_margin
        margins = np.full(code_bits, scale * self.kappa)
        margins[: self.pilot_bits] = self.kappa
        return margins

    def code_length(self, message_bits: int, message_code: str | None = None) -> int:
        """`n`: pilot bits plus the code bits of an `message_bits`-bit message (default code: this one's)."""
        return self.pilot_bits + coded_length(message_bits, message_code or self.message_code)


# --- messages (parse_message: modelsec.signer.watermark_keys) -----------------------------------------------


def message_bits(message: bytes) -> list[int]:
    """The message as bits, most significant bit of each byte first."""
    return [(byte >> (7 - i)) & 1 for byte in message for i in range(8)]


def _stream_bits(key: WatermarkKey, label: bytes, n: int) -> list[int]:
    data = key.stream(label, b"", (n + 7) // 8)
    return message_bits(data)[:n]


def code_word(
    key: WatermarkKey,
    message_bit_list: Sequence[int],
    params: WatermarkParams,
    message_code: str | None = None,
) -> list[int]:
    """The embedded ±1 code word: pilot bits, then the message's code bits XOR a whitening pad (1 -> +1).

    Args:
        key: The watermark key.
        message_bit_list: `L` message bits (0/1); may be empty (pilot only).
        params: Supplies `pilot_bits` and the default `message_code`.
        message_code: The message code (default `params.message_code`).

    Returns:
        `params.code_length(L)` values in {-1, +1}; the pilot and pad are prefixes of fixed key streams,
        so they do not depend on `L` or the code.
    """
    code = message_code or params.message_code
    code = DEFAULT_MESSAGE_CODE if code == AUTO_MESSAGE_CODE else code
    coded = encode(message_bit_list, code) if message_bit_list else []
    pilot = _stream_bits(key, b"pilot", params.pilot_bits)
    pad = _stream_bits(key, b"whiten", len(coded))
    bits = pilot + [m ^ p for m, p in zip(coded, pad, strict=True)]
    return [1 if b else -1 for b in bits]


def decode_message_bits(key: WatermarkKey, code: Sequence[int], params: WatermarkParams) -> bytes:
    """Invert `code_word` with the `none` code for the message part of an extracted ±1 code (0 -> bit 0)."""
    msg = code[params.pilot_bits :]
    pad = _stream_bits(key, b"whiten", len(msg))
    bits = [(1 if c > 0 else 0) ^ p for c, p in zip(msg, pad, strict=True)]
    out = bytearray()
    for i in range(0, len(bits) - len(bits) % 8, 8):
        out.append(int("".join(map(str, bits[i : i + 8])), 2))
    return bytes(out)


def decode_message(
    key: WatermarkKey, z: npt.NDArray[np.float64], message_bits: int, message_code: str
) -> DecodedBits:
    """Decode the message part of a code word from its per-bit statistics.

    Args:
        key: The watermark key (its whitening pad is removed first).
        z: float64 (coded_length(message_bits, message_code),) per-bit `z_b` of the message part, in code
            order (0 for a bit without carriers).
        message_bits: `L`.
        message_code: The code (`modelsec.watermark.message_code.MESSAGE_CODES`).

    Returns:
        The decision (`DecodedBits`: for crc32-conv7, `valid` says whether its CRC-32 holds).
    """
    import numpy as np

    pad = np.asarray(_stream_bits(key, b"whiten", len(z)), dtype=np.float64)
    return decode(z * (1.0 - 2.0 * pad), message_bits, message_code)


# --- carriers -----------------------------------------------------------------------------------------------


def is_eligible(dtype: str, shape: Sequence[int], params: WatermarkParams, name: str = "") -> bool:
    """Whether a tensor may carry the mark: float, at least 2-D, `min_tensor_elements`, in the carrier set.

    Norms and biases are 1-D and never carry bits; the carrier set is decided from `name` alone.
    """
    if dtype not in FLOAT_DTYPES or len(shape) < 2 or math.prod(shape) < params.min_tensor_elements:
        return False
    if params.carrier_set == "all":
        return True
    return is_embedding_name(name) == (params.carrier_set == "embeddings")


def is_embedding_name(name: str) -> bool:
    """Whether a tensor name looks like a token/position embedding or an output head (see `CARRIER_SETS`)."""
    parts = name.split(".")
    return any("embed" in p or p in _EMBEDDING_NAMES for p in parts)


def density_log2_for(total_eligible: int, params: WatermarkParams) -> int:
    """The density exponent `k` (one carrier block per `2**k` blocks) for a model of that many elements."""
    if params.density_log2 is not None:
        return params.density_log2
    if total_eligible <= 0:
        return 0
    k = math.floor(math.log2(total_eligible / 2**params.target_carriers_log2)) if total_eligible else 0
    return max(0, min(_MAX_DENSITY_LOG2, k))


def _tensor_context(name: str, shape: Sequence[int]) -> bytes:
    encoded = name.encode("utf-8")
    parts = [len(encoded).to_bytes(4, "big"), encoded, len(shape).to_bytes(4, "big")]
    parts.extend(int(d).to_bytes(8, "big") for d in shape)
    return b"".join(parts)


def carrier_count(shape: Sequence[int], density_log2: int, params: WatermarkParams) -> int:
    """Number of carrier elements `carrier_plan` selects in a tensor of that shape (no key needed)."""
    return ((math.prod(shape) // params.block_size) >> density_log2) * params.block_size


@dataclass(frozen=True, slots=True)
class CarrierPlan:
    """The carriers of one tensor (independent of the message).

    Attributes:
        name: Tensor name.
        shape: Tensor shape.
        blocks: int64 array (n,): indices of the carrier blocks in the flattened tensor, increasing.
        slots: uint32 array (n,): keyed slot of each block (code bit = slot mod code length).
        signs: float32 array (n, block_size) of ±1 chips.
    """

    name: str
    shape: tuple[int, ...]
    blocks: npt.NDArray[np.int64]
    slots: npt.NDArray[np.uint32]
    signs: npt.NDArray[np.float32]

    @property
    def carriers(self) -> int:
        """Number of carrier elements."""
        return int(self.signs.size)


_SIGN_LUT: npt.NDArray[np.float32] | None = None


def _sign_lut() -> npt.NDArray[np.float32]:
    global _SIGN_LUT
    if _SIGN_LUT is None:
        import numpy as np

        bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1)
        _SIGN_LUT = (1.0 - 2.0 * bits).astype(np.float32)
    return _SIGN_LUT


def carrier_plan(
    key: WatermarkKey, name: str, shape: Sequence[int], density_log2: int, params: WatermarkParams
) -> CarrierPlan:
    """Select the carrier blocks, slots and chip signs of one tensor from the keyed streams.

    Stream `blocks` (8 bytes per super-block, little-endian u64): the top `density_log2` bits of the low
    32 bits choose the block inside the super-block, the high 32 bits are the slot. Stream `signs`
    (`block_size / 8` bytes per carrier block): one bit per element, 1 -> -1, 0 -> +1. Both streams are
    keyed by the tensor's name and shape, so the plan does not depend on the shard layout.

    Args:
        key: The watermark key.
        name: Tensor name (UTF-8).
        shape: Tensor shape (its product is the flattened length).
        density_log2: `k` from `density_log2_for`.
        params: Supplies `block_size`.

    Returns:
        The plan; empty when the tensor has fewer than `2**k` blocks.
    """
    import numpy as np

    g = params.block_size
    numel = math.prod(shape)
    n_super = (numel // g) >> density_log2
    context = _tensor_context(name, shape)
    raw = np.frombuffer(key.stream(b"blocks", context, 8 * n_super), dtype="<u8")
    if density_log2:
        low = (raw & np.uint64(0xFFFFFFFF)).astype(np.uint64)
        offsets = (low >> np.uint64(32 - density_log2)).astype(np.int64)
        blocks = (np.arange(n_super, dtype=np.int64) << density_log2) + offsets
    else:
        blocks = np.arange(n_super, dtype=np.int64)
    slots = (raw >> np.uint64(32)).astype(np.uint32)
    sign_bytes = np.frombuffer(key.stream(b"signs", context, n_super * g // 8), dtype=np.uint8)
    # np.take, not fancy indexing: several times faster for a small table.
    signs = np.take(_sign_lut(), sign_bytes, axis=0).reshape(n_super, g)
    return CarrierPlan(name=name, shape=tuple(int(d) for d in shape), blocks=blocks, slots=slots, signs=signs)


# --- statistics and the embedding rule ----------------------------------------------------------------------


@dataclass(slots=True)
class BitStatistics:
    """Per-block sums of one tensor's carriers, normalised by the tensor's carrier RMS.

    All arrays have one entry per carrier block (float64): `c` = sum(s x), `e` = sum(x**2),
    `a` = sum(|x|), `q` = sum(s x |x|) (the last two only for the embedder); `slots` (uint32) as in the
    plan; `rms` in the tensor's units; `finite` is False when some carrier was NaN or infinite (such
    values count as 0).
    """

    slots: npt.NDArray[np.uint32]
    c: npt.NDArray[np.float64]
    e: npt.NDArray[np.float64]
    a: npt.NDArray[np.float64] | None
    q: npt.NDArray[np.float64] | None
    rms: float
    finite: bool


def block_statistics(
    values: npt.NDArray[np.floating], plan: CarrierPlan, *, full: bool
) -> BitStatistics | None:
    """Per-block correlation sums of one tensor's carrier blocks.

    Sums over a block (`block_size` elements) are accumulated in the values' own precision (float32 for
    F32/F16/BF16 tensors), then widened to float64 for the per-bit totals.

    Args:
        values: (n_blocks, block_size) float32/float64 carrier values, in plan order. Non-finite values
            are treated as 0 (they neither carry nor disturb the mark).
        plan: The tensor's plan.
        full: Also compute `a` and `q` (needed by the embedder only).

    Returns:
        The statistics, or None when the carriers are all zero or too large to square in float32 (the
        tensor then carries nothing).
    """
    import numpy as np

    v = values
    e = np.einsum("ij,ij->i", v, v).astype(np.float64)
    total = float(e.sum())
    finite = math.isfinite(total)
    if not finite:
        v = np.where(np.isfinite(v), v, 0)
        e = np.einsum("ij,ij->i", v, v).astype(np.float64)
        total = float(e.sum())
    if not (0 < total < math.inf):
        return None
    rms = math.sqrt(total / v.size)
    c = np.einsum("ij,ij->i", v, plan.signs).astype(np.float64) / rms
    a = q = None
    if full:
        av = np.abs(v)
        a = av.sum(axis=1).astype(np.float64) / rms
        av *= v
        q = np.einsum("ij,ij->i", av, plan.signs).astype(np.float64) / (rms * rms)
    return BitStatistics(slots=plan.slots, c=c, e=e / (rms * rms), a=a, q=q, rms=rms, finite=finite)


def solve_strength(
    code: Sequence[int],
    c0: npt.NDArray[np.float64],
    e: npt.NDArray[np.float64],
    a: npt.NDArray[np.float64],
    q: npt.NDArray[np.float64],
    target: float | npt.NDArray[np.float64],
    e2: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """Smallest multiplicative strengths `t_b >= 0` that put every bit at `m_b z_b >= target`.

    With `x' = x + m t s |x|`: `c' = c0 + m t A` and `E' = E (1 + t**2) + 2 m t Q`, so the condition
    `(m c0 + t A)**2 = target**2 E'` with `m c0 + t A > 0` is the quadratic
    `t**2 (A**2 - T E) + 2 t (m c0 A - T m Q) + (c0**2 - T E) = 0` (`T = target**2`), whose larger root is
    the answer (0 when the host already satisfies it).

    Args:
        code: ±1 code word (length B).
        c0: Per-bit host correlation `sum(s x)` (float64, length B, normalised units).
        e: Per-bit host energy `sum(x**2)`.
        a: Per-bit `sum(|x|)`.
        q: Per-bit `sum(s x |x|)`.
        target: Required `m z` (kappa with slack): one for every bit, or float64 (B,) per bit
            (`WatermarkParams.bit_margins`).
        e2: Per-bit `sum(g**2 x**2)` when carriers move by `g t` with per-tensor grades `g` (`a` and `q`
            then carry the grade too: `sum(g |x|)`, `sum(g s x |x|)`); None: all grades 1 (`e2 = e`).

    Returns:
        float64 array (B,) of strengths; `inf` where no strength reaches the target (too few carriers).
    """
    import numpy as np

    m = np.asarray(code, dtype=np.float64)
    u0 = m * c0
    tt = target * target
    a2 = a * a - tt * (e if e2 is None else e2)
    b2 = u0 * a - tt * m * q
    c2 = u0 * u0 - tt * e
    disc = b2 * b2 - a2 * c2
    with np.errstate(invalid="ignore", divide="ignore"):
        root = (-b2 + np.sqrt(np.maximum(disc, 0.0))) / a2
    ok = (a2 > 0) & (disc >= 0) & (e > 0)
    t = np.where(ok, np.maximum(root, 0.0), np.inf)
    done = (e > 0) & (u0 >= target * np.sqrt(np.maximum(e, 0.0)))
    return np.where(done, 0.0, t)
