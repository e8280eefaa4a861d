"""Quantisation grids: whether a float tensor is a dequantised GGUF tensor, and re-quantisation to it.

A model released as GGUF (e.g. Q4_1) and converted back to safetensors keeps its weights on the grid of
its blocks: 32 consecutive elements (in row-major order) share a scale `d` (and for Q4_1 an offset `m`),
both stored as float16, and each element is an integer number of steps `d`:

* Q8_0: `x = q d`, `q` in [-127, 127], `d = amax / 127`;
* Q4_0: `x = (q - 8) d`, `q` in [0, 15], `d = -(the element of largest magnitude) / 8`;
* Q4_1: `x = q d + m`, `q` in [0, 15], `d = (max - min) / 15`, `m = min`.

(ggml's reference quantisers `quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`
in llama.cpp's ggml-quants.c; the block layout of the GGUF specification.) `grid_of` finds the grid from
the values alone: every block with a spread must sit on one kind's grid within `_TOLERANCE` of a step.
`requantise` is the reference round trip (quantise, then dequantise in float32), as anyone re-releasing
the model to that grid would do; `levels`/`dequantise` are its two halves. A float mark moves each weight
by about 1 % of its magnitude, far below one 4-bit step, so that round trip snaps it back: the watermark
therefore also marks float32/float64 tensors found on a grid by whole steps of that grid
(`modelsec.watermark.grid_mark`), which the round trip leaves unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["GGUF_BLOCK", "GRID_KINDS", "dequantise", "grid_of", "interior_levels", "levels", "requantise"]

GGUF_BLOCK = 32
GRID_KINDS = ("Q4_0", "Q4_1", "Q8_0")
_TOLERANCE = 1e-3  # of a step: float32 dequantisation errors are ~1e-7 of a step


def _f16(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    import numpy as np

    return x.astype(np.float16).astype(np.float32)


def _scales(
    blocks: npt.NDArray[np.float32], kind: str
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Per-block `(d, m)` as the reference quantiser computes them (float32, before the float16 store)."""
    import numpy as np

    zero = np.zeros(blocks.shape[0], dtype=np.float32)
    if kind == "Q4_1":
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        return (hi - lo) / np.float32(15), lo
    idx = np.abs(blocks).argmax(axis=1)
    extreme = blocks[np.arange(blocks.shape[0]), idx]
    if kind == "Q4_0":
        return extreme / np.float32(-8), zero
    return np.abs(extreme) / np.float32(127), zero


def _levels(kind: str) -> tuple[int, int, int]:
    """(offset, lowest q, highest q) of a kind."""
    return {"Q4_0": (8, 0, 15), "Q4_1": (0, 0, 15), "Q8_0": (0, -127, 127)}[kind]


def grid_of(values: npt.NDArray[np.floating]) -> str | None:
    """The quantisation grid a tensor's values sit on (`Q4_0`, `Q4_1` or `Q8_0`), or None.

    Args:
        values: The tensor's values, any shape whose element count is a multiple of `GGUF_BLOCK`
            (others: None), float16/bfloat16/float32/float64.

    Returns:
        The first kind (in the order Q4_0, Q4_1, Q8_0: the finer grids contain the coarser ones' values)
        on whose grid every block with a spread lies within `_TOLERANCE` of a step; None when some block
        lies on none, every block is constant, or a value is not finite.
    """
    import numpy as np

    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    if flat.size == 0 or flat.size % GGUF_BLOCK or not np.isfinite(flat).all():
        return None
    blocks = flat.reshape(-1, GGUF_BLOCK)
    spread = blocks.max(axis=1) > blocks.min(axis=1)
    if not spread.any():
        return None
    blocks = blocks[spread]
    head = blocks[:64]  # most tensors are on no grid: a few blocks tell, before the whole tensor is checked
    for kind in GRID_KINDS:
        if _on_grid(head, kind) and _on_grid(blocks, kind):
            return kind
    return None


def _on_grid(blocks: npt.NDArray[np.float32], kind: str) -> bool:
    """Whether every block (rows with a spread) lies on `kind`'s grid within `_TOLERANCE` of a step."""
    import numpy as np

    d, m = _scales(blocks, kind)
    offset, lo, hi = _levels(kind)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (blocks - m[:, None]) / d[:, None]
    r = np.rint(q)
    return bool(
        np.isfinite(q).all()
        and (np.abs(q - r) <= _TOLERANCE).all()
        and (r >= lo - offset).all()
        and (r <= hi - offset).all()
    )


