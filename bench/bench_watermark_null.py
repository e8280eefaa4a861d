#!/usr/bin/env python3
"""Issue 30's null calibration: detection on unmarked models over many random keys.

Usage: python bench/bench_watermark_null.py [--keys 10000] [--blind-keys 1000] [--absent-keys 20]

Models: the shipped digits classifier (`tests/unit/watermark/fixtures/digits-mlp`, 300k weights, trained),
the shipped fortunes Llama (`fixtures/fortunes-llama`, 0.53M, trained), a random-weight transformers
Llama (`tests/unit/watermark/_llama.py`, 0.43M) and, opt-in (`--models fortunes-llama-q4_1`), the fortunes
Llama with every matrix quantised to Q4_1 and dequantised, which detection reads through the grid mark's
parity votes (`modelsec.watermark.grid_mark`). None carries a mark.

Lines:
* `NULL|model|keys|...`: one hypothesis per key (the message length given, 64 bits), the product's own
  `extract_blocks` + `evaluate`. Under the null hypothesis the Stouffer p-value `null_p_value` is uniform:
  the observed rate at 1e-2 and 1e-3 (expected: the threshold, with its binomial standard deviation) and the
  Kolmogorov-Smirnov test against U(0, 1) (SciPy's `kstest` when installed, else the statistic and
  Kolmogorov's asymptotic p-value with Stephens' small-sample correction). Beside it, the rate of the
  decision's false-positive bound (both statistics, union bound) at the same thresholds: it must not exceed
  them (the bound is conservative, not uniform).
* `BLIND|model|keys|...`: full blind `detect` (every message length, density and carrier set, Bonferroni):
  the rate of the reported false-positive probability at 1e-2 and 1e-3, the smallest one seen, detections.
* `ABSENT|model|keys|...`: `detect` blind and with a message, `--absent-keys` keys: every one must say absent.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
from _common import load_average, machine_lines

from modelsec.watermark import ArraySource, DetectionThresholds, WatermarkKey, WatermarkParams, detect
from modelsec.watermark.detection import _hypotheses as hypotheses
from modelsec.watermark.detection import evaluate, extract_blocks
from tests.unit.watermark import _helpers as H
from tests.unit.watermark import _llama


def ks_uniform(p: np.ndarray) -> tuple[float, float, str]:
    """Kolmogorov-Smirnov against U(0, 1): (D, p-value, how)."""
    try:
        from scipy import stats

        r = stats.kstest(p, "uniform")
        return float(r.statistic), float(r.pvalue), "scipy.stats.kstest"
    except ImportError:
        x = np.sort(p)
        n = x.size
        i = np.arange(1, n + 1)
        d = float(max((i / n - x).max(), (x - (i - 1) / n).max()))
        lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
        pv = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
        return d, min(1.0, max(0.0, pv)), "Kolmogorov asymptotic (Stephens' correction)"


def models() -> dict[str, dict[str, np.ndarray]]:
    from modelsec.watermark.grid import requantise

    fortunes = H.load_state(H.fixture_dir("fortunes-llama"))
    return {
        "digits-mlp": H.digits_mlp(),
        "fortunes-llama": fortunes,
        "random-llama": _llama.llama_state(0),
        # Every matrix on the Q4_1 grid: detection reads the grid mark's parity votes (issue 30 item 5).
        "fortunes-llama-q4_1": {k: requantise(v, "Q4_1") if v.ndim >= 2 else v for k, v in fortunes.items()},
    }


def rate_line(values: np.ndarray, what: str) -> str:
    n = values.size
    parts = []
    for t in (1e-2, 1e-3):
        hits = int((values <= t).sum())
        sd = math.sqrt(n * t * (1 - t))
        parts.append(f"{what}<={t:g}: {hits}/{n} = {hits / n:.4f} (expected {n * t:.1f} +- {sd:.1f})")
    return "|".join(parts)


def null_run(name: str, state: dict[str, np.ndarray], keys: int, rng: np.random.Generator) -> None:
    source = ArraySource(state)
    # One hypothesis: the length and the code (as an attestation records them) given.
    params, k = next(iter(hypotheses(source, WatermarkParams(message_code="crc32-conv7"), blind_sets=False)))
    thresholds = DetectionThresholds()
    pv, bounds = np.empty(keys), np.empty(keys)
    t0 = time.perf_counter()
    for i in range(keys):
        key = WatermarkKey.from_bytes(rng.bytes(32))
        r, _ = evaluate(extract_blocks(source, key, params, k), key, params, thresholds, message_length=64)
        pv[i], bounds[i] = r.null_p_value, r.false_positive_probability
    d, ks_p, how = ks_uniform(pv)
    print(
        f"NULL|{name}|{keys} keys, one hypothesis, density 2^-{k}|{rate_line(pv, 'p')}|"
        f"KS D={d:.4f} p={ks_p:.3f} ({how})|{rate_line(bounds, 'bound')}|"
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )


def blind_run(name: str, state: dict[str, np.ndarray], keys: int, rng: np.random.Generator) -> None:
    fpp = np.empty(keys)
    detections = 0
    t0 = time.perf_counter()
    for i in range(keys):
        r = detect(state, WatermarkKey.from_bytes(rng.bytes(32)))
        fpp[i] = r.false_positive_probability
        detections += r.detected
    print(
        f"BLIND|{name}|{keys} keys, full blind search|{rate_line(fpp, 'FPP')}|smallest FPP {fpp.min():.3g}|"
        f"detections {detections}|{time.perf_counter() - t0:.0f} s",
        flush=True,
    )


def absent_run(name: str, state: dict[str, np.ndarray], keys: int, rng: np.random.Generator) -> None:
    worst = 0.0
    detections = 0
    for _ in range(keys):
        key = WatermarkKey.from_bytes(rng.bytes(32))
        for r in (detect(state, key), detect(state, key, message=b"ACME-clf")):
            detections += r.detected or bool(r.message_matched)
            worst = min(worst, r.log10_false_positive_probability)
    print(f"ABSENT|{name}|{keys} keys x (blind, message)|detections {detections}|min log10 FPP {worst:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--blind-keys", type=int, default=1_000)
    ap.add_argument("--absent-keys", type=int, default=20)
    ap.add_argument("--models", default="digits-mlp,fortunes-llama,random-llama")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("\n".join(machine_lines()))
    print(f"load average {load_average()}")
    rng = np.random.default_rng(30)
    chosen = args.models.split(",")
    for name, state in models().items():
        if name not in chosen:
            continue
        absent_run(name, state, args.absent_keys, rng)
        if args.keys:
            null_run(name, state, args.keys, rng)
        if args.blind_keys:
            blind_run(name, state, args.blind_keys, rng)
    print(f"load average after {load_average()}")


if __name__ == "__main__":
    main()
