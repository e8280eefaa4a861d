"""Embed the watermark into a safetensors model directory, shard by shard, with bounded memory.

Two passes over the shards (an invariant; see `embed_model`):

1. **Measure.** Every eligible tensor's carrier blocks are gathered through a read-only memory map and
   reduced to per-bit sums of the host (`scheme.block_statistics`); nothing is written. Memory: one
   tensor's carriers.
2. **Write.** The smallest multiplicative strengths that put every code bit at its margin (kappa;
   `code_margin` x kappa for crc32-conv7 message code bits: `WatermarkParams.bit_margins`) are solved
   (`scheme.solve_strength`); then each shard in turn is read into private memory, its carriers are changed
   in float32 (float64 for F64) and cast back to the shard's own dtype (round-to-nearest-even, other bytes
   untouched, dtype and shape kept), the per-bit sums are measured again *on the cast values*, and the
   shard is written. Each shard is streamed tensor by tensor in file order (read, mark, write): memory is
   one tensor plus the carriers' statistics, never a whole shard. Other files (config, tokenizer, index)
   are copied byte for byte; signature bundles (`model.sig` ...) are not, since they no longer match.

Every eligible tensor carries the float mark. Carrier tensors stored as F32/F64 that sit on a quantisation
grid (dequantised GGUF) also carry the grid mark (`modelsec.watermark.grid_mark`), planned in pass 1
(which candidates move) and written in pass 2: after the float mark, every 32-element block that holds a
grid candidate gets its grid values back with the grid move applied, so re-quantisation to the grid
reproduces that block exactly (ggml quantises each block on its own) and the grid votes read as
embedded. The released tensor is then off its grid and detection reads its float carriers (robust to
noise, casts, int8/int4, pruning, fine-tuning); a copy re-quantised to the grid is wholly on it again and
detection reads its grid votes (`modelsec.watermark.detection.extract_blocks`). The float carriers inside
those blocks stay unmarked, and pass 1 solves the strengths without them (`frozen_elements`). Where the
float carriers are too few to carry the code alone, the grid mark carries it and each bit's float carriers
are still marked when its margin is within reach (unmarked, their host correlation would add noise).

The output appears atomically: files are written to a fresh sibling directory that is renamed to
`out_dir` at the end. A shard that changes between the two passes is refused.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelsec.errors import MalformedArtifactError, PolicyError
from modelsec.limits import Limits
from modelsec.modelformat.openat2 import open_beneath_fd
from modelsec.watermark.detection import (
    DetectionResult,
    DetectionThresholds,
    ExtractedBlocks,
    evaluate,
    extract_blocks,
)
from modelsec.watermark.grid import GGUF_BLOCK
from modelsec.watermark.grid_mark import (
    ELEMENTS_PER_BIT,
    GRID_SCHEME,
    MIN_READABLE_PER_BIT,
    GridPlan,
    choose_moves,
    cost_of,
    find_grids,
    grid_entries,
    grid_plans,
    move,
    moved_values,
    read_candidates,
)
from modelsec.watermark.io import RAW_DTYPES, DirectorySource, ShardFile, TensorRef, decode, encode
from modelsec.watermark.message_code import AUTO_MESSAGE_CODE, DEFAULT_MESSAGE_CODE, LEGACY_MESSAGE_CODE
from modelsec.watermark.output import (
    COPY_CHUNK,
    check_out_dir,
    chunks,
    make_staging,
    move_into_place,
    write_new,
)
from modelsec.watermark.spread_spectrum import (
    CarrierPlan,
    WatermarkKey,
    WatermarkParams,
    block_statistics,
    carrier_count,
    carrier_plan,
    code_word,
    density_log2_for,
    is_eligible,
    message_bits,
    solve_strength,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from modelsec.watermark.fidelity import FidelityReport

__all__ = ["EmbedResult", "GridMarkRecord", "GriddedTensor", "TensorReport", "embed_fixed", "embed_model"]


@dataclass(frozen=True, slots=True)
class TensorReport:
    """One carrier tensor of the watermarked model.

    Attributes:
        name: Tensor name.
        dtype: safetensors dtype (unchanged).
        shape: Shape (unchanged).
        carriers: Carrier elements in it.
        max_relative_change: Largest |w' - w| / |w| over its carriers, after the cast.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    carriers: int
    max_relative_change: float


@dataclass(frozen=True, slots=True)
class GriddedTensor:
    """A carrier tensor found on a quantisation grid (`modelsec.watermark.grid`), e.g. dequantised GGUF.

    Every one carries the float mark, which moves its carriers by a fraction of their magnitude, mostly
    below one step of the grid, so re-quantising it snaps most of that back. An F32/F64 one also carries
    the grid mark (`modelsec.watermark.grid_mark`: keyed elements moved by whole steps, in blocks kept on
    the grid), which re-quantisation to this grid leaves unchanged. `EmbedResult.requantised` says whether
    the whole mark survives the round trip.

    Attributes:
        name: Tensor name.
        kind: `Q4_0`, `Q4_1` or `Q8_0`.
        carriers: Its float carrier elements.
        candidates: Its grid-mark candidates (F32/F64; 0 for F16/BF16).
    """

    name: str
    kind: str
    carriers: int
    candidates: int = 0


