"""Detection results and thresholds; the presence statistic's null tail bound and the exact binomial tail.

See `modelsec.watermark.detection` for how a result is computed, what the null distribution of the presence
statistic is, and why the bound below holds without a normality assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelsec.errors import PolicyError

if TYPE_CHECKING:
    from modelsec.watermark.resync import ResyncReport

__all__ = ["DetectionResult", "DetectionThresholds", "binomial_tail", "normal_tail", "rademacher_tail_bound"]


@dataclass(frozen=True, slots=True)
class DetectionThresholds:
    """When a mark counts as detected (the deployment gate of issue 4).

    Attributes:
        min_confidence: Minimum cosine between extracted and embedded ±1 pilot bits, an optional extra
            requirement (default 0.0: more pilot bits agree than disagree). Presence is decided by the
            false-positive bound of the Stouffer statistic, which keeps each bit's margin; a mark whose bits
            are weakened but all still leaning the right way (neuron permutation read blind, fine-tuning)
            has a low cosine and a tiny false-positive probability. 0.92 gives the rule before issue 30.
        max_false_positive: Maximum false-positive probability (the presence bound after the Bonferroni
            factor).
    """

    min_confidence: float = 0.0
    max_false_positive: float = 1e-9

    def __post_init__(self) -> None:
        if not (-1.0 <= self.min_confidence <= 1.0):
            raise PolicyError(f"min_confidence must be in [-1, 1], got {self.min_confidence}")
        if not (0.0 < self.max_false_positive <= 1.0):
            raise PolicyError(f"max_false_positive must be in (0, 1], got {self.max_false_positive}")


def binomial_tail(n: int, k: int) -> tuple[float, float]:
    """Exact `P[X >= k]` for `X ~ Binomial(n, 1/2)`, and its log10.

    Computed as `sum(comb(n, i) for i >= k) / 2**n` with Python integers (no rounding before the final
    division), so it is exact up to the one final rounding to a double; the log10 is computed from the
    integers and stays finite where the probability underflows to 0.0.

    Args:
        n: Number of compared bits (>= 0).
        k: Number of matches.

    Returns:
        `(probability, log10 probability)`; `(1.0, 0.0)` for `k <= 0`, `(0.0, -inf)` for `k > n`.
    """
    if k <= 0:
        return 1.0, 0.0
    if k > n:
        return 0.0, -math.inf
    numerator = sum(math.comb(n, i) for i in range(k, n + 1))
    return numerator / 2**n, math.log10(numerator) - n * math.log10(2)


#: Pinelis (1994), "Extremal probabilistic problems and Hotelling's T2 test under a symmetry condition",
#: Ann. Statist. 22(1): P[sum a_i e_i >= x] <= (2 e**3 / 9) P[N(0, 1) >= x] for Rademacher e_i and
#: sum a_i**2 = 1.
_PINELIS = 2 * math.e**3 / 9
_LN10 = math.log(10)


def normal_tail(z: float) -> tuple[float, float]:
    """`P[N(0, 1) >= z]` and its log10 (finite where the probability underflows).

    Where `erfc` underflows (z > 37) the log10 is that of the Mills-ratio bound `phi(z) / z`, which is an
    upper bound and exact to a relative 1 / z**2.
    """
    if not math.isfinite(z):
        return (0.0, -math.inf) if z > 0 else (1.0, 0.0)
    p = 0.5 * math.erfc(z / math.sqrt(2))
    if p > 1e-300:
        return p, math.log10(p)
    log10 = (-z * z / 2 - math.log(z * math.sqrt(2 * math.pi))) / _LN10
    return 0.0, log10


def rademacher_tail_bound(z: float) -> tuple[float, float]:
    """An upper bound on `P[S >= z]` for every `S = sum a_i e_i` with `sum a_i**2 = 1`, `e_i` i.i.d. ±1.

    `min(exp(-z**2 / 2), (2 e**3 / 9) P[N(0, 1) >= z])` for `z > 0`, 1 otherwise: Hoeffding's inequality
    (W. Hoeffding, "Probability inequalities for sums of bounded random variables", JASA 58, 1963,
    Theorem 2) and Pinelis's Gaussian comparison (Ann. Statist. 22(1), 1994). It holds for any weights
    `a_i`, so it needs no normality assumption about the host weights.

    Returns:
        `(bound, log10 bound)`.
    """
    if not z > 0:
        return 1.0, 0.0
    log10_hoeffding = -z * z / 2 / _LN10
    _, log10_normal = normal_tail(z)
    log10 = min(0.0, log10_hoeffding, math.log10(_PINELIS) + log10_normal)
    return (10.0**log10 if log10 > -323 else 0.0), log10


@dataclass(frozen=True, slots=True)
class DetectionResult:
    """What detection found.

    Attributes:
        detected: The mark is present: false_positive_probability <= thresholds.max_false_positive and
            confidence >= thresholds.min_confidence, over the pilot bits (in every mode; in `message` mode
            exactly the `blind` verdict). Says nothing about the message.
        mode: `message` (the message was given: blind presence plus the message verdict), `length` (only
            its length was given) or `blind` (length searched).
        bits: Number of compared code bits `n` (the pilot bits).
        bit_matches: Extracted bits equal to the embedded ones, `k`.
        bit_error_rate: `(n - k) / n`.
        false_positive_probability: Upper bound on the probability that a model without this key's mark
            does as well in any of the `tests` hypotheses, on either presence statistic:
            `min(1, 2 * tests * min(rademacher_tail_bound(z_score), P[Bin(n, 1/2) >= k]))` (the factor 2
            is the union bound over the two statistics). Before issue 30 it was the binomial tail alone,
            which ignores how far each bit is from its threshold.
        log10_false_positive_probability: Its log10 (finite even when the probability underflows).
        confidence: Cosine between the extracted (ties = 0) and embedded ±1 vectors, in [-1, 1].
        tests: Bonferroni factor: number of hypotheses tried (densities x message lengths).
        pilot_bits: Number of pilot bits.
        pilot_matches: Pilot bits extracted correctly.
        message_bits: Message length in bits (given or found), or None when nothing was found.
        message_matches: Bits of the given message extracted correctly at its length (only when the
            message was given).
        message_bit_error_rate: Bit error rate of the given message alone, after error correction (only
            when it was given).
        decoded_message: The extracted message bytes, at the length found (None when the length is unknown
            and nothing was detected, or when the message code's check failed: `message_decoded` False; in
            `message` mode, the blind search's message, so it may differ from the given one in length).
        min_margin: Smallest `m_b z_b` over the compared bits (negative: a bit error); units of standard
            deviations of the host correlation.
        median_margin: Median `m_b z_b`.
        density_log2: Carrier density exponent used.
        carriers: Number of carrier elements read.
        carrier_tensors: Number of tensors that carried bits.
        resynchronised: Whether a reference model re-synchronised the suspect first.
        resync: The re-synchronisation report, if any.
        thresholds: The thresholds applied.
        message_matched: Only in `message` mode (else None): the mark is present and carries exactly the
            given message (same length, every bit extracted as embedded; no bit error tolerated).
        z_score: The presence statistic: Stouffer's `sum_b m_b z_b / sqrt(n)` over the `n` pilot bits with
            carriers (unit variance under the null hypothesis; see `modelsec.watermark.detection`).
        null_p_value: `P[N(0, 1) >= z_score]` for the best hypothesis alone (no Bonferroni factor): the
            null distribution's large-carrier limit, for calibration checks; not the decision.
        binomial_false_positive_probability: The sign count's exact `P[Bin(n, 1/2) >= bit_matches]` times
            `tests` (the pre-issue-30 figure, for comparison).
        message_code: The message code of the hypothesis reported (`modelsec.watermark.message_code`:
            `crc32-conv7`, or `none` for marks made before error correction).
        message_decoded: Whether the message decoded with its check holding (crc32-conv7: the CRC-32, false
            accept 2**-32 per result); False: the message could not be decoded and `decoded_message` is
            None; None: nothing checked (`none` code, or nothing found).
        code_bit_error_rate: Only in `message` mode: the raw error rate of the message's code bits before
            correction (what the channel did; `message_bit_error_rate` is what is left after decoding).
    """

    detected: bool
    mode: str
    bits: int
    bit_matches: int
    bit_error_rate: float
    false_positive_probability: float
    log10_false_positive_probability: float
    confidence: float
    tests: int
    pilot_bits: int
    pilot_matches: int
    message_bits: int | None
    message_matches: int | None
    message_bit_error_rate: float | None
    decoded_message: bytes | None
    min_margin: float
    median_margin: float
    density_log2: int
    carriers: int
    carrier_tensors: int
    resynchronised: bool = False
    resync: ResyncReport | None = field(default=None, compare=False)
    thresholds: DetectionThresholds = DetectionThresholds()
    message_matched: bool | None = None
    z_score: float = 0.0
    null_p_value: float = 1.0
    binomial_false_positive_probability: float = 1.0
    message_code: str = "none"
    message_decoded: bool | None = None
    code_bit_error_rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (the decoded message as hex)."""
        return {
            "detected": self.detected,
            "mode": self.mode,
            "bits": self.bits,
            "bitMatches": self.bit_matches,
            "bitErrorRate": self.bit_error_rate,
            "falsePositiveProbability": self.false_positive_probability,
            "log10FalsePositiveProbability": _finite(self.log10_false_positive_probability),
            "confidence": self.confidence,
            "tests": self.tests,
            "pilotBits": self.pilot_bits,
            "pilotMatches": self.pilot_matches,
            "messageBits": self.message_bits,
            "messageMatches": self.message_matches,
            "messageBitErrorRate": self.message_bit_error_rate,
            "messageMatched": self.message_matched,
            "messageCode": self.message_code,
            "messageDecoded": self.message_decoded,
            "codeBitErrorRate": self.code_bit_error_rate,
            "decodedMessageHex": None if self.decoded_message is None else self.decoded_message.hex(),
            "minMargin": _finite(self.min_margin),
            "medianMargin": _finite(self.median_margin),
            "densityLog2": self.density_log2,
            "carriers": self.carriers,
            "carrierTensors": self.carrier_tensors,
            "resynchronised": self.resynchronised,
            "zScore": _finite(self.z_score),
            "nullPValue": self.null_p_value,
            "binomialFalsePositiveProbability": self.binomial_false_positive_probability,
            "thresholds": {
                "minConfidence": self.thresholds.min_confidence,
                "maxFalsePositiveProbability": self.thresholds.max_false_positive,
            },
        }


def _finite(x: float) -> float:
    """JSON has no infinities: clamp to +-1e308."""
    return max(-1e308, min(1e308, x)) if not math.isnan(x) else 0.0
