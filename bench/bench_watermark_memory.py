"""Peak memory of watermark embedding against the shard size, before and after streaming, in the same run.

Usage:
    python bench/bench_watermark_memory.py [--shard-mib 1024] [--shards 1] [--baseline-rev f539eb7]

Model: `--shards` safetensors files of `--shard-mib` MiB each, random F32 matrices of 2048 x 2048 (16 MiB
tensors, a transformer-like layout), written into a temporary directory (page cache). Each embed runs in a
fresh child process that reports its `VmHWM` (peak resident set, which also counts pages of a file mapped
into the process) and its `VmRSS` just before `embed_model` (the interpreter plus numpy): the figure is the
growth `VmHWM - VmRSS(before)` divided by the largest shard.

`--baseline-rev`: the `watermark/embed.py` and `watermark/io.py` of that git revision are loaded in place of
the working tree's in one of the children (the whole-shard writer before the streaming change); the rows
alternate `--repeat` times. Target (issue 20): peak <= 1.2 x the largest shard. On a loaded machine wall
times are noise; the memory figures are not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

_CHILD = r"""
import importlib.util, json, sys, time
from pathlib import Path
import numpy
import modelsec.watermark
from modelsec.watermark.spread_spectrum import WatermarkKey

old = sys.argv[3]
if old:
    for mod in ("io", "embed"):
        name = f"modelsec.watermark.{mod}"
        spec = importlib.util.spec_from_file_location(name, f"{old}/{mod}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
from modelsec.watermark.embed import embed_model

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise SystemExit(field)

before = rss("VmRSS:")
t = time.perf_counter()
embed_model(Path(sys.argv[1]), Path(sys.argv[2]), WatermarkKey.from_bytes(bytes(range(1, 33))), b"bench")
print(json.dumps({"before": before, "peak": rss("VmHWM:"), "seconds": time.perf_counter() - t}))
"""


def _write_model(root: Path, shard_mib: int, shards: int) -> int:
    from safetensors.numpy import save_file

    root.mkdir()
    rng = np.random.default_rng(0)
    per_shard = max(1, shard_mib // 16)
    largest = 0
    for s in range(shards):
        tensors = {
            f"layers.{s}.{i}.weight": (rng.standard_normal((2048, 2048), dtype=np.float32) * 0.02)
            for i in range(per_shard)
        }
        path = root / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(path))
        largest = max(largest, path.stat().st_size)
        del tensors
    (root / "config.json").write_text("{}")
    return largest


def _baseline_sources(rev: str, into: Path) -> Path:
    into.mkdir()
    for mod in ("io", "embed"):
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:watermark/{mod}.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (into / f"{mod}.py").write_text(text)
    return into


def _run(model: Path, out: Path, old: str) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), str(out), old],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shard-mib", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--baseline-rev",
        default="f539eb7",
        help="git revision of the 'before' row, default the last whole-shard writer ('' for none)",
    )
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        largest = _write_model(work / "model", args.shard_mib, args.shards)
        rows = {"streaming (working tree)": ""}
        if args.baseline_rev:
            rows = {
                f"whole shard ({args.baseline_rev})": str(_baseline_sources(args.baseline_rev, work / "old")),
                **rows,
            }
        best: dict[str, tuple[float, float]] = {}
        n = 0
        for _ in range(args.repeat):
            for label, old in rows.items():
                n += 1
                r = _run(work / "model", work / f"out{n}", old)
                subprocess.run(["rm", "-rf", str(work / f"out{n}")], check=True)
                growth = (r["peak"] - r["before"]) / largest
                prev = best.get(label)
                best[label] = (
                    min(growth, prev[0]) if prev else growth,
                    min(r["seconds"], prev[1]) if prev else r["seconds"],
                )
        print(f"largest shard: {largest / 2**20:.0f} MiB, {args.shards} shard(s); lowest of {args.repeat}")
        print(f"{'row':32} {'peak growth / shard':>20} {'embed s':>9}")
        for label, (growth, seconds) in best.items():
            print(f"{label:32} {growth:20.2f} {seconds:9.2f}")
        print("target: <= 1.2")


if __name__ == "__main__":
    main()
