#!/usr/bin/env python3
"""Issue 18's fidelity matrix on the fortunes Llama: held-out prompts x random keys at the weakest mark.

Usage: python bench/bench_watermark_fidelity_lm.py [--keys 20] [--noise-seeds 5]

Model and data: the fortunes Llama of the tests (`tests/unit/watermark/_fortunes_lm.py`, shipped under
`tests/unit/watermark/fixtures/fortunes-llama/`, 0.53M parameters; Debian `fortunes`, BSD licence). The
evaluation prompts are the first 6 words of 50 held-out fortunes (never in the training text, and not the
probe set `embed` budgets with, `fidelity.DEFAULT_PROBE_TEXTS`), 16 greedy tokens each.

1. The matrix: for each key, the weakest mark `embed_within_budget` tries on its own (margin
   `DEFAULT_MIN_KAPPA`, per-tensor grades from the probe's sensitivities; ungraded when a graded bit would
   move its carriers over the relative-change cap, as the search would), then the held-out continuations
   changed, the held-out perplexity, and blind detection (key only, default thresholds). Issue 18 asks
   >= 98 % of the prompt x key pairs identical and perplexity within 0.5 %; the verdict is printed.
2. Why the 98 % is out of reach on this model for any mark that keeps the false-positive bound: per held-out
   prompt the smallest top-1/top-2 logit gap along its greedy continuation (near-ties), and how many
   continuations relative Gaussian weight noise of 1e-3 already changes, beside the weakest mark's relative
   L2 change.

Formerly the slow tests `test_twenty_keys_*` and `test_the_target_is_below_what_tiny_weight_noise_keeps`
of `tests/unit/watermark/test_watermark_fidelity_lm.py` (issue 26: research measurements are benchmarks).
Measured 2026-12 on the shared 2-core machine (20 keys): 796 / 1000 pairs identical, perplexity change at
most 0.072 %, 20 / 20 detected blind with the message, false-positive probability 3.5e-18; 6 of 50 prompts
with a top-2 gap under 1e-3 nats, noise 1e-3 changes 13 / 250 pairs, the weakest mark's relative L2 0.021.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from _common import load_average, machine_lines

from modelsec.errors import PolicyError
from modelsec.watermark import WatermarkKey, embed_model
from modelsec.watermark import detect as wm_detect
from modelsec.watermark.budget import DEFAULT_MIN_KAPPA
from modelsec.watermark.fidelity import CausalLMProbe
from modelsec.watermark.grading import grades_from_sensitivities, probe_sensitivities
from modelsec.watermark.spread_spectrum import WatermarkParams
from tests.unit.watermark import _fortunes_lm as F

EVAL_NEW_TOKENS = 16
WEAKEST = WatermarkParams(kappa=DEFAULT_MIN_KAPPA)
NOISE_RELATIVE = 1e-3
TARGET_IDENTICAL = 0.98
PPL_BOUND = 0.005
KEY = WatermarkKey.from_bytes(bytes(range(32)))


def _key(i: int) -> WatermarkKey:
    return WatermarkKey.from_bytes(hashlib.sha256(b"modelsec issue 18 key %d" % i).digest())


def matrix(lm: Path, work: Path, prompts: list[str], keys: int) -> None:
    probe = CausalLMProbe()  # the probe set `embed` budgets with, not the evaluation prompts
    probe.prepare(lm)
    sens = probe_sensitivities(probe, lm)
    assert sens is not None
    grades = grades_from_sensitivities(sens)
    held_out = CausalLMProbe(prompts, new_tokens=EVAL_NEW_TOKENS)
    held_out.prepare(lm)
    ppl_before = F.perplexity(lm)
    changed: list[tuple[int, int]] = []
    ppl_after: list[float] = []
    ungraded: list[int] = []
    detected = decoded = 0
    max_fpr = 0.0
    for i in range(keys):
        out = work / f"key{i}"
        try:
            embed_model(lm, out, _key(i), b"F", params=WEAKEST, grades=grades)
        except PolicyError:  # a bit would move its top-graded carriers > 25 %: the search tries ungraded
            ungraded.append(i)
            embed_model(lm, out, _key(i), b"F", params=WEAKEST, careless=True)
        changed.extend((p, i) for p in held_out.compare(out)[0])
        ppl_after.append(F.perplexity(out))
        blind = wm_detect(out, _key(i))  # blind: the key only, default thresholds
        detected += blind.detected
        decoded += blind.decoded_message == b"F"
        max_fpr = max(max_fpr, blind.false_positive_probability)
        shutil.rmtree(out)
        print(f"  key {i}: {sum(1 for _, k in changed if k == i)} / {len(prompts)} changed", flush=True)
    pairs = keys * len(prompts)
    identical = pairs - len(changed)
    ppl_change = max(abs(p / ppl_before - 1) for p in ppl_after)
    print(f"kappa {WEAKEST.kappa:g} graded, {keys} keys x {len(prompts)} held-out prompts")
    print(
        f"pairs identical: {identical} / {pairs} ({identical / pairs:.1%}); issue 18 asks >= "
        f"{TARGET_IDENTICAL:.0%}: {'met' if identical >= TARGET_IDENTICAL * pairs else 'NOT met'}"
    )
    print(f"changed (prompt, key): {changed}")
    verdict = "met" if ppl_change <= PPL_BOUND else "NOT met"
    print(
        f"perplexity before {ppl_before:.4f}, after {min(ppl_after):.4f}..{max(ppl_after):.4f}, largest "
        f"change {ppl_change:.4%} (asked <= {PPL_BOUND:.1%}: {verdict})"
    )
    print(
        f"detected blind {detected} / {keys}, message read back {decoded} / {keys}, max false-positive "
        f"probability {max_fpr:.3g}; ungraded keys {ungraded}"
    )


def _top2_margins(lm: Path, prompts: list[str]) -> list[float]:
    """Per held-out prompt, the smallest top-1 minus top-2 logit gap (nats) along its greedy continuation."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(lm))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(lm), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            gaps = []
            for _ in range(EVAL_NEW_TOKENS):
                top = model(input_ids=ids).logits[0, -1].topk(2)
                gaps.append(float(top.values[0] - top.values[1]))
                ids = torch.cat([ids, top.indices[:1].view(1, 1)], dim=1)
            out.append(min(gaps))
    return out


