"""Blind extraction and detection of the watermark, with a false-positive bound that holds for any host.

Detection needs only the key and the suspect weights. Order of operations (an invariant):

1. The suspect's tensors are listed (safetensors headers strictly parsed); with a reference model, the
   suspect is first re-synchronised against it (`modelsec.watermark.resync`: residual-stream, neuron,
   attention-head and RoPE-pair transforms undone, dummy neurons dropped), which is the only use of the
   reference.
2. The carrier density is re-derived from the headers exactly as at embedding time; the carriers of every
   eligible tensor are gathered and reduced to per-block correlation sums (`scheme.block_statistics`).
   Eligible F32/F64 tensors whose every block sits on a quantisation grid (`grid_mark.find_grids`: a
   dequantised GGUF release re-quantised after marking) are read through the grid mark instead
   (`modelsec.watermark.grid_mark`): each of their candidates enters the same sums as one block with
   correlation +-1 (its keyed parity vote) and energy 1, a Rademacher chip under the null like any other,
   so everything below applies to both marks at once. A marked grid tensor as released also carries the
   float mark, which takes it off its grid, so it is read through its float carriers; one tensor is never
   read both ways (re-quantised, its float carriers are noise that would drown its few grid votes).
3. Per code bit: `z_b = c_b / sqrt(E_b)`, extracted bit `sign(c_b)` (0 -> tie, counted as an error).
4. The presence statistic over the `n` pilot bits that have carriers (issue 30): Stouffer's
   `Z = sum_b m_b z_b / sqrt(n)` (`m_b` the key's ±1 pilot bits). Unlike a count of matching signs it keeps
   each bit's margin, so a mark weakened evenly (neuron permutation read blind, fine-tuning) still counts.
   Also reported: bit matches `k` of `n`, the bit error rate, the confidence (cosine between the extracted
   and the embedded ±1 vectors) and the exact binomial tail `P[Bin(n, 1/2) >= k]` of the sign count (exact
   under the null hypothesis: each extracted bit is the sign of a symmetric Rademacher sum, so +1 or -1
   with probability 1/2 each, ties only lowering `k`, independently across bits with disjoint carriers).
5. Which bits decide presence: the pilot bits only, the message length unknown (every length
   `8, 16, ..., max_message_bits` is tried, under the parameters' message code; under the default `auto`
   under crc32-conv7 and under `none`, which marks made before error correction and small models use; the
   smallest bound of step 6 is kept), whether or not the message is given, so that giving `message` never
   changes whether the mark is reported present. With the length given (`message_length`, e.g. from an
   attestation, with its recorded code) only that length is tried (under both codes for `auto`). Every
   hypothesis tried (message lengths, codes, densities, carrier sets) multiplies the false-positive bound
   (Bonferroni), so the reported value stays an upper bound for the whole search.
6. Present ("detected") iff the false-positive bound
   `2 * tests * min(rademacher_tail_bound(Z), P[Bin(n, 1/2) >= k])` <= `max_false_positive` (default 1e-9,
   the deployment gate of issue 4) and the confidence >= `min_confidence` (default 0: an optional extra
   requirement). Both statistics are kept because each sees evidence the other misses: `Z` a mark whose
   bits are all weakened but still lean the right way; the sign count a mark embedded with a tiny margin
   whose every bit still has the right sign. The factor 2 is the union bound over the two.
7. The message is read at the hypothesis found (`modelsec.watermark.message_code`): with `crc32-conv7`,
   by soft-decision Viterbi decoding of the message part's `z_b`, and reported (`decoded_message`) only
   when its CRC-32 holds (`message_decoded`; a false accept has probability 2**-32 per result), so a few
   wrong code bits are corrected and a garbage read is reported as not decoded; with `none`, as the signs.
8. With the message given, a second, separate verdict: `message_matched` iff the mark is present, the
   message found has the given length, its check holds (crc32-conv7) and every one of its bits is decoded
   as embedded (exact match). The message statistics (`message_matches` and `message_bit_error_rate` after
   correction, `code_bit_error_rate` before it, at the given message's length) are reported whatever the
   verdict.

The null distribution of `Z` (a model without this key's mark, i.e. weights that do not depend on the key's
chip stream). Each chip `s_i` is a bit of an AES-CTR keystream (a PRF, so modelled as i.i.d. fair ±1), and
the pilot bit, the carrier positions, the slots and the per-tensor RMS come from other streams or from the
weights alone. Conditionally on everything but the chips, `m_b c_b = sum_i (m_b s_i) x_i` with
`m_b s_i` again i.i.d. fair ±1, so `Z = sum_i e_i a_i` with `e_i` i.i.d. Rademacher and fixed weights
`a_i = x_i / sqrt(n E_b(i))`, `sum a_i**2 = 1` exactly: a weighted Rademacher sum with mean 0 and variance 1,
whatever the host. Its exact law depends on the host through the `a_i`; for the thousands of carriers per
bit of any real model no `a_i` dominates and it is N(0, 1) to within Berry-Esseen's
`0.56 * sum |a_i|**3` in distribution (`null_p_value = P[N(0,1) >= Z]` is that limit, and the calibration
test and `bench/bench_watermark_null.py` check its uniformity over random keys). The decision does not rely
on normality in the tail: it uses `rademacher_tail_bound`, `min(exp(-Z**2/2), 4.46 P[N(0,1) >= Z])`, which
holds for every weight vector (Hoeffding 1963; Pinelis 1994). The only assumption is the one above: the
suspect's weights were not chosen with knowledge of this key's chip stream (a model marked with another key
satisfies it). Sources: Cox et al. 1997 (spread spectrum detection), Uchida et al. 2017 (extracted weight
watermarks), Stouffer et al. 1949 (the combined z).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelsec.errors import PolicyError
from modelsec.limits import Limits
from modelsec.watermark.io import TensorRef, TensorSource, open_source
from modelsec.watermark.message_code import (
    AUTO_MESSAGE_CODE,
    DEFAULT_MESSAGE_CODE,
    LEGACY_MESSAGE_CODE,
    DecodedBits,
)
from modelsec.watermark.results import (
    DetectionResult,
    DetectionThresholds,
    binomial_tail,
    normal_tail,
    rademacher_tail_bound,
)
from modelsec.watermark.spread_spectrum import (
    CARRIER_SETS,
    WatermarkKey,
    WatermarkParams,
    block_statistics,
    carrier_plan,
    code_word,
    decode_message,
    density_log2_for,
    is_eligible,
    message_bits,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from modelsec.watermark.resync import AttentionLayout, NeuronGroup

__all__ = [
    "DetectionResult",
    "DetectionThresholds",
    "ExtractedBlocks",
    "binomial_tail",
    "detect",
    "evaluate",
    "extract_blocks",
    "normal_tail",
    "rademacher_tail_bound",
]


@dataclass(slots=True)
class ExtractedBlocks:
    """Per-block correlation sums of every carrier block of a model (bounded: one entry per carrier block).

    Attributes:
        slots: uint32 (n,) keyed slots.
        c: float64 (n,) normalised correlation sums.
        e: float64 (n,) normalised energies.
        carriers: Carrier elements read.
        tensors: Tensors that contributed.
        density_log2: Density exponent used.
    """

    slots: npt.NDArray[np.uint32]
    c: npt.NDArray[np.float64]
    e: npt.NDArray[np.float64]
    carriers: int
    tensors: int
    density_log2: int

    def per_bit(self, code_bits: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per-code-bit `(c, E)` sums for a code of `code_bits` bits (bit = slot mod code_bits)."""
        import numpy as np

        bit = (self.slots % np.uint32(code_bits)).astype(np.intp)
        return (
            np.asarray(np.bincount(bit, weights=self.c, minlength=code_bits), dtype=np.float64),
            np.asarray(np.bincount(bit, weights=self.e, minlength=code_bits), dtype=np.float64),
        )