@dataclass(frozen=True, slots=True)
class GridMarkRecord:
    """The grid mark of an embedding (`modelsec.watermark.grid_mark`): what detection re-derives, recorded.

    Attributes:
        elements: Candidates over all grid tensors (`grid_mark.grid_elements(params)` unless a tensor has
            fewer blocks than its share).
        tensors: The grid tensors, each with its kind and candidate count (`candidates`).
    """

    elements: int
    tensors: tuple[GriddedTensor, ...]

    def to_json(self) -> dict[str, object]:
        """The record as in the attestation's `carriers.grid`."""
        return {
            "scheme": GRID_SCHEME,
            "elements": self.elements,
            "elementsPerBit": ELEMENTS_PER_BIT,
            "tensors": [{"name": t.name, "kind": t.kind, "elements": t.candidates} for t in self.tensors],
        }


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """What `embed_model` did.

    Attributes:
        out_dir: The watermarked model directory.
        params: Scheme parameters.
        density_log2: Carrier density exponent used (one carrier block per `2**k`).
        message_bits: Message length `L` in bits.
        code_bits: `pilot_bits` plus the message's code word under `params.message_code` (`L` for `none`,
            `2 * (L + 38)` for crc32-conv7).
        carriers: Carrier elements.
        tensors: The carrier tensors.
        max_relative_change: Largest |w' - w| / |w| over all weights (after the cast; fraction).
        mean_relative_change: Mean |w' - w| / |w| over the carriers (fraction).
        relative_l2_change: ||W' - W|| / ||W|| over all eligible tensors (the denominator estimated from
            the stratified carrier sample times `2**density_log2`).
        strength_min: Smallest per-bit strength `t_b`.
        strength_median: Median `t_b`.
        strength_max: Largest `t_b`.
        detection: Detection on the written weights (message known), i.e. the result at embed time.
        key_commitment: `WatermarkKey.commitment()`.
        message_commitment: `WatermarkKey.message_commitment(message)`.
        shards: Safetensors files processed.
        bytes_processed: Bytes of safetensors files read and written (each counted once).
        fidelity: The measured fidelity loss and its budget (`embed_within_budget`), or None when not
            measured.
        gridded: Carrier tensors on a quantisation grid.
        requantised: Detection (message known, same thresholds) on the written weights with every gridded
            tensor re-quantised to its grid (`modelsec.watermark.grid.requantise`), i.e. what `detect`
            finds after the model is re-released on its own grid; None when no tensor is gridded.
        grid_mark: The grid mark's candidates and tensors (F32/F64 tensors on a grid), None when there is
            none; recorded in the attestation as `carriers.grid`.
    """

    out_dir: Path
    params: WatermarkParams
    density_log2: int
    message_bits: int
    code_bits: int
    carriers: int
    tensors: tuple[TensorReport, ...]
    max_relative_change: float
    mean_relative_change: float
    relative_l2_change: float
    strength_min: float
    strength_median: float
    strength_max: float
    detection: DetectionResult
    key_commitment: str
    message_commitment: str
    shards: int
    bytes_processed: int
    fidelity: FidelityReport | None = None
    gridded: tuple[GriddedTensor, ...] = ()
    requantised: DetectionResult | None = None
    grid_mark: GridMarkRecord | None = None

    @property
    def gridded_carriers(self) -> int:
        """Carriers (float carrier elements and grid-mark candidates) in tensors on a quantisation grid."""
        return sum(g.carriers + g.candidates for g in self.gridded)

    @property
    def survives_requantisation(self) -> bool | None:
        """Whether the mark is still detected with its message after re-quantisation (None: no grid)."""
        r = self.requantised
        return None if r is None else bool(r.detected and r.message_matched is not False)

    def requantisation_notice(self) -> str | None:
        """What re-quantising to the model's own grid does to the mark, in words (None: no gridded tensor)."""
        r = self.requantised
        if r is None:
            return None
        kinds = ", ".join(sorted({g.kind for g in self.gridded}))
        where = (
            f"{len(self.gridded)} of {len(self.tensors)} carrier tensors sit on a quantisation grid "
            f"({kinds}; "
            f"{self.gridded_carriers} of {self.carriers} carriers)"
        )
        figures = (
            f"bit error rate {r.bit_error_rate:.2f}, confidence {r.confidence:.3f}, false-positive "
            f"probability {r.false_positive_probability:.3g}, message bits "
            f"{r.message_matches}/{r.message_bits}"
        )
        if self.survives_requantisation:
            return f"{where}: the mark survives re-quantisation to that grid ({figures})"
        marked_by_steps = {t.name for t in self.grid_mark.tensors} if self.grid_mark is not None else set()
        floats = sorted(g.name for g in self.gridded if g.name not in marked_by_steps)
        why = (
            f"{len(floats)} of them (e.g. {floats[0]}) are stored as F16/BF16 and carry the float mark, "
            "which re-quantisation snaps back (the grid mark, whole steps, needs F32/F64 storage); a "
            "stronger mark (larger --kappa) moves more of their weights by whole steps and may survive: "
            "this check reports it"
            if floats
            else "the grid mark's candidates do not carry every bit"
        )
        return (
            f"{where}: the mark does NOT survive re-quantisation to that grid: re-quantised, it is not "
            f"detected with its message ({figures}); {why}"
        )


def capacity_bits(carriers: int, params: WatermarkParams) -> int:
    """Longest message (bits, a multiple of 8) that gives every code bit `min_carriers_per_bit` carriers.

    The code bits are the pilot plus the message's code word under `params.message_code`
    (`modelsec.watermark.message_code.message_capacity`).
    """
    from modelsec.watermark.message_code import message_capacity

    code_bits = carriers // params.min_carriers_per_bit - params.pilot_bits
    return min(params.max_message_bits, message_capacity(code_bits, params.message_code))


