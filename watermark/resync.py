"""Re-synchronisation against the registered reference model: undo function-preserving transforms.

The attacks (Lukas et al., "SoK: How Robust is Image Classification Deep Neural Network Watermarking?",
IEEE S&P 2022; Pan/Yan et al., "Rethinking White-Box Watermarks on Deep Learning Models under Neural
Structural Obfuscation", USENIX Security 2023; Fernandez et al., "Functional invariants to watermark large
transformers", ICASSP 2024): a network's hidden units can be permuted, rescaled, rotated or padded with
dummies while the adjacent layers compensate; the function is unchanged but every carrier moves, so a blind
extractor reads noise. Each transform below is undone before extraction by matching the suspect's slices to
the reference's (the suspect is mapped back onto the reference's layout, shapes included):

1. **Residual stream** (LLaMA-family names): a permutation of the hidden dimensions applied to every tensor
   at once. Recovered from the token embedding's columns (or the output head's when there is no
   embedding), matched to the reference's by cosine with an optimal assignment; then applied to every
   tensor's hidden axis (`_hidden_axis`: input columns of q/k/v/gate/up and the head, output rows of o/down,
   the norm weights).
2. **Neurons** (`NeuronGroup`s, producer-first): the producers' rows (e.g. `gate_proj` + `up_proj`) are
   matched to the reference's by absolute cosine (Hungarian method, `scipy.optimize.linear_sum_assignment`,
   when SciPy is installed; otherwise greedy best-pair). A match is accepted only if the mean matched cosine
   is at least `min_cosine`. Each tensor's own least-squares scale per neuron (`<s_j, r_j> / <r_j, r_j>`;
   rows of producers, columns of consumers) is divided out, so a scale moved between `up_proj` and
   `down_proj` is undone whatever the activation. **Dummy neurons**: when the suspect has more neurons than
   the reference, each reference neuron is matched to a distinct suspect neuron and the rest are dropped
   (reported, with the largest |weight| of their consumer columns: 0 when they were function-preserving
   dummies with zero out-weights).
3. **Attention** (with an `AttentionLayout`: heads, KV heads, head dimension, from the reference's
   `config.json`): query heads and KV groups are matched as blocks of `head_dim` rows (permutation of heads,
   of KV groups, GQA), scored by how much of each RoPE pair's row space the reference pair spans; inside a
   matched head each RoPE pair `(i, i + head_dim/2)` (the Hugging Face `rotate_half` layout) gets the 2 x 2
   least-squares map onto the reference pair, which undoes a rotation inside the pair with any scaling
   (query and key rotated alike, the key scaled inversely); value rows and output columns are matched and
   rescaled one by one (value dimensions permuted or scaled, the output compensating).

Blind (no reference) versus reference: the mark is multiplicative on each weight, so scaling a neuron,
a head or a whole tensor leaves every chip's sign correlation intact and is read blind; a permutation or a
rotation moves carriers and needs the reference. Detection sums the evidence of all tensors
(`modelsec.watermark.detection`), so a transform that touches only some tensors (MLP permutation, attention
transforms) may still leave the mark detectable blind from the others; the residual-stream permutation
touches every carrier and always needs the reference. No part of this scheme is made invariant by design.

Groups are inferred from tensor names for BERT-style encoders (`*.intermediate.dense` -> `*.output.dense`,
`*.attention.self.value` -> `*.attention.output.dense`, query and key alone), LLaMA-style MLPs
(`gate_proj` + `up_proj` -> `down_proj`) and numbered sequential stacks (`net.0.weight` -> `net.2.weight`
when the shapes chain); other architectures pass `groups` explicitly.

Out of reach (documented, not attempted): permutations of the vocabulary (embedding rows plus tokenizer),
tensors renamed or reshaped, dense orthogonal rotations of the residual stream (not function-preserving
through RMSNorm's per-dimension weights unless folded first), dummy attention heads. Distillation into a
fresh network and retraining from scratch remove any parameter watermark: the weights no longer descend
from the marked ones, so nothing can be re-synchronised.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelsec.errors import MalformedArtifactError
from modelsec.safe_io import read_regular_file
from modelsec.watermark.io import TensorRef, TensorSource

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "AttentionLayout",
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
        perm: int64 (n,) suspect index of reference neuron j (n may be smaller than the suspect's axis:
            the other suspect neurons are dropped).
        scale: float64 (n,) suspect neuron `perm[j]` = `scale[j]` x reference neuron j.
    """

    perm: npt.NDArray[np.int64]
    scale: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PairMix:
    """A 2 x 2 map per row pair, applied after the row permutation: `[r_a; r_b] <- inv[p] @ [r_a; r_b]`.

    Attributes:
        pairs: int64 (p, 2) row indices (in the aligned order).
        inverse: float64 (p, 2, 2) the inverse of each pair's fitted suspect-from-reference map.
    """

    pairs: npt.NDArray[np.int64]
    inverse: npt.NDArray[np.float64]