def eligible_tensors(source: TensorSource, params: WatermarkParams) -> list[TensorRef]:
    """The tensors that carry the mark (`scheme.is_eligible`), in source order."""
    return [r for r in source.tensors() if is_eligible(r.dtype, r.shape, params, r.name)]


def extract_blocks(
    source: TensorSource,
    key: WatermarkKey,
    params: WatermarkParams,
    density_log2: int,
    *,
    grid_kinds: Mapping[str, str] | None = None,
) -> ExtractedBlocks:
    """Gather and reduce every carrier block of `source` (one tensor in memory at a time).

    Tensors wholly on a quantisation grid contribute their grid-mark candidates instead of float carriers
    (`grid_mark.find_grids`, `grid_mark.extract_grid`); every other tensor, including a marked grid tensor
    as released (its float carriers take it off the grid), contributes its float carriers.

    Args:
        source: The suspect's tensors.
        key: The watermark key.
        params: Scheme parameters.
        density_log2: Carrier density exponent.
        grid_kinds: `grid_mark.find_grids` of (at least) the eligible tensors, when already known (the
            grid found in the weights; default: found here).

    Returns:
        The per-block sums.
    """
    import numpy as np

    from modelsec.watermark.grid_mark import extract_grid, find_grids, grid_plans

    slots, cs, es = [], [], []
    carriers = tensors = 0
    refs = eligible_tensors(source, params)
    # Tensors wholly on a quantisation grid are read through the grid mark, never both ways at once.
    names = {r.name for r in refs}
    if grid_kinds is None:
        kinds = find_grids(source, refs)
    else:
        kinds = {n: k for n, k in grid_kinds.items() if n in names}
    for ref in refs:
        if ref.name in kinds:
            continue
        plan = carrier_plan(key, ref.name, ref.shape, density_log2, params)
        if not plan.blocks.size:
            continue
        stats = block_statistics(source.read_blocks(ref, plan.blocks, params.block_size), plan, full=False)
        carriers += plan.carriers
        if stats is None:
            continue
        tensors += 1
        slots.append(stats.slots)
        cs.append(stats.c)
        es.append(stats.e)
    grid_plan_list = grid_plans(key, refs, kinds, params)
    g_slots, g_c, g_e, g_count = extract_grid(source, grid_plan_list)
    slots += g_slots
    cs += g_c
    es += g_e
    carriers += g_count
    tensors += len(grid_plan_list)
    if not slots:
        empty = np.zeros(0)
        return ExtractedBlocks(np.zeros(0, dtype=np.uint32), empty, empty, carriers, 0, density_log2)
    return ExtractedBlocks(
        np.concatenate(slots), np.concatenate(cs), np.concatenate(es), carriers, tensors, density_log2
    )