def embed_model(
    model_dir: Path,
    out_dir: Path,
    key: WatermarkKey,
    message: bytes,
    *,
    params: WatermarkParams | None = None,
    thresholds: DetectionThresholds | None = None,
    limits: Limits | None = None,
    grades: Mapping[str, float] | None = None,
    careless: bool = False,
    weakest_anyway: bool = False,
) -> EmbedResult:
    """Write a watermarked copy of a model directory: the careful mark for causal LMs, by default.

    A transformers causal LM (config.json naming a `...ForCausalLM` architecture) gets the careful mark
    (`modelsec.watermark.careful.embed_careful`: cached per-tensor grades, the weakest detectable margin,
    measured against issue 30's fidelity bar and refused when it misses it) unless `careless` is set or
    `grades` are given. Every other model, and those two cases, get the fixed-strength mark of
    `embed_fixed` (margin `params.kappa`, default 3, uniform unless `grades` are given), which measures
    nothing about the model's outputs.

    Args:
        model_dir: The unmarked model (safetensors shards plus side files).
        out_dir: Where to write the marked model (see `embed_fixed`).
        key: The watermark key (never written anywhere).
        message: 1 to `max_message_bits / 8` bytes.
        params: Scheme parameters (careful default: kappa `CAREFUL_KAPPA`; fixed default:
            `WatermarkParams()`).
        thresholds: Embed-time detection thresholds (default `DetectionThresholds()`: bound <= 1e-9).
        limits: Parser limits.
        grades: Explicit per-tensor grades: the fixed mark with them (see `embed_fixed`).
        careless: The fixed kappa-3 ungraded mark even for a causal LM, nothing measured (the CLI's
            `--no-fidelity-check`).
        weakest_anyway: Careful path only: write the careful mark even when it misses the bar (the CLI's
            `--weakest-mark`; the figures are still reported).

    Returns:
        What was embedded; `fidelity` is set on the careful path.

    Raises:
        PolicyError: As for `embed_fixed`; on the careful path also a bar the probe cannot bound, or no
            `transformers` installed.
        GateFailedError: Careful path: the mark misses the bar or is not detected (nothing is written; the
            message gives the figures and names the options that embed anyway).
        MalformedArtifactError: As for `embed_fixed`, or the model cannot be loaded by the probe.
        PolicyViolationError: A symlink or special file in `model_dir`.

    Example:
        >>> from modelsec.watermark import embed_model, load_key_file
        >>> embed_model(Path("llm"), Path("llm-wm"), load_key_file(Path("wm.key")), b"acme/llm v3")
        ... # doctest: +SKIP
    """
    if not careless and grades is None and _is_causal_lm(Path(model_dir)):
        from modelsec.watermark.careful import embed_careful

        return embed_careful(
            model_dir,
            out_dir,
            key,
            message,
            params=params,
            thresholds=thresholds,
            limits=limits,
            weakest_anyway=weakest_anyway,
        )
    return embed_fixed(
        model_dir, out_dir, key, message, params=params, thresholds=thresholds, limits=limits, grades=grades
    )


def _is_causal_lm(model_dir: Path) -> bool:
    from modelsec.watermark.fidelity import CausalLMProbe, auto_probe

    return isinstance(auto_probe(model_dir), CausalLMProbe)


def embed_fixed(
    model_dir: Path,
    out_dir: Path,
    key: WatermarkKey,
    message: bytes,
    *,
    params: WatermarkParams | None = None,
    thresholds: DetectionThresholds | None = None,
    limits: Limits | None = None,
    grades: Mapping[str, float] | None = None,
) -> EmbedResult:
    """Write a watermarked copy of a safetensors model directory at a fixed strength (nothing measured).

    Guarantees: every pilot bit (and uncoded message bit) reaches `m_b z_b >= kappa` over the float carriers
    before the cast back to the stored dtype, every crc32-conv7 code bit `m_b z_b >= params.code_margin *
    kappa` (with tensors on a grid and too few float carriers for the code: every bit whose margin is within
    `max_relative_change`; the result's `detection.min_margin` reports the pilot's after the cast, over float
    and grid carriers together); no float-marked weight changes by more than `params.max_relative_change` of
    its magnitude and none flips its sign; dtypes, shapes, tensor names, header metadata and all non-carrier
    bytes are unchanged. F32/F64 tensors on a quantisation grid carry the float mark and also the grid mark
    (`modelsec.watermark.grid_mark`): every 32-element block holding one of its candidates keeps its grid
    values (its float carriers stay unmarked, and the strengths are solved without them), and at most
    `grid_mark.grid_elements(params)` elements move, each by one step of its block to a level that does
    not set the block's scale (the change is one grid step, not a fraction of the weight, and may cross
    zero). Such a tensor re-quantised to its grid is therefore the original grid tensor with the grid moves,
    whose votes read as embedded (`result.requantised` checks that on the written weights); the released
    tensor itself is off its grid and read through its float carriers. Not guaranteed: anything
    about the model's accuracy (measure fidelity on your own data; see the tests for MiniLM and a classifier).

    Args:
        model_dir: The unmarked model (safetensors shards plus side files).
        out_dir: Where to write the marked model; must not exist or be an empty directory, and must not be
            `model_dir` or inside it.
        key: The watermark key (never written anywhere).
        message: 1 to `max_message_bits / 8` bytes.
        params: Scheme parameters (defaults: `WatermarkParams()`). With `message_code` `auto` (the
            default) the message is error-corrected (crc32-conv7) unless the model cannot carry that longer
            code word (capacity or `max_relative_change`), in which case it is embedded uncoded (`none`);
            the result's `params.message_code` says which (pass 1 then runs twice).
        thresholds: Thresholds for the embed-time detection (default `DetectionThresholds()`: bound <= 1e-9).
        limits: Parser limits.
        grades: Per-tensor strength grades (tensor name -> factor in [0, 1], absent: 1): the carriers of a
            tensor move by `grade * t_b` of their magnitude, and `t_b` is solved for the graded sums, so
            every bit still reaches the margin (`modelsec.watermark.budget` grades by measured sensitivity).
            Detection does not need them.

    Returns:
        What was embedded, the change statistics and the detection at embed time.

    Raises:
        PolicyError: Empty or too long a message, a message beyond the model's capacity (for a model whose
            carriers all sit on a grid: a code bit with fewer than `grid_mark.MIN_READABLE_PER_BIT`
            candidates that have an element between their block's extremes), no eligible tensor, or an
            unusable `out_dir` (exists and not empty, inside `model_dir`, not writable).
        MalformedArtifactError: No safetensors file, a malformed header, or a shard changed between passes.
        PolicyViolationError: A symlink or special file in `model_dir`.

    Example:
        >>> from modelsec.watermark import embed_fixed, load_key_file
        >>> embed_fixed(Path("model"), Path("model-wm"), load_key_file(Path("wm.key")), b"acme/minilm v3")
        ... # doctest: +SKIP
    """
    import numpy as np

    params = params or WatermarkParams()
    thresholds = thresholds or DetectionThresholds()
    if not message:
        raise PolicyError("the watermark message is empty")
    if 8 * len(message) > params.max_message_bits:
        raise PolicyError(
            f"message too long: {8 * len(message)} bits, at most {params.max_message_bits} "
            f"({params.max_message_bits // 8} bytes)"
        )
    check_out_dir(Path(model_dir), Path(out_dir))
    bits = message_bits(message)
    codes = [params.message_code]
    if params.message_code == AUTO_MESSAGE_CODE:  # the code where the model carries it, else none
        codes = [DEFAULT_MESSAGE_CODE, LEGACY_MESSAGE_CODE]

    with DirectorySource(Path(model_dir), limits=limits) as source:
        eligible = [r for r in source.tensors() if is_eligible(r.dtype, r.shape, params, r.name)]
        if not eligible:
            raise PolicyError(
                f"{model_dir}: no tensor can carry a watermark (need float tensors of at least 2 dimensions "
                f"and {params.min_tensor_elements} elements): message too long for capacity 0"
            )
        k = density_log2_for(sum(r.numel for r in eligible), params)
        # Every eligible tensor carries the float mark; those on a quantisation grid also carry the grid
        # mark (whole steps) in the 32-element blocks of its candidates, which keep their grid values.
        kinds = find_grids(source, eligible)
        float_refs = eligible
        float_carriers = sum(carrier_count(r.shape, k, params) for r in float_refs)
        for attempt, code_name in enumerate(codes, start=1):
            try:
                params_used = replace(params, message_code=code_name)
                code = code_word(key, bits, params_used)
                n_code = len(code)
                plans = grid_plans(key, eligible, kinds, params_used)
                grid_count = sum(int(p.blocks.size) for p in plans)
                carriers = float_carriers + grid_count
                # Pass 1: measure the host (in a function, so its working set is freed before pass 2).
                host, strength, grid_work = _strengths(
                    source, float_refs, plans, key, k, params_used, code, float_carriers, grades
                )
                break
            except PolicyError:
                if attempt == len(codes):
                    raise
        params = params_used
        signed_strength = strength * np.asarray(code, dtype=np.float64)

        # Pass 2: write.
        writer = _Writer(
            source,
            Path(out_dir),
            params,
            lambda ref: carrier_plan(key, ref.name, ref.shape, k, params),
            host,
            signed_strength,
            n_code,
            grid=grid_work,
            density_log2=k,
        )
        writer.run()

    blocks = ExtractedBlocks(
        np.concatenate(writer.slots) if writer.slots else np.zeros(0, dtype=np.uint32),
        np.concatenate(writer.c) if writer.c else np.zeros(0),
        np.concatenate(writer.e) if writer.e else np.zeros(0),
        carriers,
        len(writer.c),
        k,
    )
    if writer.on_grid and writer.on_grid != set(grid_work):
        # Some grid tensors were written still wholly on their grid and others not: detection shares the
        # grid candidates over the former only, so the embed-time result is what it reads in the output.
        with DirectorySource(Path(out_dir), limits=limits) as written:
            blocks = extract_blocks(written, key, params, k)
    detection, _ = evaluate(blocks, key, params, thresholds, message=message)
    requantised = None
    if writer.gridded:
        rq = ExtractedBlocks(
            np.concatenate(writer.rq_slots), np.concatenate(writer.rq_c), np.concatenate(writer.rq_e),
            carriers, len(writer.rq_c), k,
        )  # fmt: skip
        requantised, _ = evaluate(rq, key, params, thresholds, message=message)
    active = strength[np.isfinite(strength)]
    return EmbedResult(
        out_dir=Path(out_dir),
        params=params,
        density_log2=k,
        message_bits=len(bits),
        code_bits=n_code,
        carriers=carriers,
        tensors=tuple(writer.reports),
        max_relative_change=writer.max_rel,
        mean_relative_change=writer.sum_rel / max(1, writer.count_rel),
        relative_l2_change=math.sqrt(writer.delta_sq / (writer.weight_sq * 2**k))
        if writer.weight_sq
        else 0.0,
        strength_min=float(active.min()),
        strength_median=float(np.median(active)),
        strength_max=float(active.max()),
        detection=detection,
        key_commitment=key.commitment(),
        message_commitment=key.message_commitment(message),
        shards=len(source.shards),
        bytes_processed=writer.bytes_processed,
        gridded=tuple(writer.gridded),
        requantised=requantised,
        grid_mark=GridMarkRecord(grid_count, tuple(g for g in writer.gridded if g.name in grid_work))
        if grid_work
        else None,
    )


