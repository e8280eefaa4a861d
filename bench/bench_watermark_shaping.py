#!/usr/bin/env python3
"""Experiment (issue 18): how many held-out greedy continuations a mark changes, by how it is shaped.

Usage: python bench/bench_watermark_shaping.py [--keys 3] [--kappa 1.0]

Not a product path: this script embeds `modelsec-ss-mult/v1` marks by its own additive rule to measure the
direction recorded in `watermark/budget.py` ("Shaping the mark by the layers' input statistics"). Detection
reads only the keyed per-bit correlations, so the embedder may spread each bit's correlation gain along any
direction; every mark below reaches the same margin `kappa` per code bit and is checked by modelsec's own
blind `detect` (detected, message read back, false-positive probability).

Model and data: the fortunes Llama of the tests (`tests/unit/watermark/_fortunes_lm.py`, shipped under
`tests/unit/watermark/fixtures/fortunes-llama/`; Debian `fortunes`, BSD licence). Calibration: 400
training fortunes (never the held-out ones). Evaluation: the first 6 words of 50 held-out fortunes, 16
greedy tokens (`bench_watermark_fidelity_lm.py`'s prompts), per key; perplexity on the held-out fortunes.

Directions compared in the same run (same keys, same per-bit targets):
* `uniform`: every carrier moves by the same amount along its chip sign (additive, no shaping);
* `input`: per Linear row, `S H^-1` with `H` the layer's input second moment on the calibration text
  (normalised to mean eigenvalue 1, plus 0.01 I); the bits' gains are solved jointly (rows couple bits);
* `input+rows`: `input`, and rows of the output head / token embedding weighted by 1 / (how often the token
  competes for the top / occurs), capped at 10x.
Measured 2026-12-02 (3 keys, kappa 1.0): uniform 47 / 150 changed, input 14 / 150, input+rows 9 / 150.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

from modelsec.watermark import WatermarkKey, detect
from modelsec.watermark.fidelity import CausalLMProbe
from modelsec.watermark.spread_spectrum import (
    WatermarkParams,
    carrier_plan,
    code_word,
    density_log2_for,
    is_eligible,
    message_bits,
)
from tests.unit.watermark import _fortunes_lm as F

MODES = ("uniform", "input", "input+rows")
REG = 0.01
ROW_CAP = 10.0
MESSAGE = b"F"


def calibration(lm: Path, texts: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per Linear weight the normalised `(H + REG I)^-1`; per embedding/head the row weights."""
    tok = transformers.AutoTokenizer.from_pretrained(str(lm))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(lm), dtype=torch.float32).eval()
    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def hook(name: str) -> Any:
        def f(_mod: Any, inp: Any, _out: Any) -> None:
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + x.T @ x
            counts[name] = counts.get(name, 0) + x.shape[0]

        return f

    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(hook(n))
    vocab = model.config.vocab_size
    freq, contention, positions = np.zeros(vocab), np.zeros(vocab), 0
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt")["input_ids"]
            logits = model(input_ids=ids).logits[0]
            freq += np.bincount(ids[0].numpy(), minlength=vocab)
            gap = (logits.max(-1, keepdim=True).values - logits).double().numpy()
            contention += np.exp(-gap).sum(0)
            positions += gap.shape[0]
    inverse = {}
    for n, s in sums.items():
        h = (s / counts[n]).numpy()
        h = h / np.trace(h) * h.shape[0]
        k = np.linalg.inv(h + REG * np.eye(h.shape[0]))
        inverse[n + ".weight"] = k / (np.trace(k) / k.shape[0])
    c = contention / positions
    f = freq / freq.mean()
    rows = {
        "lm_head.weight": np.minimum(1 / np.maximum(c / c.mean(), 1e-12), ROW_CAP),
        "model.embed_tokens.weight": np.minimum(1 / np.maximum(f, 1e-12), ROW_CAP),
    }
    return inverse, rows