@dataclass(frozen=True, slots=True)
class _Comparison:
    matches: int
    bits: int
    confidence: float
    min_margin: float
    median_margin: float
    extracted: list[int]
    z: float


def _stouffer(margins: npt.NDArray[np.float64], e: npt.NDArray[np.float64]) -> float:
    """Stouffer's `sum(m_b z_b) / sqrt(n)` over the bits with carriers (`e > 0`); 0.0 when none has any."""
    n = int((e > 0).sum())
    return float(margins[e > 0].sum()) / math.sqrt(n) if n else 0.0


def _compare(code: Sequence[int], c: npt.NDArray[np.float64], e: npt.NDArray[np.float64]) -> _Comparison:
    import numpy as np

    m = np.asarray(code, dtype=np.float64)
    extracted = np.sign(c)
    matches = int((extracted == m).sum())
    nonzero = int(np.count_nonzero(extracted))
    confidence = float(extracted @ m) / math.sqrt(nonzero * m.size) if nonzero else 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(e > 0, c / np.sqrt(e), 0.0)
    margins = m * z
    return _Comparison(
        matches=matches,
        bits=int(m.size),
        confidence=confidence,
        min_margin=float(margins.min()) if margins.size else 0.0,
        median_margin=float(np.median(margins)) if margins.size else 0.0,
        extracted=[int(v) for v in extracted],
        z=_stouffer(margins, e),
    )