def _strengths(
    source: DirectorySource,
    float_refs: Sequence[TensorRef],
    plans: Sequence[GridPlan],
    key: WatermarkKey,
    k: int,
    params: WatermarkParams,
    code: Sequence[int],
    float_carriers: int,
    grades: Mapping[str, float] | None,
) -> tuple[dict[str, _Host], npt.NDArray[np.float64], dict[str, tuple[GridPlan, Any]]]:
    """Pass 1, the float strengths `t_b` and the grid moves for one code word, or PolicyError.

    Raises:
        PolicyError: The model cannot carry the code word: fewer than `min_carriers_per_bit` float carriers
            per code bit and no grid tensors, too few readable grid candidates for a bit where the float
            carriers cannot carry the code alone, a strength beyond `max_relative_change`, or a grade
            outside [0, 1].
    """
    import numpy as np

    n_code = len(code)
    n_message = n_code - params.pilot_bits
    carriers = float_carriers + sum(int(p.blocks.size) for p in plans)
    float_mark = float_carriers >= n_code * params.min_carriers_per_bit
    if not float_mark and not plans:
        raise PolicyError(
            f"message too long for capacity: {n_message} code bits ({params.message_code}) need "
            f"{n_code * params.min_carriers_per_bit} carriers ({params.min_carriers_per_bit} per code "
            f"bit incl. {params.pilot_bits} pilot bits), "
            f"the model has {carriers}; this model's capacity is {capacity_bits(carriers, params)} bits"
        )
    grid_work, per_bit, moved = _grid_moves(source, plans, code, grades or {})
    frozen = {p.ref.name: (p.blocks, *moved[p.ref.name]) for p in plans}
    c0, e0, a0, q0, g2, host = _measure(source, float_refs, key, k, params, n_code, grades or {}, frozen)
    if not float_mark and int(per_bit.min()) < MIN_READABLE_PER_BIT:
        raise PolicyError(
            f"message too long for capacity: the grid mark's code bit {int(per_bit.argmin())} has "
            f"{int(per_bit.min())} readable candidates (blocks with an element between the grid's extremes), "
            f"it needs {MIN_READABLE_PER_BIT}; {len(plans)} tensors sit on a quantisation grid, and the "
            f"others have {float_carriers} float carriers, under the {n_code * params.min_carriers_per_bit} "
            f"the float mark needs for {n_message} code bits ({params.message_code}); shorten the message"
        )
    target = params.bit_margins(n_code) * (1.0 + params.margin_slack)
    strength = solve_strength(code, c0, e0, a0, q0, target, g2)
    top_grade = max((h.grade for h in host.values()), default=1.0)
    if not float_mark:
        # Too few float carriers to carry the code alone: the grid mark carries it, and the float
        # carriers are marked where they can be, so that they add to each bit's sum rather than noise.
        reachable = np.isfinite(strength) & (strength * top_grade <= params.max_relative_change)
        strength = np.where(reachable, strength, 0.0)
    worst = int(np.argmax(strength))
    if not math.isfinite(float(strength[worst])) or strength[worst] * top_grade > params.max_relative_change:
        reachable_worst = math.isfinite(float(strength[worst]))
        need = f"{strength[worst] * top_grade:.1%}" if reachable_worst else "unreachable"
        raise PolicyError(
            f"message too long for capacity: code bit {worst} needs a relative change of {need} "
            f"> max_relative_change {params.max_relative_change:.1%} ({n_message} message code bits "
            f"({params.message_code}) over {carriers} carriers); shorten the message (capacity "
            f"{capacity_bits(carriers, params)} bits) or lower kappa"
        )
    return host, strength, grid_work