def levels(
    blocks: npt.NDArray[np.floating], kind: str
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The reference quantiser of ggml on whole blocks: integer levels and the float16-stored `(d, m)`.

    The level is the signed step count (`x = level d + m`): `q - 8` for Q4_0 (in [-8, 7]), `q` for Q4_1
    (in [0, 15]) and Q8_0 (in [-127, 127]). Rounding as `quantize_row_*_ref` in llama.cpp's ggml-quants.c:
    `(int8)(x / d + offset + 0.5)` for the 4-bit kinds (clamped to 15), `roundf` for Q8_0, with the inverse
    scale `1 / d` taken from the float32 `d` before it is stored as float16.

    Args:
        blocks: (n, `GGUF_BLOCK`) float32/float64 values.
        kind: `Q4_0`, `Q4_1` or `Q8_0`.

    Returns:
        `(levels int32 (n, GGUF_BLOCK), d float32 (n,), m float32 (n,))`, `d` and `m` rounded through float16
        as stored (`m` is 0 for the symmetric kinds).

    Raises:
        ValueError: An unknown kind or rows that are not `GGUF_BLOCK` wide (programming errors).
    """
    import numpy as np

    if kind not in GRID_KINDS:
        raise ValueError(f"unknown quantisation kind {kind!r}")
    b = np.asarray(blocks, dtype=np.float32)
    if b.ndim != 2 or b.shape[1] != GGUF_BLOCK:
        raise ValueError(f"blocks must be (n, {GGUF_BLOCK}), got {b.shape}")
    d, m = _scales(b, kind)
    offset, lo, hi = _levels(kind)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    scaled = (b - m[:, None]) * inv[:, None]
    if kind == "Q8_0":
        q = np.trunc(scaled + np.copysign(np.float32(0.5), scaled))  # roundf: halves away from zero
    else:
        q = np.trunc(scaled + np.float32(offset + 0.5)) - offset  # (int8)(x * id + offset + 0.5)
    q = np.clip(q + offset, lo, hi) - offset
    return q.astype(np.int32), _f16(d), _f16(m)


def dequantise(
    level: npt.NDArray[np.integer], d: npt.NDArray[np.float32], m: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """`level * d + m` in float32, as ggml's `dequantize_row_*` and gguf-py compute it (broadcasting).

    Args:
        level: Integer levels (any shape broadcasting against `d` and `m`).
        d: float16-stored scales, as float32.
        m: float16-stored minima (Q4_1) or zeros, as float32.
    """
    import numpy as np

    out: npt.NDArray[np.float32] = (level.astype(np.float32) * d + m).astype(np.float32)
    return out


def interior_levels(kind: str) -> tuple[int, int]:
    """The levels `(lowest, highest)` that never set a block's scale or minimum.

    Q4_1's levels 0 and 15 are its minimum and maximum, which define `m` and `d`; Q4_0's level -8 and
    Q8_0's +-127 are the block's element of largest magnitude, which defines `d`. An element moved between
    interior levels leaves those elements, hence `(d, m)`, unchanged, so re-quantisation reproduces every
    level (see `modelsec.watermark.grid_mark`).
    """
    return {"Q4_0": (-7, 7), "Q4_1": (1, 14), "Q8_0": (-126, 126)}[kind]


def requantise(values: npt.NDArray[np.floating], kind: str) -> npt.NDArray[np.float32]:
    """Quantise to `kind` with ggml's reference rounding and dequantise (float32, same shape).

    Args:
        values: Element count a multiple of `GGUF_BLOCK`.
        kind: `Q4_0`, `Q4_1` or `Q8_0`.

    Raises:
        ValueError: An unknown kind or an element count that is not a multiple of `GGUF_BLOCK` (a
            programming error: callers check with `grid_of`).
    """
    import numpy as np

    if kind not in GRID_KINDS:
        raise ValueError(f"unknown quantisation kind {kind!r}")
    x = np.asarray(values, dtype=np.float32)
    if x.size % GGUF_BLOCK:
        raise ValueError(f"{x.size} elements is not a whole number of {GGUF_BLOCK}-element blocks")
    q, d, m = levels(x.reshape(-1, GGUF_BLOCK), kind)
    return dequantise(q, d[:, None], m[:, None]).reshape(x.shape)
