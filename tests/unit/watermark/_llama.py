"""A small random-weight `LlamaForCausalLM` and the function-preserving transforms of issue 30, item 4.

The model is built by transformers from a small config (hidden 128, 4 query heads and 2 KV heads of 32
dimensions, 2 layers, MLP 256, vocabulary 512, untied head: about 0.4 M parameters, 1.7 MB), with the
library's own random initialisation, so every test gets the real architecture without a download. Each
attack works on a numpy state dict (the names `save_pretrained` writes) and is checked function-preserving
by `logits`, which runs the real transformers forward on the attacked weights.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

Arrays = dict[str, np.ndarray]

CONFIG = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
LAYERS = CONFIG["num_hidden_layers"]


def geometry(cfg: dict[str, object] | None = None) -> tuple[int, int, int, int, int]:
    """(heads, kv heads, head dim, layers, hidden) of a Llama config dict (default `CONFIG`).

    A given config is read alone: a real model's `config.json` without `head_dim` (or without
    `num_key_value_heads`) means hidden / heads (and as many KV heads as heads), not `CONFIG`'s values.
    """
    c: dict[str, object] = dict(CONFIG if cfg is None else cfg)
    heads, hidden = int(c["num_attention_heads"]), int(c["hidden_size"])  # type: ignore[call-overload]
    kv = int(c.get("num_key_value_heads") or heads)  # type: ignore[call-overload]
    d = int(c.get("head_dim") or hidden // heads)  # type: ignore[call-overload]
    return heads, kv, d, int(c["num_hidden_layers"]), hidden  # type: ignore[call-overload]


def _config(**overrides: int) -> object:
    import transformers

    return transformers.LlamaConfig(**{**CONFIG, **overrides})


@functools.cache
def _state(seed: int) -> tuple[tuple[str, np.ndarray], ...]:
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(_config())  # type: ignore[arg-type]
    # Random-init norms are all ones; give them spread so that the residual permutation is not trivially
    # invisible in them (a trained model's norms differ per dimension too).
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return tuple((k, v.detach().numpy().copy()) for k, v in model.state_dict().items())


def llama_state(seed: int = 0) -> Arrays:
    """A fresh copy of the random model's weights (numpy float32, `save_pretrained` names)."""
    return {k: v.copy() for k, v in _state(seed)}


def save(state: Arrays, root: Path) -> Path:
    """Write a Hugging Face model directory (`model.safetensors` + `config.json` with the head geometry)."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(root / "model.safetensors"))
    intermediate = state["model.layers.0.mlp.gate_proj.weight"].shape[0]
    cfg = {**CONFIG, "intermediate_size": intermediate, "model_type": "llama"}
    (root / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    return root


def logits(state: Arrays, seed: int = 5, cfg: dict[str, object] | None = None) -> np.ndarray:
    """The real transformers forward on a fixed batch of token ids (2 x 24), float64 logits.

    `cfg` is the model's config dict (default `CONFIG`); the MLP width comes from the weights. With a tied
    output head the state holds no `lm_head.weight` (as `save_pretrained` writes it).
    """
    import torch
    import transformers

    intermediate = state["model.layers.0.mlp.gate_proj.weight"].shape[0]
    config = (
        _config(intermediate_size=intermediate)
        if cfg is None
        else transformers.LlamaConfig(**{**cfg, "intermediate_size": intermediate})
    )
    model = transformers.LlamaForCausalLM(config)  # type: ignore[arg-type]
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=False
    )
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise KeyError(f"the state does not fit the config: missing {missing}, unexpected {unexpected}")
    model.eval()
    vocab = int((cfg or CONFIG)["vocab_size"])  # type: ignore[call-overload]
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, vocab, (2, 24)))
    with torch.no_grad():
        out = model(input_ids=ids).logits
    return np.asarray(out.double().numpy())


def _p(i: int) -> str:
    return f"model.layers.{i}"


def permute_mlp(state: Arrays, seed: int = 11, cfg: dict[str, object] | None = None) -> Arrays:
    """Permute every layer's MLP neurons; scale `up_proj` rows by a in [0.5, 2] and `down_proj` columns by
    1/a (SiLU(gate) * up is linear in up, so the product is unchanged; gate is permuted only)."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in state.items()}
    for i in range(geometry(cfg)[3]):
        m = f"{_p(i)}.mlp"
        n = out[f"{m}.gate_proj.weight"].shape[0]
        perm = rng.permutation(n)
        a = rng.uniform(0.5, 2.0, n).astype(np.float32)
        out[f"{m}.gate_proj.weight"] = out[f"{m}.gate_proj.weight"][perm]
        out[f"{m}.up_proj.weight"] = out[f"{m}.up_proj.weight"][perm] * a[:, None]
        out[f"{m}.down_proj.weight"] = out[f"{m}.down_proj.weight"][:, perm] / a[None, :]
    return out