def _grid_moves(
    source: DirectorySource,
    plans: Sequence[GridPlan],
    code: Sequence[int],
    grades: Mapping[str, float],
) -> tuple[dict[str, tuple[GridPlan, Any]], Any, dict[str, tuple[Any, Any]]]:
    """Pass 1 of the grid mark: which candidates of each grid tensor move (`grid_mark.choose_moves`).

    Returns:
        Tensor name -> (plan, bool mask of the candidates to move); the readable candidates per code bit;
        tensor name -> the moves' flat element indices and values (`grid_mark.moved_values`).
    """
    import numpy as np

    if not plans:
        return {}, np.zeros(len(code), dtype=np.int64), {}
    m = np.asarray(code, dtype=np.int64)
    bits, agree, readable, cost, reads = [], [], [], [], []
    for plan in plans:
        blocks = source.read_blocks(plan.ref, plan.blocks, GGUF_BLOCK)
        read = read_candidates(blocks, plan)
        reads.append(read)
        grade = _grade(grades, plan.ref.name)
        rms = math.sqrt(float(np.mean(np.square(blocks, dtype=np.float64))))
        b = (plan.slots % np.uint32(len(code))).astype(np.intp)
        bits.append(b)
        agree.append(read.votes == m[b])
        readable.append(read.positions >= 0)
        cost.append(cost_of(read, rms, grade))
    all_bits, all_readable = np.concatenate(bits), np.concatenate(readable)
    chosen = choose_moves(all_bits, np.concatenate(agree), all_readable, np.concatenate(cost), len(code))
    out: dict[str, tuple[GridPlan, Any]] = {}
    moved: dict[str, tuple[Any, Any]] = {}
    at = 0
    for plan, read in zip(plans, reads, strict=True):
        mine = chosen[at : at + plan.blocks.size]
        out[plan.ref.name] = (plan, mine)
        moved[plan.ref.name] = moved_values(plan, read, mine)
        at += plan.blocks.size
    return out, np.bincount(all_bits[all_readable], minlength=len(code)), moved


def _grade(grades: Mapping[str, float], name: str) -> float:
    grade = float(grades.get(name, 1.0))
    if not (math.isfinite(grade) and 0.0 <= grade <= 1.0):
        raise PolicyError(f"{name}: strength grade must be in [0, 1], got {grade}")
    return grade