@dataclass(slots=True)
class TensorTransform:
    """Row (axis 0) and column (axis 1) alignment of one tensor; None leaves the axis unchanged.

    Applied in the order: rows (permutation and scale), row pairs (`mix`), columns.
    """

    rows: AxisTransform | None = None
    cols: AxisTransform | None = None
    mix: PairMix | None = None


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """Head geometry of a LLaMA-family model (needed to match heads and RoPE pairs).

    Attributes:
        heads: Query heads per layer (`num_attention_heads`).
        kv_heads: Key/value heads per layer (`num_key_value_heads`; GQA when fewer than `heads`).
        head_dim: Dimensions per head (`head_dim`, default hidden / heads); even (RoPE pairs).
    """

    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, model_dir: Path) -> AttentionLayout | None:
        """The layout from `model_dir/config.json`, or None when it has no attention fields.

        Raises:
            MalformedArtifactError: config.json is not a regular file of at most 1 MiB holding a JSON
                object, or its head fields are not positive integers that divide consistently.
        """
        path = model_dir / "config.json"
        if not path.exists():
            return None
        raw = read_regular_file(
            path, "reference config.json", max_bytes=1 << 20, error=MalformedArtifactError
        )
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise MalformedArtifactError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise MalformedArtifactError(f"{path}: not a JSON object")
        heads, hidden = data.get("num_attention_heads"), data.get("hidden_size")
        if heads is None or hidden is None:
            return None
        kv = data.get("num_key_value_heads", heads)
        head_dim = data.get("head_dim")
        if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
            head_dim = hidden // heads
        fields = {"num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim}
        ints: dict[str, int] = {}
        for name, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1 << 20:
                raise MalformedArtifactError(f"{path}: {name} must be a positive integer, got {value!r}")
            ints[name] = value
        n_heads, n_kv, dim = ints["num_attention_heads"], ints["num_key_value_heads"], ints["head_dim"]
        if n_heads % n_kv or dim % 2:
            raise MalformedArtifactError(
                f"{path}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}, or "
                f"head_dim {dim} is odd"
            )
        return cls(heads=n_heads, kv_heads=n_kv, head_dim=dim)


@dataclass(slots=True)
class ResyncReport:
    """What re-synchronisation did.

    Attributes:
        groups: Groups considered.
        permuted: Groups whose neurons were found permuted.
        rescaled: Groups with at least one neuron scale off by more than 5 % (the mark itself moves the
            least-squares scales by well under that).
        mean_cosine: Mean matched cosine per aligned group (name of first producer -> value).
        skipped: Groups left unchanged, with the reason.
        residual_permuted: The residual stream (hidden dimensions) was found permuted.
        attention_layers: Attention layers aligned (heads, KV groups, RoPE pairs, value/output).
        dropped_neurons: Suspect neurons with no reference counterpart, dropped (dummy neurons).
        dropped_max_out_weight: Largest |weight| in the consumer columns of the dropped neurons (0.0: the
            dummies had zero out-weights, i.e. they did not change the function).
    """

    groups: int = 0
    permuted: int = 0
    rescaled: int = 0
    mean_cosine: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    residual_permuted: bool = False
    attention_layers: int = 0
    dropped_neurons: int = 0
    dropped_max_out_weight: float = 0.0


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
    """Apply a tensor's alignment (rows, row pairs, then columns) and return the aligned copy."""
    out = arr
    if t.rows is not None:
        scale = t.rows.scale.astype(arr.dtype).reshape((-1,) + (1,) * (arr.ndim - 1))
        out = out[t.rows.perm] / scale
    if t.mix is not None:
        out = out.copy()
        a, b = out[t.mix.pairs[:, 0]], out[t.mix.pairs[:, 1]]
        inv = t.mix.inverse.astype(arr.dtype)
        out[t.mix.pairs[:, 0]] = inv[:, 0, 0, None] * a + inv[:, 0, 1, None] * b
        out[t.mix.pairs[:, 1]] = inv[:, 1, 0, None] * a + inv[:, 1, 1, None] * b
    if t.cols is not None and arr.ndim >= 2:
        scale = t.cols.scale.astype(arr.dtype).reshape((1, -1) + (1,) * (arr.ndim - 2))
        out = out[:, t.cols.perm] * scale
    return out


def _aligned_shape(shape: tuple[int, ...], t: TensorTransform | None) -> tuple[int, ...]:
    if t is None:
        return shape
    dims = list(shape)
    if t.rows is not None:
        dims[0] = int(t.rows.perm.size)
    if t.cols is not None and len(dims) >= 2:
        dims[1] = int(t.cols.perm.size)
    return tuple(dims)


def _assign(similarity: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """perm[j] = distinct suspect index for reference j maximising the summed similarity.

    `similarity` is (reference n, suspect m) with m >= n; the m - n unmatched suspect indices are dropped.
    """
    import numpy as np

    n, m = similarity.shape
    best: npt.NDArray[np.int64] = similarity.argmax(axis=1).astype(np.int64)
    if np.unique(best).size == n:
        return best
    try:
        # Imported by name so that type checking does not need SciPy's stubs (SciPy is optional).
        linear_sum_assignment: Callable[..., tuple[Any, Any]] = importlib.import_module(
            "scipy.optimize"
        ).linear_sum_assignment
    except ImportError:
        order = np.argsort(-similarity, axis=None)
        perm = np.full(n, -1, dtype=np.int64)
        used = np.zeros(m, dtype=bool)
        for flat in order:
            j, i = divmod(int(flat), m)
            if perm[j] < 0 and not used[i]:
                perm[j] = i
                used[i] = True
        return perm
    rows, cols = linear_sum_assignment(-similarity)
    perm = np.empty(n, dtype=np.int64)
    perm[rows] = cols
    return perm


def _cosines(r_mat: npt.NDArray[np.floating], s_mat: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """|cosine| between every reference row (n) and suspect row (m): (n, m)."""
    import numpy as np

    r_norm = np.linalg.norm(r_mat, axis=1)
    s_norm = np.linalg.norm(s_mat, axis=1)
    sim = (r_mat / np.where(r_norm > 0, r_norm, 1)[:, None]) @ (
        s_mat / np.where(s_norm > 0, s_norm, 1)[:, None]
    ).T
    return np.asarray(np.abs(sim), dtype=np.float64)


def _ls_scale(s_mat: npt.NDArray[np.floating], r_mat: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """Per-row least-squares scale `<s_j, r_j> / <r_j, r_j>` (1.0 where undefined)."""
    import numpy as np

    denom = np.einsum("ij,ij->i", r_mat, r_mat)
    scale = np.einsum("ij,ij->i", s_mat, r_mat) / np.where(denom > 0, denom, 1)
    return np.where((denom > 0) & (np.abs(scale) > 1e-12) & np.isfinite(scale), scale, 1.0)


_LLAMA_IN = re.compile(r"\.(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)\.weight$")
_LLAMA_OUT = re.compile(r"\.(self_attn\.o_proj|mlp\.down_proj)\.weight$")
_LLAMA_ATTN = re.compile(r"^(?P<p>.*)\.self_attn\.q_proj\.weight$")
_EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "lm_head.weight")


def _hidden_axis(name: str, shape: tuple[int, ...], hidden: int) -> int | None:
    """The axis of a LLaMA-family tensor that indexes the residual stream, or None."""
    if len(shape) == 1:
        return 0 if shape[0] == hidden and name.endswith("norm.weight") else None
    if len(shape) != 2:
        return None
    if _LLAMA_IN.search(name) or name in _EMBED_NAMES:
        return 1 if shape[1] == hidden else None
    if _LLAMA_OUT.search(name):
        return 0 if shape[0] == hidden else None
    return None


def resynchronise(
    suspect: TensorSource,
    reference: TensorSource,
    groups: Sequence[NeuronGroup] | None = None,
    *,
    attention: AttentionLayout | None = None,
    min_cosine: float = 0.5,
    max_neurons: int = 16384,
) -> tuple[dict[str, TensorTransform], ResyncReport]:
    """Find the transforms that map the suspect back onto the reference (steps 1-3 of the module docstring).

    Memory: one group's or layer's tensors (suspect and reference) at a time, plus an n x m similarity
    matrix per group; the transforms are vectors.

    Args:
        suspect: The suspect model.
        reference: The registered reference model (unmarked original, or the marked release).
        groups: Neuron groups; default `infer_groups(suspect.tensors())`.
        attention: Head geometry; None skips step 3 (attention is then left as is and reported).
        min_cosine: Minimum mean matched |cosine| (or pair-subspace overlap) to accept an alignment.
        max_neurons: Larger groups are skipped (an n x m similarity matrix is built).

    Returns:
        Transforms by tensor name (for `ResyncedSource`) and a report. Nothing is trusted from the
        reference but its weights: an unrelated reference fails the `min_cosine` test and is reported.
    """
    s_refs = {r.name: r for r in suspect.tensors()}
    r_refs = {r.name: r for r in reference.tensors()}
    groups = list(groups) if groups is not None else infer_groups(list(s_refs.values()))
    transforms: dict[str, TensorTransform] = {}
    report = ResyncReport(groups=len(groups))
    ctx = _Context(suspect, reference, s_refs, r_refs, transforms, report, min_cosine, max_neurons)
    ctx.residual()
    for group in _order(groups):
        ctx.neurons(group)
    ctx.refine_consumers()
    if attention is not None:
        for name in sorted(s_refs):
            if m := _LLAMA_ATTN.match(name):
                ctx.attention(m["p"], attention)
    return transforms, report


@dataclass(slots=True)
class _Context:
    suspect: TensorSource
    reference: TensorSource
    s_refs: dict[str, TensorRef]
    r_refs: dict[str, TensorRef]
    transforms: dict[str, TensorTransform]
    report: ResyncReport
    min_cosine: float
    max_neurons: int
    consumers: list[str] = field(default_factory=list)

    def read(self, name: str, rows: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float64]:
        """The suspect tensor with the transforms found so far, as float64 (optionally only some rows).

        Non-finite values read as 0 for matching (as they do for extraction), so they cannot break it.
        """
        import numpy as np

        arr = self.suspect.read(self.s_refs[name])
        t = self.transforms.get(name)
        out = _apply(arr, t) if t is not None else arr
        if rows is not None:
            out = out[rows]
        return np.nan_to_num(np.asarray(out, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)

    def ref(self, name: str, rows: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float64]:
        """The reference tensor as float64 (optionally only some rows), non-finite values as 0."""
        import numpy as np

        arr = self.reference.read(self.r_refs[name])
        if rows is not None:
            arr = arr[rows]
        return np.nan_to_num(np.asarray(arr, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)

    def residual(self) -> None:
        """Step 1: the residual-stream permutation, from the embedding (or head) columns."""
        import numpy as np

        anchor = next((n for n in _EMBED_NAMES if n in self.s_refs and n in self.r_refs), None)
        if anchor is None or len(self.s_refs[anchor].shape) != 2:
            return
        if self.s_refs[anchor].shape != self.r_refs[anchor].shape:
            self.report.skipped[anchor] = "residual stream: shapes differ between suspect and reference"
            return
        hidden = self.s_refs[anchor].shape[1]
        if hidden > self.max_neurons:
            self.report.skipped[anchor] = f"residual stream: {hidden} dimensions > max_neurons"
            return
        # Columns compared over at most 8192 evenly spaced vocabulary rows: as decisive as all of them, and
        # the float64 copies stay small for a 150k-token vocabulary.
        vocab = self.s_refs[anchor].shape[0]
        rows = np.unique(np.linspace(0, vocab - 1, min(vocab, 8192)).astype(np.int64))
        sim = _cosines(self.ref(anchor, rows).T, self.read(anchor, rows).T)
        perm = _assign(sim)
        mean_cos = float(sim[np.arange(hidden), perm].mean())
        if np.array_equal(perm, np.arange(hidden)):
            return
        if not mean_cos >= self.min_cosine:
            self.report.skipped[anchor] = (
                f"residual stream: mean matched cosine {mean_cos:.3f} < {self.min_cosine}"
            )
            return
        self.report.residual_permuted = True
        self.report.mean_cosine[f"{anchor} (residual stream)"] = mean_cos
        axis = AxisTransform(perm=perm, scale=np.ones(hidden))
        for name, ref in self.s_refs.items():
            which = _hidden_axis(name, ref.shape, hidden)
            if which is not None:
                t = self.transforms.setdefault(name, TensorTransform())
                if which == 0:
                    t.rows = axis
                else:
                    t.cols = axis

    def neurons(self, group: NeuronGroup) -> None:
        """Step 2: one neuron group (permutation, per-tensor scales, dummy neurons dropped)."""
        import numpy as np

        report = self.report
        label = group.producers[0] if group.producers else "?"
        names = [*group.producers, *group.consumers]
        missing = [n for n in names if n not in self.s_refs or n not in self.r_refs]
        if missing:
            report.skipped[label] = f"tensor {missing[0]!r} missing in suspect or reference"
            return
        n = self.r_refs[group.producers[0]].shape[0]
        m = self.s_refs[group.producers[0]].shape[0]

        # The suspect may have more neurons (dummies); every other dimension must agree.
        def grown(name: str, axis: int) -> bool:
            s_shape, r_shape = list(self.s_refs[name].shape), list(self.r_refs[name].shape)
            if (
                len(s_shape) != len(r_shape)
                or len(s_shape) <= axis
                or s_shape[axis] != m
                or r_shape[axis] != n
            ):
                return False
            s_shape[axis] = r_shape[axis] = 0
            return s_shape == r_shape

        if not (all(grown(p, 0) for p in group.producers) and all(grown(c, 1) for c in group.consumers)):
            report.skipped[label] = "shapes differ between suspect and reference"
            return
        if m > self.max_neurons:
            report.skipped[label] = f"{m} neurons > max_neurons {self.max_neurons}"
            return
        s_parts = [_as_matrix(self.read(p)) for p in group.producers]
        r_parts = [_as_matrix(self.ref(p)) for p in group.producers]
        sim = _cosines(np.concatenate(r_parts, axis=1), np.concatenate(s_parts, axis=1))
        perm = _assign(sim)
        mean_cos = float(sim[np.arange(n), perm].mean())
        if not mean_cos >= self.min_cosine:
            report.skipped[label] = f"mean matched cosine {mean_cos:.3f} < {self.min_cosine}"
            return
        report.mean_cosine[label] = mean_cos
        if not np.array_equal(perm, np.arange(m)[:n]) or m != n:
            report.permuted += 1
        rescaled = False
        for p, s_mat, r_mat in zip(group.producers, s_parts, r_parts, strict=True):
            scale = _ls_scale(s_mat[perm], r_mat)
            rescaled |= float(np.abs(scale - 1).max()) > 0.05
            self.transforms.setdefault(p, TensorTransform()).rows = AxisTransform(perm=perm, scale=scale)
        # Provisional column scale of the consumers: the producers' joint scale (exact for one homogeneous
        # producer and its bias); `refine_consumers` replaces it by each consumer's own once every row
        # alignment is known.
        joint = _ls_scale(np.concatenate(s_parts, axis=1)[perm], np.concatenate(r_parts, axis=1))
        dropped = np.setdiff1d(np.arange(m), perm)
        for c in group.consumers:
            if dropped.size:
                s_cols = _as_matrix(np.moveaxis(self.suspect.read(self.s_refs[c]), 1, 0))
                report.dropped_max_out_weight = max(
                    report.dropped_max_out_weight, float(np.abs(s_cols[dropped]).max())
                )
            self.transforms.setdefault(c, TensorTransform()).cols = AxisTransform(perm=perm, scale=joint)
            self.consumers.append(c)
        report.rescaled += rescaled or float(np.abs(joint - 1).max()) > 0.05
        report.dropped_neurons += int(dropped.size)

    def refine_consumers(self) -> None:
        """Each consumer's own least-squares column scale, once its rows are aligned.

        Kept only where the aligned columns match the reference's (mean |cosine| >= min_cosine).
        """
        import numpy as np

        for c in self.consumers:
            t = self.transforms[c]
            assert t.cols is not None
            s_mat = _as_matrix(np.moveaxis(self.read(c), 1, 0))
            r_mat = _as_matrix(np.moveaxis(self.ref(c), 1, 0))
            sim = _cosines(r_mat, s_mat)
            if not float(np.diag(sim).mean()) >= self.min_cosine:
                continue
            t.cols = AxisTransform(perm=t.cols.perm, scale=t.cols.scale / _ls_scale(s_mat, r_mat))

    def attention(self, prefix: str, layout: AttentionLayout) -> None:
        """Step 3: one attention layer (heads, KV groups, RoPE pairs, value and output)."""
        import numpy as np

        names = {k: f"{prefix}.self_attn.{k}_proj.weight" for k in "qkvo"}
        label = names["q"]
        d = layout.head_dim
        want = {
            "q": (layout.heads * d, None),
            "k": (layout.kv_heads * d, None),
            "v": (layout.kv_heads * d, None),
            "o": (None, layout.heads * d),
        }
        for k, name in names.items():
            s_ref, r_ref = self.s_refs.get(name), self.r_refs.get(name)
            rows, cols = want[k]
            if s_ref is None or r_ref is None or s_ref.shape != r_ref.shape or len(s_ref.shape) != 2:
                self.report.skipped[label] = f"attention: {name!r} missing or of another shape"
                return
            if (rows is not None and s_ref.shape[0] != rows) or (cols is not None and s_ref.shape[1] != cols):
                self.report.skipped[label] = f"attention: {name!r} does not fit {layout}"
                return
        found: dict[str, TensorTransform] = {}
        for k, heads in (("q", layout.heads), ("k", layout.kv_heads)):
            t = self._rotary(self.read(names[k]), self.ref(names[k]), heads, d)
            if t is None:
                self.report.skipped[label] = f"attention: {k}_proj heads do not match the reference"
                return
            found[names[k]] = t
        for k, transpose in (("v", False), ("o", True)):
            s_mat, r_mat = self.read(names[k]), self.ref(names[k])
            if transpose:
                s_mat, r_mat = s_mat.T, r_mat.T
            sim = _cosines(r_mat, s_mat)
            perm = _assign(sim)
            if not float(sim[np.arange(perm.size), perm].mean()) >= self.min_cosine:
                self.report.skipped[label] = f"attention: {k}_proj does not match the reference"
                return
            scale = _ls_scale(s_mat[perm], r_mat)
            axis = AxisTransform(perm=perm, scale=scale if not transpose else 1.0 / scale)
            found[names[k]] = TensorTransform(cols=axis) if transpose else TensorTransform(rows=axis)
        for name, t in found.items():
            have = self.transforms.setdefault(name, TensorTransform())
            if t.rows is not None:
                have.rows, have.mix = t.rows, t.mix
            else:
                have.cols = _compose(have.cols, t.cols)
        self.report.attention_layers += 1

    def _rotary(
        self, s_mat: npt.NDArray[np.float64], r_mat: npt.NDArray[np.float64], heads: int, d: int
    ) -> TensorTransform | None:
        """Match heads (blocks of d rows) by RoPE-pair subspace overlap, then fit each pair's 2 x 2 map."""
        import numpy as np

        half = d // 2
        cols = s_mat.shape[1]
        # (heads, half, 2, cols): the two rows of each RoPE pair.
        s_pairs = s_mat.reshape(heads, 2, half, cols).transpose(0, 2, 1, 3)
        r_pairs = r_mat.reshape(heads, 2, half, cols).transpose(0, 2, 1, 3)
        basis = np.linalg.qr(np.swapaxes(r_pairs, -1, -2))[0]  # (heads, half, cols, 2) orthonormal
        s_energy = np.einsum("shrc,shrc->sh", s_pairs, s_pairs)
        # overlap[j, i]: share of suspect head i's pair energy inside reference head j's pair planes.
        proj = np.einsum("jhcr,ihqc->jihrq", basis, s_pairs)
        inside = np.einsum("jihrq,jihrq->jih", proj, proj)
        with np.errstate(invalid="ignore", divide="ignore"):
            overlap = np.where(s_energy[None] > 0, inside / s_energy[None], 0.0).mean(axis=2)
        perm = _assign(np.sqrt(np.clip(overlap, 0, 1)))
        if not float(np.sqrt(np.clip(overlap[np.arange(heads), perm], 0, 1)).mean()) >= self.min_cosine:
            return None
        rows = (perm[:, None] * d + np.arange(d)[None, :]).reshape(-1)
        matched = s_pairs[perm]  # (heads, half, 2, cols)
        # S = M R per pair: M = S R^T (R R^T)^-1; the aligned pair is M^-1 S.
        gram = np.einsum("hprc,hpqc->hprq", r_pairs, r_pairs)
        cross = np.einsum("hprc,hpqc->hprq", matched, r_pairs)
        maps = cross @ np.linalg.pinv(gram)
        inverse = np.linalg.pinv(maps).reshape(-1, 2, 2)
        index = np.arange(heads * d).reshape(heads, 2, half)
        pairs = np.stack([index[:, 0, :].reshape(-1), index[:, 1, :].reshape(-1)], axis=1).astype(np.int64)
        axis = AxisTransform(perm=rows.astype(np.int64), scale=np.ones(rows.size))
        return TensorTransform(rows=axis, mix=PairMix(pairs=pairs, inverse=inverse))


def _compose(first: AxisTransform | None, second: AxisTransform | None) -> AxisTransform | None:
    """Apply `second` after `first` on the same axis (indices of `second` are in `first`'s aligned order)."""
    if first is None or second is None:
        return second if first is None else first
    return AxisTransform(perm=first.perm[second.perm], scale=first.scale[second.perm] * second.scale)


class ResyncedSource:
    """A `TensorSource` view of `base` with the re-synchronisation transforms applied on read.

    Transformed tensors are materialised whole (one at a time) and reported in the reference's shape
    (dummy neurons dropped); others are passed through.
    """

    def __init__(self, base: TensorSource, transforms: dict[str, TensorTransform]) -> None:
        self.base = base
        self.transforms = transforms
        self._refs = [
            TensorRef(r.name, r.dtype, _aligned_shape(r.shape, transforms.get(r.name)))
            for r in base.tensors()
        ]
        self._base_refs = {r.name: r for r in base.tensors()}

    def tensors(self) -> Sequence[TensorRef]:
        """The base's tensors, in their aligned shapes."""
        return self._refs

    def read(self, ref: TensorRef) -> npt.NDArray[np.floating]:
        """The aligned tensor."""
        base_ref = self._base_refs.get(ref.name, ref)
        arr = self.base.read(base_ref)
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