def _rotate_pairs(w: np.ndarray, theta: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Rotate each RoPE pair (rows i, i + d/2 of one head, `rotate_half` layout) by theta and scale it."""
    out = w.copy()
    half = w.shape[0] // 2
    a, b = w[:half], w[half:]
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    out[:half] = (c * a - s * b) * scale[:, None]
    out[half:] = (s * a + c * b) * scale[:, None]
    return out


def permute_attention(state: Arrays, seed: int = 12, cfg: dict[str, object] | None = None) -> Arrays:
    """Per layer: permute the KV groups and the query heads inside each group (GQA kept consistent), rotate
    every RoPE pair of q and k by the same random angle per kv group with q scaled by c and k by 1/c,
    permute and scale the value dimensions (b in [0.5, 2]) with `o_proj`'s columns compensating."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in state.items()}
    heads, kv, d, layers, _ = geometry(cfg)
    per = heads // kv
    half = d // 2
    for i in range(layers):
        a = f"{_p(i)}.self_attn"
        q, k, v, o = (out[f"{a}.{x}_proj.weight"] for x in "qkvo")
        q_h = q.reshape(heads, d, -1)
        k_h = k.reshape(kv, d, -1)
        v_h = v.reshape(kv, d, -1)
        o_h = o.reshape(o.shape[0], heads, d)
        group_perm = rng.permutation(kv)
        new_q, new_k, new_v, new_o = (np.empty_like(x) for x in (q_h, k_h, v_h, o_h))
        for g_new, g_old in enumerate(group_perm):
            theta = rng.uniform(0, 2 * np.pi, half)
            c = rng.uniform(0.5, 2.0, half)
            new_k[g_new] = _rotate_pairs(k_h[g_old], theta, 1 / c)
            v_perm = rng.permutation(d)
            b = rng.uniform(0.5, 2.0, d).astype(np.float32)
            new_v[g_new] = v_h[g_old][v_perm] * b[:, None]
            head_perm = rng.permutation(per)
            for j_new, j_old in enumerate(head_perm):
                h_new, h_old = g_new * per + j_new, g_old * per + j_old
                new_q[h_new] = _rotate_pairs(q_h[h_old], theta, c)
                new_o[:, h_new] = o_h[:, h_old][:, v_perm] / b[None, :]
        out[f"{a}.q_proj.weight"] = new_q.reshape(q.shape).astype(np.float32)
        out[f"{a}.k_proj.weight"] = new_k.reshape(k.shape).astype(np.float32)
        out[f"{a}.v_proj.weight"] = new_v.reshape(v.shape).astype(np.float32)
        out[f"{a}.o_proj.weight"] = new_o.reshape(o.shape).astype(np.float32)
    return out


def permute_residual(state: Arrays, seed: int = 13, cfg: dict[str, object] | None = None) -> Arrays:
    """One permutation of the hidden dimensions applied to every tensor at once (RMSNorm is invariant to a
    permutation of its input when its weight is permuted alike)."""
    hidden = geometry(cfg)[4]
    perm = np.random.default_rng(seed).permutation(hidden)
    out = {}
    for name, w in state.items():
        if name.endswith(
            ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
        ):
            out[name] = w[:, perm]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = w[:, perm]
        elif name.endswith(("o_proj.weight", "down_proj.weight")) or name.endswith("norm.weight"):
            out[name] = w[perm]
        else:
            out[name] = w.copy()
    return out


def add_dummy_neurons(
    state: Arrays, extra: int = 64, seed: int = 14, cfg: dict[str, object] | None = None
) -> Arrays:
    """Add `extra` MLP neurons per layer with random in-weights and zero out-weights (shapes change)."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in state.items()}
    for i in range(geometry(cfg)[3]):
        m = f"{_p(i)}.mlp"
        hidden = out[f"{m}.gate_proj.weight"].shape[1]
        for x in ("gate", "up"):
            w = out[f"{m}.{x}_proj.weight"]
            new = (rng.standard_normal((extra, hidden)) * w.std()).astype(np.float32)
            out[f"{m}.{x}_proj.weight"] = np.concatenate([w, new])
        down = out[f"{m}.down_proj.weight"]
        out[f"{m}.down_proj.weight"] = np.concatenate([down, np.zeros((down.shape[0], extra), np.float32)], 1)
        # Shuffle the dummies in among the real neurons.
        perm = rng.permutation(out[f"{m}.gate_proj.weight"].shape[0])
        for x in ("gate", "up"):
            out[f"{m}.{x}_proj.weight"] = out[f"{m}.{x}_proj.weight"][perm]
        out[f"{m}.down_proj.weight"] = out[f"{m}.down_proj.weight"][:, perm]
    return out


def everything(state: Arrays, cfg: dict[str, object] | None = None) -> Arrays:
    """All of the above at once: residual, attention, MLP permutations with scaling and dummy neurons."""
    out = permute_attention(permute_residual(state, cfg=cfg), cfg=cfg)
    return add_dummy_neurons(permute_mlp(out, cfg=cfg), cfg=cfg)


#: The function-preserving attacks of issue 30, item 4 (name, attack).
TRANSFORMS = [
    ("MLP neurons permuted + scaled", permute_mlp),
    ("attention heads/KV groups permuted, RoPE pairs rotated, value/output scaled", permute_attention),
    ("residual stream permuted", permute_residual),
    ("dummy MLP neurons added", add_dummy_neurons),
    ("all of them at once", everything),
]