def evaluate(
    blocks: ExtractedBlocks,
    key: WatermarkKey,
    params: WatermarkParams,
    thresholds: DetectionThresholds,
    *,
    message: bytes | None = None,
    message_length: int | None = None,
    tests_before: int = 0,
) -> tuple[DetectionResult, int]:
    """Decide from per-block sums (steps 3 to 8 of the module docstring).

    Args:
        blocks: From `extract_blocks`.
        key: The watermark key.
        params: Scheme parameters.
        thresholds: Decision thresholds.
        message: The expected message, if known: adds the message verdict (step 8) to the blind result.
        message_length: Its length in bits, if known (ignored when `message` is given).
        tests_before: Hypotheses already tried (earlier densities), added to the Bonferroni factor.

    Returns:
        The result and the updated number of hypotheses tried.
    """
    p = params.pilot_bits
    if message is not None:
        present, tests = evaluate(blocks, key, params, thresholds, tests_before=tests_before)
        return _with_message(present, blocks, key, params, message), tests
    pilot_code = code_word(key, [], params)
    lengths = (
        [message_length] if message_length is not None else list(range(8, params.max_message_bits + 1, 8))
    )
    best: tuple[tuple[float, float], int, str, _Comparison] | None = None
    hypotheses = [(length, code) for code in _codes(params) for length in lengths]
    for length, code in hypotheses:
        c, e = blocks.per_bit(params.code_length(length, code))
        cmp = _compare(pilot_code, c[:p], e[:p])
        rank = (-_log10_single(cmp.z, cmp.bits, cmp.matches), cmp.z)
        if best is None or rank > best[0]:
            best = (rank, length, code, cmp)
    assert best is not None
    _, length, code, pilot = best
    tests = tests_before + len(hypotheses)
    mode = "length" if message_length is not None else "blind"
    read = _read_message(blocks, key, params, length, code)
    decoded = read.message if read.valid is not False else None  # never a message that failed its check
    result = _result(mode, pilot, tests, thresholds, blocks, message_bits=length, decoded=decoded)
    result = replace(result, message_code=code, message_decoded=read.valid)
    if mode == "blind" and not result.detected:
        result = _replace_message(result)
    return result, tests


def _codes(params: WatermarkParams) -> list[str]:
    """Message codes to try: the parameters' code; for `auto` (the default) both, crc32-conv7 first."""
    if params.message_code == AUTO_MESSAGE_CODE:
        return [DEFAULT_MESSAGE_CODE, LEGACY_MESSAGE_CODE]
    return [params.message_code]


def _read_message(
    blocks: ExtractedBlocks, key: WatermarkKey, params: WatermarkParams, length: int, code: str
) -> DecodedBits:
    """Decode the message part at one (length, code) hypothesis from the per-bit `z_b`."""
    import numpy as np

    c, e = blocks.per_bit(params.code_length(length, code))
    p = params.pilot_bits
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(e[p:] > 0, c[p:] / np.sqrt(e[p:]), 0.0)
    return decode_message(key, z, length, code)


def _with_message(
    present: DetectionResult,
    blocks: ExtractedBlocks,
    key: WatermarkKey,
    params: WatermarkParams,
    message: bytes,
) -> DetectionResult:
    """Add the message verdict to a blind presence result (step 8 of the module docstring)."""
    bits = message_bits(message)
    p = params.pilot_bits
    # The code the blind search found at this length; otherwise the parameters' (first) code.
    code_name = present.message_code if present.message_bits == len(bits) else _codes(params)[0]
    code = code_word(key, bits, params, code_name)
    c, e = blocks.per_bit(len(code))
    raw = _compare(code[p:], c[p:], e[p:])
    read = _read_message(blocks, key, params, len(bits), code_name)
    matches = sum(int(a == b) for a, b in zip(read.bits, bits, strict=True))
    if read.valid is None:  # no code: the raw signs are the message
        matches = raw.matches
    return replace(
        present,
        mode="message",
        message_bits=len(bits),
        message_matches=matches,
        message_bit_error_rate=(len(bits) - matches) / len(bits),
        code_bit_error_rate=(raw.bits - raw.matches) / raw.bits,
        message_code=code_name,
        message_decoded=read.valid,
        message_matched=_message_matched(present, len(bits), matches) and read.valid is not False,
    )


