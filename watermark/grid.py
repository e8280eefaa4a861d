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
the model to that grid would do; the watermark embedder uses `grid_of` to say which carrier tensors
such a round trip would snap back (a mark moves each weight by about 1 % of its magnitude, far below one
4-bit step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["GGUF_BLOCK", "GRID_KINDS", "grid_of", "requantise"]

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
    blocks = x.reshape(-1, GGUF_BLOCK)
    d, m = _scales(blocks, kind)
    offset, lo, hi = _levels(kind)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    scaled = (blocks - m[:, None]) * inv[:, None]
    if kind == "Q8_0":
        q = np.trunc(scaled + np.copysign(np.float32(0.5), scaled))  # roundf: halves away from zero
    else:
        q = np.trunc(scaled + np.float32(offset + 0.5)) - offset  # (int8)(x * id + offset + 0.5)
    q = np.clip(q + offset, lo, hi) - offset
    out: npt.NDArray[np.float32] = (q * _f16(d)[:, None] + _f16(m)[:, None]).astype(np.float32)
    return out.reshape(x.shape)
