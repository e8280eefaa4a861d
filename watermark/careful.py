"""The careful mark, `embed`'s default for causal LMs: graded, weakest detectable, measured against a bar.

Issue 30. Order of work (an invariant):

1. The bar is checked against the probe's size first: with `n` probe prompts even no change at all bounds
   the changed rate only at `1 - 0.05 ** (1 / n)` (95 % Clopper-Pearson); a bar tighter than that is refused
   with the figures before anything is computed.
2. The probe (`fidelity.GreedyFidelityProbe`, `CAREFUL_PROMPTS` by default) runs the unmarked model once:
   greedy continuations with the top-2 gap at every step, and the bf16 yardstick.
3. Per-tensor grades come from the on-disk cache (`grading.cached_grades`, keyed by the model's root digest
   and the grading settings) or are computed in one gradient pass per projection over the probe set
   (`grading.gradient_sensitivities`).
4. The graded mark at margin `CAREFUL_KAPPA` (the weakest margin `embed` accepts) is written into a private
   sibling directory and detected on its written weights (with the message read back).
5. The probe measures it: the Clopper-Pearson upper bound on the gated changed rate must be at most
   `1 - min_unchanged`, the teacher-forced top-1 flip rate and mean KL no larger than bf16 inference's, and
   every perplexity change within `max_perplexity_change`. Then, and only then, it is renamed to `out_dir`.
   Otherwise nothing is written and `GateFailedError` gives the figures and names the two ways on: the
   weakest mark anyway (`--weakest-mark`, `weakest_anyway=True`; its figures are recorded as measured) or
   the fixed mark without measuring (`--no-fidelity-check`, `careless=True`).

What the bound covers: prompts drawn like the probe's. Not measured: other inputs, sampling decoders.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from modelsec.errors import GateFailedError, PolicyError
from modelsec.limits import Limits
from modelsec.signer.watermark_keys import WatermarkKey
from modelsec.watermark.detection import DetectionThresholds
from modelsec.watermark.embed import EmbedResult, embed_fixed
from modelsec.watermark.fidelity import (
    BOUND_CONFIDENCE,
    FidelityReport,
    GreedyFidelityProbe,
    clopper_pearson_upper,
)
from modelsec.watermark.spread_spectrum import WatermarkParams

__all__ = [
    "CAREFUL_KAPPA",
    "CAREFUL_PROMPTS",
    "CARELESS_OPTION",
    "DEFAULT_MAX_PERPLEXITY_CHANGE",
    "DEFAULT_MIN_UNCHANGED",
    "WEAKEST_OPTION",
    "embed_careful",
    "prompts_needed",
]

#: The careful mark's margin: the weakest `embed` accepts (`budget.DEFAULT_MIN_KAPPA`).
CAREFUL_KAPPA = 1.0
#: Issue 30's bar: at least this fraction of greedy continuations unchanged (gated).
DEFAULT_MIN_UNCHANGED = 0.98
#: Issue 30's bar on the perplexity change of every key (fraction).
DEFAULT_MAX_PERPLEXITY_CHANGE = 0.005
#: Prompts of the probe set whose unmarked continuations grade the tensors.
GRADING_PROMPTS = 64
WEAKEST_OPTION = "--weakest-mark (API: weakest_anyway=True)"
CARELESS_OPTION = "--no-fidelity-check (API: careless=True)"

_SUBJECTS = (
    "The old fisherman", "My neighbour", "The teacher", "A young doctor", "The committee", "Our manager",
    "The little girl", "The scientist", "A tired traveller", "The mayor", "My grandmother", "The engineer",
    "The baker", "A stranger", "The students", "The pilot", "The author", "Her brother", "The farmer",
    "The new nurse", "The captain", "A famous singer", "The lawyer", "The gardener",
)  # fmt: skip
_PREDICATES = (
    "said that", "walked into the", "could not believe", "decided to", "explained how",
    "was looking for", "remembered the day", "asked whether", "opened the", "wrote a letter to",
)  # fmt: skip
#: 240 plain English sentence starts (written for this project; no licence restrictions): enough for the
#: bar of 98 % at 95 % confidence with one changed continuation (`prompts_needed(0.98, 1)` = 238).
CAREFUL_PROMPTS: tuple[str, ...] = tuple(f"{s} {p}" for s in _SUBJECTS for p in _PREDICATES)


def prompts_needed(min_unchanged: float, changed: int = 0, confidence: float = BOUND_CONFIDENCE) -> int:
    """Fewest probe prompts whose Clopper-Pearson bound meets the bar with `changed` continuations changed."""
    allowed = 1.0 - min_unchanged
    if allowed <= 0:
        return 0
    n = max(changed + 1, math.ceil(math.log(1 - confidence) / math.log1p(-allowed)))
    while clopper_pearson_upper(changed, n, confidence) > allowed:
        n += 1 + n // 50
    return n


def embed_careful(
    model_dir: Path,
    out_dir: Path,
    key: WatermarkKey,
    message: bytes,
    *,
    params: WatermarkParams | None = None,
    thresholds: DetectionThresholds | None = None,
    limits: Limits | None = None,
    prompts: Sequence[str] = CAREFUL_PROMPTS,
    min_unchanged: float = DEFAULT_MIN_UNCHANGED,
    max_perplexity_change: float = DEFAULT_MAX_PERPLEXITY_CHANGE,
    weakest_anyway: bool = False,
    cache_dir: Path | None = None,
) -> EmbedResult:
    """Write the careful (graded, weakest detectable) mark of a causal LM if it meets issue 30's bar.

    Guarantees, on top of `embed_fixed`'s: the written model was detected at embed time with its message,
    and (unless `weakest_anyway`) on the probe set the bound on the gated changed rate, the teacher-forced
    flip rate and KL against bf16, and the perplexity change all met the bar (see the module docstring).
    `result.fidelity` records the figures (`greedy`), the probe digest and whether the grades came from
    the cache. Not guaranteed: behaviour on inputs unlike the probe's.

    Args:
        model_dir: The unmarked model (a transformers causal LM directory with safetensors weights).
        out_dir: Where to write the marked model (as for `embed_fixed`).
        key: The watermark key.
        message: The message.
        params: Scheme parameters (default: `WatermarkParams(kappa=CAREFUL_KAPPA)`).
        thresholds: Embed-time detection thresholds (default `DetectionThresholds()`: bound <= 1e-9).
        limits: Parser limits.
        prompts: Probe prompts (default `CAREFUL_PROMPTS`).
        min_unchanged: The bar on the gated unchanged rate, in (0, 1].
        max_perplexity_change: The bar on every perplexity change (fraction, >= 0).
        weakest_anyway: Write the mark even if it misses the bar (the figures are still reported).
        cache_dir: Grades cache directory (default `grading.grades_cache_dir()`).

    Returns:
        The embedding result, with `fidelity` (metric `gated-greedy-changed-upper-bound`) set.

    Raises:
        PolicyError: A bar out of range or one the probe is too small to bound (the figures say how many
            prompts it needs), a message beyond capacity, an unusable `out_dir`, or no `transformers`.
        GateFailedError: The mark is not detected at embed time, or misses the bar (the figures, and the
            options that embed anyway, are in the message). Nothing is written.
        MalformedArtifactError: The model cannot be read or loaded.
        PolicyViolationError: A link or special file in `model_dir` (before the model is loaded).
    """
    from modelsec.progress import step
    from modelsec.signer.statements import model_root_digest
    from modelsec.watermark.grading import (
        _SEED,
        GRADIENT_PROJECTIONS,
        cached_grades,
        grades_from_sensitivities,
        gradient_sensitivities,
    )
    from modelsec.watermark.output import check_out_dir, move_dir_into_place

    params = params or WatermarkParams(kappa=CAREFUL_KAPPA)
    thresholds = thresholds or DetectionThresholds()
    if not (0.0 < min_unchanged <= 1.0):
        raise PolicyError(f"the unchanged-rate bar must be in (0, 1], got {min_unchanged}")
    if not (math.isfinite(max_perplexity_change) and max_perplexity_change >= 0):
        raise PolicyError(f"the perplexity bar must be a fraction >= 0, got {max_perplexity_change}")
    best = clopper_pearson_upper(0, len(prompts)) if prompts else 1.0
    if best > 1.0 - min_unchanged:
        raise PolicyError(
            f"the fidelity bar cannot be met: {len(prompts)} probe prompts bound the changed rate at "
            f"{best:.3%} even with none changed ({BOUND_CONFIDENCE:.0%} Clopper-Pearson), over the "
            f"{1.0 - min_unchanged:.3%} that --min-unchanged {min_unchanged:g} allows; it needs at least "
            f"{prompts_needed(min_unchanged)} prompts"
        )
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_out_dir(model_dir, out_dir)
    # The directory walk refuses links and special files before transformers reads anything from it.
    root_digest = model_root_digest(model_dir, limits=limits)
    probe = GreedyFidelityProbe(prompts)
    step(f"watermark: the unmarked model's continuations of {len(prompts)} probe prompts")
    probe.prepare(model_dir)
    model = probe.model
    names = {n for n, p in model.named_parameters() if p.dim() >= 2 and p.dtype.is_floating_point}
    settings = {
        "probe": probe.digest(),
        "gradingPrompts": min(GRADING_PROMPTS, len(prompts)),
        "projections": GRADIENT_PROJECTIONS,
        "seed": _SEED,
    }
    step("watermark: grading the tensors (or reading the cached grades)")
    grades, from_cache = cached_grades(
        root_digest,
        settings,
        names,
        lambda: grades_from_sensitivities(
            gradient_sensitivities(model, probe.sequences(GRADING_PROMPTS), projections=GRADIENT_PROJECTIONS)
        ),
        cache_dir=cache_dir,
    )
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.careful-", dir=out_dir.parent))
    except OSError as e:
        raise PolicyError(f"{out_dir}: cannot create a candidate directory: {e.strerror}") from None
    try:
        marked = work / "m"
        result = embed_fixed(
            model_dir,
            marked,
            key,
            message,
            params=params,
            thresholds=thresholds,
            limits=limits,
            grades=grades,
        )
        d = result.detection
        if not d.detected or d.message_matched is False:
            raise GateFailedError(
                f"{model_dir}: watermark refused: the graded mark at kappa {params.kappa:g} is not detected "
                f"with its message at embed time (confidence {d.confidence:.3f}, false-positive probability "
                f"{d.false_positive_probability:.3g}, message bits {d.message_matches}/{d.message_bits}); "
                "shorten the message or raise --kappa"
            )
        step(f"watermark: measuring the marked model on {probe.size} probe prompts")
        fid = probe.measure([marked])
        short = fid.shortfalls(min_unchanged, max_perplexity_change)
        if short and not weakest_anyway:
            raise GateFailedError(
                f"{model_dir}: watermark refused: the weakest detectable mark (kappa {params.kappa:g}, "
                f"graded) misses the fidelity bar: {'; '.join(short)}. Measured on {probe.size} probe "
                f"prompts: {fid.summary()}. {WEAKEST_OPTION} embeds this mark anyway; {CARELESS_OPTION} "
                "embeds the fixed kappa-3 ungraded mark without measuring"
            )
        move_dir_into_place(marked, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = FidelityReport(
        metric=probe.metric,
        value=fid.changed_upper_bound,
        budget=1.0 - min_unchanged,
        probe_set_digest=probe.digest(),
        probes=probe.size,
        greedy=fid,
        met=not short,
        grades_cached=from_cache,
    )
    return dataclasses.replace(result, out_dir=out_dir, fidelity=report)