def _message_matched(present: DetectionResult, given_bits: int, matches: int) -> bool:
    """Present, a message of the given length found, every given bit extracted (a tie is an error)."""
    found = present.decoded_message
    return present.detected and found is not None and 8 * len(found) == given_bits and matches == given_bits


def _replace_message(result: DetectionResult) -> DetectionResult:
    """Drop the guessed length and decoded bytes of a blind search that found nothing."""
    return replace(result, message_bits=None, decoded_message=None, message_decoded=None)


def _log10_single(z: float, bits: int, matches: int) -> float:
    """log10 of `2 * min(rademacher_tail_bound(z), P[Bin(bits, 1/2) >= matches])` (one hypothesis)."""
    return min(0.0, math.log10(2) + min(rademacher_tail_bound(z)[1], binomial_tail(bits, matches)[1]))


def _presence(z: float, bits: int, matches: int, tests: int) -> tuple[float, float, float, float]:
    """`(false-positive bound, its log10, single-hypothesis p-value, binomial FPP)` for `tests` hypotheses.

    The bound is the union bound over the two statistics (Stouffer's `Z` and the sign count) and the
    `tests` hypotheses: `min(1, 2 * tests * min(rademacher_tail_bound(Z), P[Bin(n, 1/2) >= k]))`.
    """
    log10_single = _log10_single(z, bits, matches)
    single = 10.0**log10_single if log10_single > -323 else 0.0
    fpp, log10_fpp = _bonferroni(single, log10_single, tests)
    binomial, log10_binomial = binomial_tail(bits, matches)
    return fpp, log10_fpp, normal_tail(z)[0], _bonferroni(binomial, log10_binomial, tests)[0]


def _bonferroni(fpp: float, log10_fpp: float, tests: int) -> tuple[float, float]:
    """`min(1, tests * fpp)` and its log10 (the product computed in floats; exact for `tests == 1`)."""
    log10 = min(0.0, log10_fpp + math.log10(max(1, tests)))
    if fpp > 0:
        return min(1.0, fpp * max(1, tests)), log10
    return (10.0**log10 if log10 > -323 else 0.0), log10


def _is_detected(confidence: float, log10_fpp: float, thresholds: DetectionThresholds) -> bool:
    return confidence >= thresholds.min_confidence and log10_fpp <= math.log10(thresholds.max_false_positive)


def _result(
    mode: str,
    pilot: _Comparison,
    tests: int,
    thresholds: DetectionThresholds,
    blocks: ExtractedBlocks,
    *,
    message_bits: int | None,
    decoded: bytes | None,
) -> DetectionResult:
    """The presence verdict of a pilot comparison (message statistics: `_with_message`)."""
    compared = pilot
    fpp, log10_fpp, null_p, binomial = _presence(compared.z, compared.bits, compared.matches, tests)
    detected = _is_detected(compared.confidence, log10_fpp, thresholds)
    return DetectionResult(
        detected=detected,
        mode=mode,
        bits=compared.bits,
        bit_matches=compared.matches,
        bit_error_rate=(compared.bits - compared.matches) / compared.bits if compared.bits else 1.0,
        false_positive_probability=fpp,
        log10_false_positive_probability=log10_fpp,
        confidence=compared.confidence,
        tests=tests,
        pilot_bits=pilot.bits,
        pilot_matches=pilot.matches,
        message_bits=message_bits,
        message_matches=None,
        message_bit_error_rate=None,
        decoded_message=decoded,
        min_margin=compared.min_margin,
        median_margin=compared.median_margin,
        density_log2=blocks.density_log2,
        carriers=blocks.carriers,
        carrier_tensors=blocks.tensors,
        thresholds=thresholds,
        z_score=compared.z,
        null_p_value=null_p,
        binomial_false_positive_probability=binomial,
    )