def _noisy_copy(lm: Path, out: Path, seed: int) -> None:
    """`lm` with every eligible weight times (1 + N(0, NOISE_RELATIVE**2)), written as float32."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(lm, out)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(lm / "model.safetensors"))
    for name, w in weights.items():
        if w.dim() >= 2:
            weights[name] = w * (1 + NOISE_RELATIVE * torch.randn(w.shape, generator=gen))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def near_ties(lm: Path, work: Path, prompts: list[str], seeds: int) -> None:
    margins = _top2_margins(lm, prompts)
    ties = sorted(i for i, m in enumerate(margins) if m < 1e-3)
    held_out = CausalLMProbe(prompts, new_tokens=EVAL_NEW_TOKENS)
    held_out.prepare(lm)
    changed = 0
    for seed in range(seeds):
        _noisy_copy(lm, work / f"noise{seed}", seed)
        changed += len(held_out.compare(work / f"noise{seed}")[0])
        shutil.rmtree(work / f"noise{seed}")
    mark = embed_model(lm, work / "mark", KEY, b"F", params=WEAKEST, careless=True)
    print(f"prompts with a top-2 logit gap < 1e-3 nats: {ties} (smallest {min(margins):.2g})")
    print(f"relative weight noise {NOISE_RELATIVE:g}: {changed} / {seeds * len(prompts)} pairs changed")
    print(
        f"weakest mark: relative L2 change {mark.relative_l2_change:.4f} "
        f"({mark.relative_l2_change / NOISE_RELATIVE:.0f}x the noise), detected {mark.detection.detected}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--noise-seeds", type=int, default=5)
    args = ap.parse_args()
    if not F.available():
        sys.exit("apt-get install -y fortunes (the held-out prompts and perplexity text)")
    torch.set_num_threads(1)
    print("\n".join(machine_lines()))
    print(f"torch {torch.__version__}, 1 thread; load average {load_average()}")
    lm = F.model_dir()
    prompts = F.held_out_prompts(50)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        matrix(lm, Path(tmp), prompts, args.keys)
        near_ties(lm, Path(tmp), prompts, args.noise_seeds)
    print(f"{time.perf_counter() - t0:.0f} s; load average after {load_average()}")


if __name__ == "__main__":
    main()