def shaped_mark(
    weights: dict[str, Any], key: WatermarkKey, params: WatermarkParams, mode: str, inverse: Any, rows: Any
) -> dict[str, Any]:
    """Weights carrying the mark, every code bit at `m z >= kappa` (plus 5 % slack), shaped by `mode`."""
    names = [n for n, a in weights.items() if is_eligible("F32", a.shape, params, n)]
    density = density_log2_for(sum(weights[n].size for n in names), params)
    code = np.array(code_word(key, message_bits(MESSAGE), params), dtype=np.float64)
    nbits, g = len(code), params.block_size
    tensors, c0, e0 = [], np.zeros(nbits), np.zeros(nbits)
    for n in names:
        w = weights[n].astype(np.float64)
        plan = carrier_plan(key, n, w.shape, density, params)
        rms = math.sqrt(float((w * w).mean()))
        bits = (plan.slots % nbits).astype(np.int64)
        signs = plan.signs.astype(np.float64)
        xb = (w / rms).reshape(-1, g)[plan.blocks]
        c0 += np.bincount(bits, (signs * xb).sum(1), minlength=nbits)
        e0 += np.bincount(bits, (xb * xb).sum(1), minlength=nbits)
        tensors.append((n, w.shape, rms, plan.blocks, bits, signs))

    def direction(mu: Any) -> dict[str, Any]:
        out = {}
        for n, shape, _rms, blocks, bits, signs in tensors:
            m = np.zeros(int(np.prod(shape))).reshape(-1, g)
            m[blocks] = signs * mu[bits][:, None]
            m = m.reshape(shape)
            if mode != "uniform" and n in inverse:
                m = m @ inverse[n]
            if mode == "input+rows" and n in rows:
                m = m * rows[n][:, None]
            out[n] = m
        return out

    def gains(dx: dict[str, Any]) -> Any:
        c = np.zeros(nbits)
        for n, _shape, _rms, blocks, bits, signs in tensors:
            c += np.bincount(bits, (signs * dx[n].reshape(-1, g)[blocks]).sum(1), minlength=nbits)
        return c

    gram = np.stack([gains(direction(np.eye(nbits)[b])) for b in range(nbits)], axis=1)
    need = code * np.maximum(0.0, params.kappa * 1.05 * np.sqrt(e0) - code * c0)
    dx = direction(np.linalg.solve(gram, need))
    marked = dict(weights)
    for n, _shape, rms, *_ in tensors:
        marked[n] = (weights[n].astype(np.float64) + dx[n] * rms).astype(np.float32)
    return marked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--kappa", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lm = F.model_dir()
    train, _ = F.fortunes()
    picks = np.random.default_rng(0).choice(len(train), 400, replace=False)
    inverse, rows = calibration(lm, [train[i] for i in picks])
    weights = load_file(str(lm / "model.safetensors"))
    prompts = F.held_out_prompts(50)
    probe = CausalLMProbe(prompts, new_tokens=16)
    probe.prepare(lm)
    ppl0 = F.perplexity(lm)
    params = WatermarkParams(kappa=args.kappa)
    print(f"fortunes Llama, kappa {args.kappa:g}, {args.keys} keys x {len(prompts)} held-out prompts")
    print("| direction | changed | per key | max ppl change | detected blind (message) | max FPR |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            changed, ppl, found, fpr = [], 0.0, 0, 0.0
            for i in range(args.keys):
                key = WatermarkKey.from_bytes(hashlib.sha256(b"modelsec issue 18 key %d" % i).digest())
                out = Path(tmp) / f"{mode}-{i}"
                shutil.copytree(lm, out)
                marked = shaped_mark(weights, key, params, mode, inverse, rows)
                save_file(marked, str(out / "model.safetensors"), metadata={"format": "pt"})
                changed.append(len(probe.compare(out)[0]))
                ppl = max(ppl, abs(F.perplexity(out) / ppl0 - 1))
                r = detect(out, key)
                found += r.detected and r.decoded_message == MESSAGE
                fpr = max(fpr, r.false_positive_probability)
                shutil.rmtree(out)
            total = args.keys * len(prompts)
            row = f"| {mode} | {sum(changed)} / {total} | {changed} | {ppl:.4%} | {found} / {args.keys} |"
            print(f"{row} {fpr:.2g} |", flush=True)


if __name__ == "__main__":
    main()