def detect(
    model: Path | str | Mapping[str, Any] | TensorSource,
    key: WatermarkKey,
    *,
    message: bytes | None = None,
    message_length: int | None = None,
    reference: Path | str | Mapping[str, Any] | TensorSource | None = None,
    groups: Sequence[NeuronGroup] | None = None,
    attention: AttentionLayout | None = None,
    tensors: Collection[str] | None = None,
    params: WatermarkParams | None = None,
    thresholds: DetectionThresholds | None = None,
    limits: Limits | None = None,
) -> DetectionResult:
    """Detect the watermark of `key` in a model (blind: the key and the suspect weights suffice).

    The carrier density is first re-derived from the suspect's headers; when that finds nothing, the two
    neighbouring densities are tried as well (a model with tensors added or removed), each try counted in
    the Bonferroni factor, and the best try is reported. Not covered blind: an attacker who adds unmarked
    tensors much larger than the marked ones dilutes every bit's correlation; pass `tensors` (and
    `params.density_log2`) from the attestation to exclude them.

    Args:
        model: Suspect model directory (safetensors shards), a mapping of numpy arrays, or a
            `TensorSource`.
        key: The watermark key.
        message: The expected message, when known: presence is still decided blind (the pilot bits), and
            `message_matched` says whether the mark carries exactly this message.
        message_length: The message length in bits, when only that is known.
        reference: The registered reference model (unmarked original or marked release), to undo
            function-preserving transforms first (`modelsec.watermark.resync`: residual-stream
            permutation, neuron permutation and scaling, dummy neurons, attention heads, KV groups, RoPE
            pairs, value/output scaling). Not used for anything else.
        groups: Neuron groups for re-synchronisation (default: inferred from tensor names).
        attention: Head geometry for re-synchronising attention (default: from the reference directory's
            `config.json`; None there: attention is not re-synchronised).
        tensors: Read carriers only from these tensors (e.g. the attestation's carrier tensors), so that
            large unmarked tensors added to the suspect cannot dilute the correlation.
        params: Scheme parameters (default: the defaults used by `embed_model`).
        thresholds: Decision thresholds (default `DetectionThresholds()`: false-positive bound <= 1e-9).
        limits: Parser limits for directories.

    Returns:
        The detection result.

    Raises:
        MalformedArtifactError: A model directory holds no safetensors file or a malformed one, or the
            reference directory's config.json is malformed (`AttentionLayout.from_config`).
        PolicyViolationError: A symlink or special file in a model directory.
        PolicyError: `message_length` is not a multiple of 8 in [8, max_message_bits], or the message is
            empty or too long.

    Example:
        >>> from modelsec.watermark import detect, load_key_file
        >>> detect(Path("suspect"), load_key_file(Path("wm.key"))).detected  # doctest: +SKIP
        True
    """
    blind_sets = params is None
    params = params or WatermarkParams()
    thresholds = thresholds or DetectionThresholds()
    if message is not None and not 0 < 8 * len(message) <= params.max_message_bits:
        raise PolicyError(
            f"the message has {8 * len(message)} bits; it must have 8 to {params.max_message_bits}"
        )
    if message_length is not None and (
        message_length % 8 or not 8 <= message_length <= params.max_message_bits
    ):
        raise PolicyError(
            f"message length {message_length} must be a multiple of 8 in [8, {params.max_message_bits}]"
        )
    owned: list[Any] = []
    try:
        source = _as_source(model, limits, owned)
        resync_report = None
        if reference is not None:
            from modelsec.watermark.resync import AttentionLayout, ResyncedSource, resynchronise

            if attention is None and isinstance(reference, (str, Path)):
                attention = AttentionLayout.from_config(Path(reference))
            ref_source = _as_source(reference, limits, owned)
            transforms, resync_report = resynchronise(source, ref_source, groups, attention=attention)
            source = ResyncedSource(source, transforms)
        if tensors is not None:
            source = _Only(source, frozenset(tensors))
        tests = 0
        result: DetectionResult | None = None
        from dataclasses import replace

        from modelsec.watermark.grid_mark import find_grids

        # The grid is a property of the weights: found once for every hypothesis (carrier set, density).
        kinds = find_grids(source, eligible_tensors(source, replace(params, carrier_set="all")))
        for p, k in _hypotheses(source, params, blind_sets=blind_sets):
            blocks = extract_blocks(source, key, p, k, grid_kinds=kinds)
            tried, tests = evaluate(
                blocks,
                key,
                p,
                thresholds,
                message=message,
                message_length=message_length,
                tests_before=tests,
            )
            if result is None or (tried.log10_false_positive_probability, -tried.confidence) < (
                result.log10_false_positive_probability,
                -result.confidence,
            ):
                result = tried
            if tried.detected:
                break
        assert result is not None
        if tests != result.tests:
            result = _rescore(result, tests)
        if resync_report is not None:
            result = replace(result, resynchronised=True, resync=resync_report)
        return result
    finally:
        for item in owned:
            item.close()