def _measure(
    source: DirectorySource,
    eligible: Sequence[TensorRef],
    key: WatermarkKey,
    k: int,
    params: WatermarkParams,
    n_code: int,
    grades: Mapping[str, float],
    frozen: Mapping[str, tuple[Any, Any, Any]] | None = None,
) -> tuple[Any, Any, Any, Any, Any, dict[str, _Host]]:
    """Pass 1: per-bit host sums `(c, E, A, Q, E2)` (float64, `n_code`; A, Q, E2 graded), per-tensor facts.

    `frozen`: tensor name -> (the `GGUF_BLOCK`-element blocks that pass 2 restores to their grid values,
    i.e. the grid mark's candidate blocks; the flat indices and values of the grid moves in them,
    `grid_mark.moved_values`). Their carrier elements count as host, with the grid moves applied (`c`,
    `E`), but not as marked (`A`, `Q` exclude them), so the strengths solved from these sums reach the
    margin on the values pass 2 writes.
    """
    import numpy as np

    c0 = np.zeros(n_code)
    e0 = np.zeros(n_code)
    a0 = np.zeros(n_code)
    q0 = np.zeros(n_code)
    g2 = np.zeros(n_code)
    host: dict[str, _Host] = {}
    for ref in eligible:
        # Plans are rebuilt in pass 2 rather than kept: memory stays at one tensor's carriers.
        plan = carrier_plan(key, ref.name, ref.shape, k, params)
        if not plan.blocks.size:
            continue
        values = source.read_blocks(ref, plan.blocks, params.block_size)
        held = None
        if frozen and ref.name in frozen:
            grid_blocks, where, moved_to = frozen[ref.name]
            held = frozen_elements(plan, grid_blocks, ref.numel)
            # The grid moves that land on float carriers, as pass 2 writes them.
            hit = np.flatnonzero(np.isin(where // params.block_size, plan.blocks))
            if hit.size:
                values = np.array(values)
                row = np.searchsorted(plan.blocks, where[hit] // params.block_size)
                values[row, where[hit] % params.block_size] = moved_to[hit].astype(values.dtype)
        stats = block_statistics(values, plan, full=True)
        if stats is None or stats.a is None or stats.q is None:
            continue
        if held is not None:
            _unmark_frozen(stats, values, plan, held)
        grade = _grade(grades, ref.name)
        host[ref.name] = _Host(energy=stats.e * (stats.rms * stats.rms), finite=stats.finite, grade=grade)
        bit = (stats.slots % np.uint32(n_code)).astype(np.intp)
        c0 += np.bincount(bit, weights=stats.c, minlength=n_code)
        e0 += np.bincount(bit, weights=stats.e, minlength=n_code)
        a0 += np.bincount(bit, weights=stats.a * grade, minlength=n_code)
        q0 += np.bincount(bit, weights=stats.q * grade, minlength=n_code)
        g2 += np.bincount(bit, weights=stats.e * (grade * grade), minlength=n_code)
    return c0, e0, a0, q0, g2, host


def frozen_elements(
    plan: CarrierPlan, grid_blocks: npt.NDArray[np.int64], numel: int
) -> npt.NDArray[np.bool_]:
    """Which carrier elements of `plan` lie in the grid mark's candidate blocks.

    Args:
        plan: A tensor's float carrier plan.
        grid_blocks: int64 indices of its `GGUF_BLOCK`-element candidate blocks (restored to their grid
            values after the float mark).
        numel: The tensor's element count.

    Returns:
        bool (n, block_size), in `plan`'s order.
    """
    import numpy as np

    g = plan.signs.shape[1]
    hit = np.zeros(numel // GGUF_BLOCK + 1, dtype=bool)
    hit[grid_blocks] = True
    elements = plan.blocks[:, None] * g + np.arange(g, dtype=np.int64)
    out: npt.NDArray[np.bool_] = hit[elements // GGUF_BLOCK]
    return out


def _unmark_frozen(
    stats: Any, values: npt.NDArray[np.floating], plan: CarrierPlan, frozen: npt.NDArray[np.bool_]
) -> None:
    """Drop the frozen carrier elements (`frozen_elements`) from `stats.a` and `stats.q`, in place."""
    import numpy as np

    rows = np.flatnonzero(frozen.any(axis=1))
    if not rows.size:
        return
    v = np.where(frozen[rows], 0, values[rows]).astype(np.float64)
    v = np.where(np.isfinite(v), v, 0.0)
    av = np.abs(v)
    stats.a[rows] = av.sum(axis=1) / stats.rms
    stats.q[rows] = np.einsum("ij,ij->i", av * v, plan.signs[rows]) / (stats.rms * stats.rms)


@dataclass(frozen=True, slots=True)
class _Host:
    """What pass 1 learnt about a tensor's carriers: per-block sum(w**2) (float64), all finite, grade."""

    energy: npt.NDArray[np.float64]
    finite: bool
    grade: float = 1.0


class _Writer:
    """Pass 2: rewrites every file of the model into a staging directory, then renames it into place."""

    def __init__(
        self,
        source: DirectorySource,
        out_dir: Path,
        params: WatermarkParams,
        plan_for: Callable[[TensorRef], CarrierPlan],
        host: dict[str, _Host],
        signed_strength: npt.NDArray[np.float64],
        n_code: int,
        *,
        grid: Mapping[str, tuple[GridPlan, Any]] | None = None,
        density_log2: int = 0,
    ) -> None:
        self.source = source
        self.grid = dict(grid or {})
        self.density_log2 = density_log2
        self.out_dir = out_dir
        self.params = params
        self.plan_for = plan_for
        self.host = host
        self.signed_strength = signed_strength
        self.n_code = n_code
        self.slots: list[Any] = []
        self.c: list[Any] = []
        self.e: list[Any] = []
        self.reports: list[TensorReport] = []
        self.max_rel = 0.0
        self.sum_rel = 0.0
        self.count_rel = 0
        self.delta_sq = 0.0
        self.weight_sq = 0.0
        self.bytes_processed = 0
        self.gridded: list[GriddedTensor] = []
        self.on_grid: set[str] = set()
        # Per-block sums after re-quantising gridded tensors (grid votes where a tensor has the grid mark;
        # others: as written).
        self.rq_slots: list[Any] = []
        self.rq_c: list[Any] = []
        self.rq_e: list[Any] = []

    def run(self) -> None:
        # Everything is written through descriptors: the output's parent is opened once and the staging
        # directory beneath it, so a directory swapped for a link meanwhile cannot redirect a write; the model
        # is read through the descriptor the source walked.
        parent_fd = _open_out_parent(self.out_dir)
        try:
            staging = make_staging(parent_fd, self.out_dir)
            try:
                staging_fd = open_beneath_fd(parent_fd, staging, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    self._write_all(staging_fd)
                finally:
                    os.close(staging_fd)
                move_into_place(parent_fd, staging, self.out_dir)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True, dir_fd=parent_fd)
                raise
        except OSError as e:
            raise PolicyError(f"{self.out_dir}: cannot write the watermarked model: {e.strerror}") from None
        finally:
            os.close(parent_fd)

    def _write_all(self, staging_fd: int) -> None:
        from modelsec.modelformat.model_files import open_beneath
        from modelsec.progress import step
        from modelsec.signer.layout import MODEL_IGNORE_PATHS

        shards = {s.name: (s, refs) for s, refs in self.source.iter_shards()}
        for file in self.source.files:
            if file.name in MODEL_IGNORE_PATHS:
                continue
            fd = open_beneath(self.source.root_fd, file.name, what=str(self.source.root))
            with os.fdopen(fd, "rb") as f:
                if file.name in shards:
                    shard, refs = shards[file.name]
                    step(f"watermark: writing {file.name} ({shard.size} bytes)")
                    outcomes: dict[str, _Outcome] = {}
                    write_new(staging_fd, file.name, self._stream_shard(f, shard, outcomes), self.out_dir)
                    # Applied in name order, as by the whole-shard writer: the sums are equal to the last bit.
                    for ref in refs:
                        if ref.name in outcomes:
                            self._apply(outcomes[ref.name])
                    self.bytes_processed += shard.size
                else:
                    write_new(staging_fd, file.name, chunks(f), self.out_dir)

    def _stream_shard(self, f: Any, shard: ShardFile, outcomes: dict[str, _Outcome]) -> Iterator[Any]:
        """The shard's marked bytes, tensor by tensor in file order: memory is one tensor, not one shard.

        Raises:
            MalformedArtifactError: The file differs from the one pass 1 parsed (size, time, header, length).
        """
        st = os.fstat(f.fileno())
        header = f.read(len(shard.raw_header))
        if st.st_size != shard.size or st.st_mtime_ns != shard.mtime_ns or header != shard.raw_header:
            raise self._changed(shard)
        yield header
        pos = len(header)
        for info in sorted(shard.header.tensors, key=lambda t: t.begin):
            if shard.header.data_start + info.begin != pos:
                raise self._changed(shard)  # the strict parser admits no gap: the header was replaced
            host = self.host.get(info.name)
            work = self.grid.get(info.name)
            if host is None and work is None:
                for left in range(info.nbytes, 0, -COPY_CHUNK):
                    chunk = f.read(min(left, COPY_CHUNK))
                    if len(chunk) != min(left, COPY_CHUNK):
                        raise self._changed(shard)
                    yield chunk
            else:
                data = self._read_exact(f, info.nbytes, shard)
                ref = TensorRef(info.name, info.dtype, info.shape)
                outcomes[info.name] = (
                    self._mark_grid(data, ref, *work) if host is None and work is not None
                    else self._mark_tensor(data, ref, host, work)  # type: ignore[arg-type]
                )  # fmt: skip
                yield data
                del data  # release this tensor before the next one is read
            pos += info.nbytes
        if pos != shard.size or f.read(1):
            raise self._changed(shard)

    def _changed(self, shard: ShardFile) -> MalformedArtifactError:
        return MalformedArtifactError(
            f"{self.source.root}/{shard.name}: the file changed while it was being watermarked"
        )

    def _read_exact(self, f: Any, n: int, shard: ShardFile) -> npt.NDArray[np.uint8]:
        import numpy as np

        # np.empty, not bytearray(n): readinto fills the buffer, so zero-filling it first is wasted work.
        data = np.empty(n, dtype=np.uint8)
        view = data.data
        got = 0
        while got < n:
            k = f.readinto(view[got:])
            if not k:
                raise self._changed(shard)
            got += k
        del view
        return data

    def _mark_tensor(
        self,
        data: npt.NDArray[np.uint8],
        ref: TensorRef,
        host: _Host,
        work: tuple[GridPlan, Any] | None = None,
    ) -> _Outcome:
        """Change the carriers of one tensor in `data` (its raw bytes) in place; what changed.

        With `work` (a grid tensor's grid plan and chosen moves) the float mark is applied first, then every
        candidate block of the plan gets its grid values back with the grid move applied.
        """
        import numpy as np

        from modelsec.watermark.grid import grid_of, requantise

        g = self.params.block_size
        plan = self.plan_for(ref)
        raw = data.view(RAW_DTYPES[ref.dtype])
        kind = grid_of(decode(raw, ref.dtype, copy=False))
        grid = raw[: (ref.numel // g) * g].reshape(-1, g)
        old_raw = np.take(grid, plan.blocks, axis=0)
        old = decode(old_raw, ref.dtype, copy=False)
        bit = (plan.slots % np.uint32(self.n_code)).astype(np.intp)
        block_t = self.signed_strength[bit] * host.grade
        if work is not None:
            gplan, chosen = work
            rows = raw[: (ref.numel // GGUF_BLOCK) * GGUF_BLOCK].reshape(-1, GGUF_BLOCK)
            kept = np.take(rows, gplan.blocks, axis=0)  # the candidate blocks' grid values (a copy)
            before = read_candidates(kept, gplan)
        # new = old + m t s |old|, computed in place in one buffer.
        new = np.abs(old) if host.finite else np.abs(np.where(np.isfinite(old), old, 0))
        new *= plan.signs
        new *= block_t.astype(old.dtype)[:, None]
        new += old
        if work is not None:
            # The float mark, then the grid blocks back on their grid with the grid move: re-quantising
            # such a block reproduces it exactly (ggml quantises each 32-element block on its own).
            grid[plan.blocks] = new
            rows[gplan.blocks] = kept
            move(raw, gplan, before, chosen)
            written = np.take(grid, plan.blocks, axis=0)
            outcome = self._measured(ref, plan, old, written, np.isfinite(old))
            self._add_grid_moves(outcome, raw, plan, gplan, before, kept, chosen)
        elif ref.dtype in ("F32", "F64") and host.finite:
            # The stored dtype is the compute dtype and |new| <= 1.25 |old| stays finite (pass 1 squared
            # every carrier in float32 without overflow): the written values are `new`, bit for bit.
            grid[plan.blocks] = new
            written = new
            outcome = self._exact(ref, plan, host, np.abs(block_t))
        else:
            finite = np.isfinite(old)
            new_raw = encode(new, ref.dtype)
            changed = finite & (new_raw != old_raw)
            out_raw = np.where(changed, new_raw, old_raw)
            grid[plan.blocks] = out_raw
            written = decode(out_raw, ref.dtype)
            outcome = self._measured(ref, plan, old, written, finite)
        stats = block_statistics(written, plan, full=False)
        if work is not None:
            gplan = work[0]
            after = read_candidates(np.take(rows, gplan.blocks, axis=0), gplan)
            if grid_of(raw) is not None:
                # Still wholly on its grid (float moves under the grid's tolerance, e.g. a tensor graded
                # down): detection reads its grid votes.
                outcome.blocks = grid_entries(gplan, after)
                outcome.on_grid = True
            elif stats is not None:
                outcome.blocks = (stats.slots, stats.c, stats.e)
            snapped = requantise(raw, gplan.kind).reshape(-1, GGUF_BLOCK)
            outcome.requantised = grid_entries(
                gplan, read_candidates(np.take(snapped, gplan.blocks, axis=0), gplan)
            )
            outcome.gridded = GriddedTensor(ref.name, gplan.kind, plan.carriers, int(gplan.blocks.size))
        elif stats is not None:
            outcome.blocks = (stats.slots, stats.c, stats.e)
            outcome.requantised = (stats.slots, stats.c, stats.e)
            if kind is not None:
                # What the tensor reads after re-quantisation to its grid (the stored dtype's rounding
                # aside: the grid's values are float32, as dequantised GGUF weights are).
                snapped = requantise(decode(raw, ref.dtype), kind)[: (ref.numel // g) * g].reshape(-1, g)
                rq = block_statistics(np.take(snapped, plan.blocks, axis=0), plan, full=False)
                outcome.gridded = GriddedTensor(ref.name, kind, plan.carriers)
                zeros = np.zeros(len(stats.c))
                outcome.requantised = (stats.slots, zeros, zeros) if rq is None else (stats.slots, rq.c, rq.e)
        return outcome

    def _add_grid_moves(
        self,
        outcome: _Outcome,
        flat: npt.NDArray[np.floating],
        plan: CarrierPlan,
        gplan: GridPlan,
        before: Any,
        kept: npt.NDArray[np.floating],
        chosen: npt.NDArray[np.bool_],
    ) -> None:
        """Add the grid moves outside the float carrier blocks to a tensor's change statistics."""
        import numpy as np

        g = self.params.block_size
        idx = np.flatnonzero(chosen)
        where = gplan.blocks[idx] * GGUF_BLOCK + before.positions[idx]
        outside = ~np.isin(where // g, plan.blocks)
        old = kept[idx, before.positions[idx]].astype(np.float64)[outside]
        delta = flat[where[outside]].astype(np.float64) - old
        ok = old != 0
        rel = np.abs(delta[ok]) / np.abs(old[ok])
        outcome.delta_sq += float(delta @ delta)
        outcome.sum_rel += float(rel.sum())
        outcome.count_rel += int(rel.size)
        if rel.size:
            top = max(outcome.report.max_relative_change, float(rel.max()))
            outcome.report = replace(outcome.report, max_relative_change=top)

    def _mark_grid(
        self, data: npt.NDArray[np.uint8], ref: TensorRef, plan: GridPlan, chosen: Any
    ) -> _Outcome:
        """Move the chosen grid candidates of one tensor in `data` (its raw F32/F64 bytes) by whole steps."""
        import numpy as np

        from modelsec.watermark.grid import requantise

        flat = data.view(RAW_DTYPES[ref.dtype])
        rows = flat[: (ref.numel // GGUF_BLOCK) * GGUF_BLOCK].reshape(-1, GGUF_BLOCK)
        wide = flat.astype(np.float64)
        weight_sq = float(wide @ wide)
        del wide
        before = read_candidates(np.take(rows, plan.blocks, axis=0), plan)
        where = plan.blocks * GGUF_BLOCK + before.positions
        moved = where[chosen]
        old = flat[moved].astype(np.float64)
        move(flat, plan, before, chosen)
        delta = flat[moved].astype(np.float64) - old
        ok = old != 0
        rel = np.abs(delta[ok]) / np.abs(old[ok])
        after = read_candidates(np.take(rows, plan.blocks, axis=0), plan)
        snapped = requantise(flat, plan.kind).reshape(-1, GGUF_BLOCK)
        rq = read_candidates(np.take(snapped, plan.blocks, axis=0), plan)
        n = int(plan.blocks.size)
        return _Outcome(
            report=TensorReport(ref.name, ref.dtype, ref.shape, n, float(rel.max()) if rel.size else 0.0),
            # The relative L2 change divides by the carriers' energy times 2**k (a stratified sample of the
            # float carriers); a grid tensor's whole energy is scaled to match.
            weight_sq=weight_sq / 2**self.density_log2,
            delta_sq=float(delta @ delta),
            sum_rel=float(rel.sum()),
            count_rel=int((before.positions >= 0).sum()),  # the mean is over candidates, moved or not
            blocks=grid_entries(plan, after),
            requantised=grid_entries(plan, rq),
            gridded=GriddedTensor(ref.name, plan.kind, 0, n),
            on_grid=True,
        )

    def _apply(self, o: _Outcome) -> None:
        self.weight_sq += o.weight_sq
        self.delta_sq += o.delta_sq
        self.sum_rel += o.sum_rel
        self.count_rel += o.count_rel
        self.max_rel = max(self.max_rel, o.report.max_relative_change)
        self.reports.append(o.report)
        if o.blocks is not None:
            self.slots.append(o.blocks[0])
            self.c.append(o.blocks[1])
            self.e.append(o.blocks[2])
        if o.requantised is not None:
            self.rq_slots.append(o.requantised[0])
            self.rq_c.append(o.requantised[1])
            self.rq_e.append(o.requantised[2])
        if o.gridded is not None:
            self.gridded.append(o.gridded)
        if o.on_grid:
            self.on_grid.add(o.report.name)

    def _exact(
        self, ref: TensorRef, plan: CarrierPlan, host: _Host, block_strength: npt.NDArray[np.float64]
    ) -> _Outcome:
        """Change statistics of an F32/F64 tensor: each carrier moved by exactly its block's `t_b` of |w|."""
        return _Outcome(
            report=TensorReport(ref.name, ref.dtype, ref.shape, plan.carriers, float(block_strength.max())),
            weight_sq=float(host.energy.sum()),
            delta_sq=float((block_strength * block_strength) @ host.energy),
            sum_rel=float(block_strength.sum()) * self.params.block_size,
            count_rel=int(block_strength.size) * self.params.block_size,
        )

    def _measured(
        self,
        ref: TensorRef,
        plan: CarrierPlan,
        old: npt.NDArray[np.floating],
        new: npt.NDArray[np.floating],
        finite: npt.NDArray[np.bool_],
    ) -> _Outcome:
        """Change statistics measured on the cast values (F16, BF16, or non-finite carriers)."""
        import numpy as np

        old64 = np.where(finite, old, 0).astype(np.float64)
        delta = np.where(finite, new, 0).astype(np.float64) - old64
        ok = old64 != 0
        rel = np.abs(delta[ok]) / np.abs(old64[ok])
        return _Outcome(
            report=TensorReport(
                ref.name, ref.dtype, ref.shape, plan.carriers, float(rel.max()) if rel.size else 0.0
            ),
            weight_sq=float(np.einsum("ij,ij->", old64, old64)),
            delta_sq=float(np.einsum("ij,ij->", delta, delta)),
            sum_rel=float(rel.sum()),
            count_rel=int(rel.size),
        )


@dataclass(slots=True)
class _Outcome:
    """One marked tensor's contribution to the result (applied in name order, after its shard)."""

    report: TensorReport
    weight_sq: float
    delta_sq: float
    sum_rel: float
    count_rel: int
    blocks: tuple[Any, Any, Any] | None = None
    requantised: tuple[Any, Any, Any] | None = None
    gridded: GriddedTensor | None = None
    on_grid: bool = False  # written wholly on its grid: detection reads it through the grid mark


def _open_out_parent(out_dir: Path) -> int:
    try:
        return os.open(out_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise PolicyError(f"{out_dir}: cannot open the parent directory: {e.strerror}") from None
