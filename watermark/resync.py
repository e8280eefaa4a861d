"""Re-synchronisation against the registered reference model: undo neuron permutation and scaling.

The attack (Lukas et al., "SoK: How Robust is Image Classification Deep Neural Network Watermarking?",
IEEE S&P 2022; Lv et al., "A Robustness-Assured White-Box Watermark in Neural Networks", IEEE TDSC 2023):
the hidden units of a layer can be permuted, and with positively homogeneous activations (ReLU) rescaled,
while the next layer's input columns are permuted and rescaled inversely; the function is unchanged but
every carrier moves, so a blind extractor reads noise.

The answer, applied before extraction:

1. Neurons are organised in `NeuronGroup`s: the tensors whose axis 0 indexes the neurons (weights and
   biases of the producing layer) and those whose axis 1 does (the consuming layer's weights).
2. Groups are processed producer-first. For a group, the producers' rows in the suspect (with their columns
   already re-aligned by earlier groups) are matched to the reference's rows by absolute cosine similarity,
   with an optimal assignment (Hungarian method, `scipy.optimize.linear_sum_assignment`, when SciPy is
   installed; otherwise a greedy best-pair assignment). A match is accepted only if the mean matched
   cosine is at least `min_cosine`; otherwise the group is left as is and reported.
3. Each matched neuron's scale `a_j = <s_j, r_j> / <r_j, r_j>` (least squares) is divided out of the
   producers' rows and multiplied back into the consumers' columns, which are also re-permuted.

Groups are inferred from tensor names for BERT-style encoders (`*.intermediate.dense` -> `*.output.dense`,
`*.attention.self.value` -> `*.attention.output.dense`, query and key alone), LLaMA-style MLPs
(`gate_proj` + `up_proj` -> `down_proj`) and numbered sequential stacks (`net.0.weight` -> `net.2.weight`
when the shapes chain); other architectures pass `groups` explicitly.

Out of reach (documented, not attempted): permutations of the residual stream (every tensor of the model
at once), of the vocabulary (embedding rows plus tokenizer), tensors renamed or reshaped, and function-
preserving changes that are not permutations or diagonal scalings (e.g. orthogonal rotations of attention
heads). Distillation into a fresh network and retraining from scratch remove any parameter watermark: the
weights no longer descend from the marked ones, so nothing can be re-synchronised.
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelsec.watermark.io import TensorRef, TensorSource

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "AxisTransform",
    "NeuronGroup",
    "ResyncReport",
    "ResyncedSource",
    "TensorTransform",
    "infer_groups",
    "resynchronise",
]


@dataclass(frozen=True, slots=True)
class NeuronGroup:
    """Tensors that share one set of neurons.

    Attributes:
        producers: Tensors whose axis 0 indexes the neurons (the producing layer's weight and bias).
        consumers: Tensors whose axis 1 indexes the neurons (the consuming layer's weight).
    """

    producers: tuple[str, ...]
    consumers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AxisTransform:
    """The alignment of one neuron axis: `aligned[j] = suspect[perm[j]] / scale[j]`.

    Attributes:
        perm: int64 (n,) suspect index of reference neuron j.
        scale: float64 (n,) suspect neuron `perm[j]` = `scale[j]` x reference neuron j.
    """

    perm: npt.NDArray[np.int64]
    scale: npt.NDArray[np.float64]


@dataclass(slots=True)
class TensorTransform:
    """Row (axis 0) and column (axis 1) alignment of one tensor; None leaves the axis unchanged."""

    rows: AxisTransform | None = None
    cols: AxisTransform | None = None


@dataclass(slots=True)
class ResyncReport:
    """What re-synchronisation did.

    Attributes:
        groups: Groups considered.
        permuted: Groups whose neurons were found permuted.
        rescaled: Groups with at least one neuron scale off by more than 1e-3.
        mean_cosine: Mean matched cosine per aligned group (name of first producer -> value).
        skipped: Groups left unchanged, with the reason.
    """

    groups: int = 0
    permuted: int = 0
    rescaled: int = 0
    mean_cosine: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


_BERT_FFN = re.compile(r"^(?P<p>.*)\.intermediate\.dense\.weight$")
_BERT_VALUE = re.compile(r"^(?P<p>.*)\.attention\.self\.value\.weight$")
_BERT_QK = re.compile(r"^(?P<p>.*)\.attention\.self\.(query|key)\.weight$")
_LLAMA_GATE = re.compile(r"^(?P<p>.*)\.mlp\.gate_proj\.weight$")
_NUMBERED = re.compile(r"^(?P<p>.*?)\.?(?P<i>\d+)\.weight$")


def _bias(name: str, refs: dict[str, TensorRef], rows: int) -> list[str]:
    bias = name[: -len("weight")] + "bias"
    ref = refs.get(bias)
    return [bias] if ref is not None and ref.shape == (rows,) else []


def infer_groups(tensors: Sequence[TensorRef]) -> list[NeuronGroup]:
    """Infer neuron groups from tensor names and shapes (see the module docstring for the rules).

    Args:
        tensors: The model's tensors.

    Returns:
        Groups, each tensor in at most one group as producer and one as consumer.
    """
    refs = {r.name: r for r in tensors}
    groups: list[NeuronGroup] = []
    claimed: set[str] = set()

    def add(producers: list[str], consumers: list[str]) -> None:
        groups.append(NeuronGroup(tuple(producers), tuple(consumers)))
        claimed.update(producers)

    for name, ref in sorted(refs.items()):
        if len(ref.shape) < 2:
            continue
        rows = ref.shape[0]
        if m := _BERT_FFN.match(name):
            out = f"{m['p']}.output.dense.weight"
            cons = [out] if out in refs and len(refs[out].shape) >= 2 and refs[out].shape[1] == rows else []
            add([name, *_bias(name, refs, rows)], cons)
        elif m := _BERT_VALUE.match(name):
            out = f"{m['p']}.attention.output.dense.weight"
            cons = [out] if out in refs and len(refs[out].shape) >= 2 and refs[out].shape[1] == rows else []
            add([name, *_bias(name, refs, rows)], cons)
        elif _BERT_QK.match(name):
            add([name, *_bias(name, refs, rows)], [])
        elif m := _LLAMA_GATE.match(name):
            up = f"{m['p']}.mlp.up_proj.weight"
            down = f"{m['p']}.mlp.down_proj.weight"
            prods = [name] + ([up] if up in refs and refs[up].shape == ref.shape else [])
            cons = [down] if down in refs and refs[down].shape[1:2] == (rows,) else []
            add(prods, cons)

    numbered: dict[str, list[tuple[int, str]]] = {}
    for name, ref in refs.items():
        if name in claimed or len(ref.shape) < 2:
            continue
        if m := _NUMBERED.match(name):
            numbered.setdefault(m["p"], []).append((int(m["i"]), name))
    for _prefix, layers in sorted(numbered.items()):
        layers.sort()
        for (_, cur), (_, nxt) in itertools.pairwise(layers):
            rows = refs[cur].shape[0]
            if refs[nxt].shape[1] == rows and cur not in claimed:
                add([cur, *_bias(cur, refs, rows)], [nxt])
    return groups


def _order(groups: Sequence[NeuronGroup]) -> list[NeuronGroup]:
    """Producers before the groups whose producers consume them (cycles broken in input order)."""
    consumer_of = {c: i for i, g in enumerate(groups) for c in g.consumers}
    done: set[int] = set()
    ordered: list[NeuronGroup] = []
    pending = list(range(len(groups)))
    while pending:
        progress = False
        for i in list(pending):
            deps = {consumer_of[p] for p in groups[i].producers if p in consumer_of} - {i}
            if deps <= done:
                ordered.append(groups[i])
                done.add(i)
                pending.remove(i)
                progress = True
        if not progress:
            i = pending.pop(0)
            ordered.append(groups[i])
            done.add(i)
    return ordered


def _as_matrix(arr: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
    return arr.reshape(arr.shape[0], -1) if arr.ndim >= 2 else arr.reshape(-1, 1)


def _apply(arr: npt.NDArray[np.floating], t: TensorTransform) -> npt.NDArray[np.floating]:
    """Apply a tensor's alignment (rows, then columns) and return the aligned copy in its shape."""
    shape = arr.shape
    out = arr
    if t.rows is not None:
        scale = t.rows.scale.astype(arr.dtype).reshape((-1,) + (1,) * (arr.ndim - 1))
        out = out[t.rows.perm] / scale
    if t.cols is not None and arr.ndim >= 2:
        scale = t.cols.scale.astype(arr.dtype).reshape((1, -1) + (1,) * (arr.ndim - 2))
        out = out[:, t.cols.perm] * scale
    return out.reshape(shape)


def _assign(similarity: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """perm[j] = suspect index for reference j maximising the summed similarity."""
    import numpy as np

    n = similarity.shape[0]
    best: npt.NDArray[np.int64] = similarity.argmax(axis=1).astype(np.int64)
    if np.array_equal(np.sort(best), np.arange(n)):
        return best
    try:
        # Imported by name so that type checking does not need SciPy's stubs (SciPy is optional).
        linear_sum_assignment: Callable[..., tuple[Any, Any]] = importlib.import_module(
            "scipy.optimize"
        ).linear_sum_assignment
    except ImportError:
        order = np.argsort(-similarity, axis=None)
        perm = np.full(n, -1, dtype=np.int64)
        used = np.zeros(n, dtype=bool)
        for flat in order:
            j, i = divmod(int(flat), n)
            if perm[j] < 0 and not used[i]:
                perm[j] = i
                used[i] = True
        return perm
    rows, cols = linear_sum_assignment(-similarity)
    perm = np.empty(n, dtype=np.int64)
    perm[rows] = cols
    return perm


def resynchronise(
    suspect: TensorSource,
    reference: TensorSource,
    groups: Sequence[NeuronGroup] | None = None,
    *,
    min_cosine: float = 0.5,
    max_neurons: int = 16384,
) -> tuple[dict[str, TensorTransform], ResyncReport]:
    """Find the neuron permutations and scales that map the suspect back onto the reference.

    Memory: one group's tensors (suspect and reference) at a time; the transforms are vectors.

    Args:
        suspect: The suspect model.
        reference: The registered reference model (unmarked original, or the marked release).
        groups: Neuron groups; default `infer_groups(suspect.tensors())`.
        min_cosine: Minimum mean matched |cosine| to accept a group's alignment.
        max_neurons: Larger groups are skipped (an n x n similarity matrix is built).

    Returns:
        Transforms by tensor name (for `ResyncedSource`) and a report.
    """
    import numpy as np

    s_refs = {r.name: r for r in suspect.tensors()}
    r_refs = {r.name: r for r in reference.tensors()}
    groups = list(groups) if groups is not None else infer_groups(list(s_refs.values()))
    transforms: dict[str, TensorTransform] = {}
    report = ResyncReport(groups=len(groups))
    for group in _order(groups):
        label = group.producers[0] if group.producers else "?"
        names = [*group.producers, *group.consumers]
        missing = [n for n in names if n not in s_refs or n not in r_refs]
        if missing:
            report.skipped[label] = f"tensor {missing[0]!r} missing in suspect or reference"
            continue
        if any(s_refs[n].shape != r_refs[n].shape for n in names):
            report.skipped[label] = "shapes differ between suspect and reference"
            continue
        n = s_refs[group.producers[0]].shape[0]
        if n > max_neurons:
            report.skipped[label] = f"{n} neurons > max_neurons {max_neurons}"
            continue
        if any(s_refs[p].shape[0] != n for p in group.producers) or any(
            len(s_refs[c].shape) < 2 or s_refs[c].shape[1] != n for c in group.consumers
        ):
            report.skipped[label] = "producer rows and consumer columns disagree"
            continue
        s_parts, r_parts = [], []
        for p in group.producers:
            s_arr = suspect.read(s_refs[p])
            t = transforms.get(p)
            if t is not None and t.cols is not None:
                s_arr = _apply(s_arr, TensorTransform(cols=t.cols))
            s_parts.append(_as_matrix(s_arr).astype(np.float64))
            r_parts.append(_as_matrix(reference.read(r_refs[p])).astype(np.float64))
        s_mat = np.concatenate(s_parts, axis=1)
        r_mat = np.concatenate(r_parts, axis=1)
        s_norm = np.linalg.norm(s_mat, axis=1)
        r_norm = np.linalg.norm(r_mat, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            sim = (r_mat / np.where(r_norm > 0, r_norm, 1)[:, None]) @ (
                s_mat / np.where(s_norm > 0, s_norm, 1)[:, None]
            ).T
        sim = np.abs(sim)
        perm = _assign(sim)
        mean_cos = float(sim[np.arange(n), perm].mean())
        if not mean_cos >= min_cosine:
            report.skipped[label] = f"mean matched cosine {mean_cos:.3f} < {min_cosine}"
            continue
        report.mean_cosine[label] = mean_cos
        matched = s_mat[perm]
        denom = np.einsum("ij,ij->i", r_mat, r_mat)
        scale = np.einsum("ij,ij->i", matched, r_mat) / np.where(denom > 0, denom, 1)
        scale = np.where((denom > 0) & (np.abs(scale) > 1e-12) & np.isfinite(scale), scale, 1.0)
        if not np.array_equal(perm, np.arange(n)):
            report.permuted += 1
        if float(np.abs(scale - 1).max()) > 1e-3:
            report.rescaled += 1
        axis = AxisTransform(perm=perm, scale=scale)
        for p in group.producers:
            transforms.setdefault(p, TensorTransform()).rows = axis
        for c in group.consumers:
            # A consumer column scaled by 1/a_j is restored by multiplying with a_j.
            transforms.setdefault(c, TensorTransform()).cols = AxisTransform(perm=perm, scale=scale)
    return transforms, report


class ResyncedSource:
    """A `TensorSource` view of `base` with the re-synchronisation transforms applied on read.

    Transformed tensors are materialised whole (one at a time); others are passed through.
    """

    def __init__(self, base: TensorSource, transforms: dict[str, TensorTransform]) -> None:
        self.base = base
        self.transforms = transforms

    def tensors(self) -> Sequence[TensorRef]:
        """The base's tensors."""
        return self.base.tensors()

    def read(self, ref: TensorRef) -> npt.NDArray[np.floating]:
        """The aligned tensor."""
        arr = self.base.read(ref)
        t = self.transforms.get(ref.name)
        return _apply(arr, t) if t is not None else arr

    def read_blocks(
        self, ref: TensorRef, blocks: npt.NDArray[np.int64], block_size: int
    ) -> npt.NDArray[np.floating]:
        """Carrier blocks of the aligned tensor."""
        if ref.name not in self.transforms:
            return self.base.read_blocks(ref, blocks, block_size)
        flat = self.read(ref).reshape(-1)
        n_blocks = flat.size // block_size
        return flat[: n_blocks * block_size].reshape(n_blocks, block_size)[blocks]