def _hypotheses(
    source: TensorSource, params: WatermarkParams, *, blind_sets: bool
) -> Iterator[tuple[WatermarkParams, int]]:
    """(carrier set, density) hypotheses in order: the given carrier set first, then the others.

    The other carrier sets are tried only with default parameters (`embed_within_budget` may have chosen
    one); each hypothesis counts in the Bonferroni factor.
    """
    sets = [params.carrier_set]
    if blind_sets:
        sets += [c for c in CARRIER_SETS if c != params.carrier_set]
    seen: set[frozenset[str]] = set()
    for carrier_set in sets:
        p = replace(params, carrier_set=carrier_set)
        refs = eligible_tensors(source, p)
        names = frozenset(r.name for r in refs)
        if (names in seen or not names) and carrier_set != params.carrier_set:
            continue  # the same hypothesis again (or none): not tried, not counted
        seen.add(names)
        total = sum(r.numel for r in refs)
        k0 = density_log2_for(total, p)
        ks = [k0] if p.density_log2 is not None else [k0, *(k for k in (k0 - 1, k0 + 1) if k >= 0)]
        for k in ks:
            yield p, k


def _rescore(result: DetectionResult, tests: int) -> DetectionResult:
    """Apply the final Bonferroni factor `tests` to a result computed with a smaller one."""
    fpp, log10_fpp, _, binomial = _presence(result.z_score, result.bits, result.bit_matches, tests)
    detected = _is_detected(result.confidence, log10_fpp, result.thresholds)
    return replace(
        result,
        tests=tests,
        binomial_false_positive_probability=binomial,
        false_positive_probability=fpp,
        log10_false_positive_probability=log10_fpp,
        detected=detected,
        message_matched=None if result.message_matched is None else result.message_matched and detected,
    )


class _Only:
    """A view of a source restricted to some tensor names."""

    def __init__(self, base: TensorSource, names: frozenset[str]) -> None:
        self.base = base
        self.names = names

    def tensors(self) -> Sequence[TensorRef]:
        return [r for r in self.base.tensors() if r.name in self.names]

    def read_blocks(
        self, ref: TensorRef, blocks: npt.NDArray[np.int64], block_size: int
    ) -> npt.NDArray[np.floating]:
        return self.base.read_blocks(ref, blocks, block_size)

    def read(self, ref: TensorRef) -> npt.NDArray[np.floating]:
        return self.base.read(ref)


def _as_source(model: Any, limits: Limits | None, owned: list[Any]) -> TensorSource:
    if hasattr(model, "read_blocks") and hasattr(model, "tensors"):
        source: TensorSource = model
        return source
    source = open_source(model, limits=limits)
    if hasattr(source, "close"):
        owned.append(source)
    return source
