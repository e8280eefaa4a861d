"""Verified loading (`modelsec.verifier.load_model`) against plain safetensors loading, in one run.

Same generated sharded model (default ~4 GiB, 4 shards), warm page cache, CPU. Each case runs in its own
child process (peak RSS is that child's own `ru_maxrss`; an import-only child gives the baseline), timing
only the load inside the child. Cases:

  load_file        safetensors.torch.load_file per shard (mmap-backed: pages load lazily, see DESIGN.md 5)
  private_copy     safetensors.torch.load(path.read_bytes()) per shard (the honest private-memory baseline)
  verified_sha256  load_model, ECDSA bundle, policy checks SHA-256 file digests
  verified_sm3     load_model, SM2 bundle, policy `checkHashes: [sm3]` (SM3 file digests only)
  partial_1of4     load_model(tensors=<the tensors of shard 1>) with per-tensor BLAKE3 digests

Targets (issue 3): verified >= 0.90 x min(2-core hash throughput of the policy's algorithms, private_copy);
peak RSS <= 2 x largest shard + tensors returned (whole model); partial_1of4 <= 0.30 x full. Issue 20:
verified >= 0.90 x the 2-core hash limit itself (printed beside the issue-3 ratio).

Why issue 20's 0.90 is out of reach on a Firecracker VM (2 vCPUs, kernel 6.18, free-page reporting):
every verified byte is copied into fresh private memory (DESIGN.md 5), and the kernel must allocate and
zero that memory first. Measured per 512 MiB shard, one core: allocate+zero 0.30-0.35 s (4 KiB pages,
`MADV_POPULATE_WRITE` or `MAP_POPULATE`; an earlier measurement found `MADV_HUGEPAGE` 0.1-1.0 s, usually
worse, in fresh processes; on the 2026-12 kernel huge pages cost ~0.14 CPU-s/GB against ~0.30 for 4 KiB
pages, so the loader asks for them as a hint), `readv` from the page cache 0.10 s, SHA-256 0.38 s; the hash
limit's own work is read+hash
(~0.50 s). So the floor is (alloc + copy + hash) CPU per byte spread over both cores: a verified load
reaches at most limit_cpu / (limit_cpu + alloc) of the hash limit, with limit_cpu and alloc the CPU
seconds per GB of the limit's work and of allocate+zero: ~0.62 there for SHA-256 (~0.87 for SM3, whose
hashing dominates). The bench measures both and prints that floor beside the ratio. CPU seconds of
each load (the child's own user+sys during the load) are printed too: on a shared machine they are the
steadier figure.

Issue 32 figures, printed last: the verified SHA-256 load against the 2-core hash limit by CPU (limit CPU s/GB
over the load's CPU s/GB, target >= 0.85), and the verified load's CPU s/GB of `--many-shards` (1,000) shards
against 4 shards holding the same 1 GiB (target <= 1.15), alternated over `--repeat` rounds, medians. Beside
the first: the verified load's page faults per GiB and the kernel's compaction counters during those runs
(system-wide). Measured 2026-12-06 (perf, 2-vCPU VM under load): beyond SHA-256 itself, a 4-shard load's CPU
goes mostly to the kernel providing fresh private memory (zeroing ~0.12 CPU s/GB in huge pages; where memory
is fragmented, synchronous compaction for them another 0.13-0.24), while Python is ~4 % of it.

`--only-many-shards` runs the last comparison alone; with `--baseline-rev REV` it alternates this checkout's
library with revision REV's (`git archive`, first on PYTHONPATH through a copy of the editable install's link
tree) in ABBA order, each round running both models under each, and prints both ratios and the full garbage
collections that fired inside the loads.

Usage: python bench/bench_load.py [--size-gib 4] [--shards 4] [--repeat 3] [--many-shards 1000] [--quick]
       python bench/bench_load.py --only-many-shards [--repeat 4] [--baseline-rev REV]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    GIB,
    MIB,
    REPO_ROOT,
    ModelSpec,
    Result,
    baseline_tree,
    ensure_model,
    load_average,
    machine_lines,
    reference_hash,
    render_table,
    run_timed,
    warm_page_cache,
)

CHILD = r"""
import gc, json, resource, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
mode, model, policy_file = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
from modelsec.policy import PolicySet
from modelsec.verifier import load_model
import safetensors.torch
shards = sorted(model.glob("*.safetensors"))
policy = PolicySet.from_file(Path(policy_file)) if policy_file != "-" else None
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def user():
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0, c0, f0, u0 = time.perf_counter(), cpu(), faults(), user()
g0 = gc.get_stats()[2]["collections"]
n = 0
if mode == "noop":
    pass
elif mode == "load_file":
    for s in shards:
        n += len(safetensors.torch.load_file(s))
elif mode == "private_copy":
    for s in shards:
        n += len(safetensors.torch.load(s.read_bytes()))
elif mode == "full":
    n = len(load_model(model, policy))
elif mode == "partial":
    with safetensors.safe_open(str(shards[0]), "pt") as f:
        names = list(f.keys())
    t0, c0, f0, u0 = time.perf_counter(), cpu(), faults(), user()
    n = len(load_model(model, policy, tensors=names))
out = {"seconds": time.perf_counter() - t0, "cpu": cpu() - c0, "tensors": n, "minflt": faults() - f0,
       "full_gc": gc.get_stats()[2]["collections"] - g0, "user": user() - u0}
print(json.dumps(out))
"""


def _policy(tmp: Path, keys: Path, model: Path, alg: str, hashes: str) -> Path:
    p = tmp / f"policy-{alg}.yaml"
    p.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: bench\n    match: ['file://{model.resolve()}']\n    keys: ['{keys / alg}.pub.pem']\n"
        f"    checkHashes: [{hashes}]\n"
    )
    return p


_VMSTAT_KEYS = ("compact_stall", "compact_fail", "thp_fault_alloc", "thp_fault_fallback")


def _vmstat() -> dict[str, int]:
    """The kernel's page-provisioning counters (system-wide; all zero where /proc/vmstat is missing)."""
    out = dict.fromkeys(_VMSTAT_KEYS, 0)
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in out:
                    out[key] = int(value)
    except OSError:
        pass
    return out


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def alloc_seconds_per_gb(nbytes: int, repeat: int) -> float:
    """CPU seconds to allocate and zero fresh private memory (populated 4 KiB pages), per GB: best of runs."""
    best = float("inf")
    for _ in range(repeat):
        c0 = time.thread_time()
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        best = min(best, time.thread_time() - c0)
        mapping.close()
    return best / (nbytes / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=REPO_ROOT / ".bench")
    ap.add_argument("--quick", action="store_true", help="~256 MiB model, 1 repeat (smoke run)")
    ap.add_argument("--many-shards", type=int, default=1000, help="shards of the 1 GiB comparison (0: skip)")
    ap.add_argument("--only-many-shards", action="store_true", help="run only the many-shards comparison")
    ap.add_argument(
        "--baseline-rev", default="", help="with --only-many-shards: also load under this git revision (ABBA)"
    )
    args = ap.parse_args()
    if args.quick:
        args.size_gib, args.repeat = 0.25, 1
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.only_many_shards:
        _only_many_shards(args)
        return
    spec = ModelSpec(size_bytes=int(args.size_gib * GIB), shards=args.shards, side_files=True)
    model = ensure_model(args.workdir, spec)
    print("\n".join(machine_lines()))
    print(f"load average before: {load_average()}")
    modelsec = str(Path(sys.executable).parent / "modelsec")
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    keys = _keys(tmp, modelsec, ["ecdsa-p256", "sm2"])
    subprocess.run(
        [
            modelsec,
            "sign",
            str(model),
            "--force",  # the model is cached in the work directory and may be signed already
            "--signing-key",
            str(keys / "ecdsa-p256.key.pem"),
            "--signing-key",
            str(keys / "sm2.key.pem"),
            "-q",
        ],
        check=True,
        capture_output=True,
    )
    shards = sorted(model.glob("*.safetensors"))
    files = [p for p in model.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in shards)
    largest = max(p.stat().st_size for p in shards)
    warm_page_cache(files)
    pol_sha = _policy(tmp, keys, model, "ecdsa-p256", "sha256")
    pol_sm3 = _policy(tmp, keys, model, "sm2", "sm3")

    cases = [
        ("noop", "-", "import baseline"),
        ("load_file", "-", "safetensors.torch.load_file (mmap)"),
        ("private_copy", "-", "safetensors.torch.load(read_bytes())"),
        ("full", str(pol_sha), "verified load_model, SHA-256"),
        ("full", str(pol_sm3), "verified load_model, SM3"),
        ("partial", str(pol_sha), "verified partial: shard 1 of N tensors"),
    ]
    results: list[Result] = []
    cpu_best: dict[str, float] = {}
    # Where a verified load's CPU beyond hashing goes is mostly the kernel providing fresh private memory:
    # page faults (4 KiB pages: 262,144 per GiB; huge pages: 512) and, on a host whose memory is fragmented,
    # synchronous compaction for huge pages. Counted around the verified SHA-256 runs.
    faults: list[int] = []
    kernel = dict.fromkeys(_VMSTAT_KEYS, 0)
    for mode, pol, label in cases:
        res = Result(label, mode, total)
        for _ in range(args.repeat):
            warm_page_cache(files)
            before = _vmstat()
            run = run_timed([sys.executable, "-c", CHILD, mode, str(model), pol])
            if label == "verified load_model, SHA-256" and run.rc == 0:
                after = _vmstat()
                for k in kernel:
                    kernel[k] += after[k] - before[k]
                faults.append(json.loads(run.stdout)["minflt"])
            if run.rc != 0:
                res.skipped = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"rc={run.rc}"
                break
            out = json.loads(run.stdout)
            res.add(out["seconds"], run.max_rss)
            cpu_best[label] = min(cpu_best.get(label, float("inf")), out["cpu"])
        results.append(res)

    ref, ref_cpu = {}, {}  # GB/s of the 2-thread hash limit; its CPU seconds per GB (steadier when shared)
    for name, algs in (("sha256", ["sha256"]), ("sm3", ["sm3"])):
        best, best_cpu = float("inf"), float("inf")
        for _ in range(args.repeat):
            c0 = _cpu_seconds()
            best = min(best, reference_hash(shards, algs, 2, 8 * MIB))
            best_cpu = min(best_cpu, _cpu_seconds() - c0)
        ref[name], ref_cpu[name] = total / 1e9 / best, best_cpu / (total / 1e9)
    alloc = alloc_seconds_per_gb(largest, args.repeat) if hasattr(mmap, "MAP_POPULATE") else 0.0

    by_label = {r.name: r for r in results}
    base_rss = by_label["import baseline"].max_rss
    rows = []
    for r in results:
        if r.group == "noop":
            continue
        rows.append(
            [
                r.name,
                f"{r.best:.3f}" if r.ok else "skipped",
                f"{cpu_best[r.name]:.3f}" if r.ok else "",
                f"{r.gbps:.2f}" if r.ok else r.skipped[:60],
                f"{(r.max_rss - base_rss) / MIB:.0f}" if r.ok else "",
            ]
        )
    print()
    print(
        render_table(
            ["case", "best s", "best CPU s", "GB/s", "peak RSS - baseline (MiB)"], rows, right=(1, 2, 3, 4)
        )
    )
    print(
        f"\nmodel: {total / GIB:.2f} GiB in {len(shards)} shards, largest {largest / MIB:.0f} MiB; "
        f"import baseline RSS {base_rss / MIB:.0f} MiB"
    )
    print(f"2-thread hash limit: SHA-256 {ref['sha256']:.2f} GB/s, SM3 {ref['sm3']:.2f} GB/s")
    print(f"allocate+zero private memory: {alloc:.3f} CPU s/GB (one core, populated 4 KiB pages)")
    private = by_label["safetensors.torch.load(read_bytes())"]
    for label, limit_key in (
        ("verified load_model, SHA-256", "sha256"),
        ("verified load_model, SM3", "sm3"),
    ):
        r = by_label[label]
        if r.ok and private.ok:
            bound = min(ref[limit_key], private.gbps)
            floor = ref_cpu[limit_key] / (ref_cpu[limit_key] + alloc)  # alloc+copy+hash CPU, any cores
            print(
                f"{label}: {r.gbps:.2f} GB/s = {r.gbps / bound:.2f} x min(hash limit {ref[limit_key]:.2f}, "
                f"private copy {private.gbps:.2f}) (issue 3 target >= 0.90); "
                f"= {r.gbps / ref[limit_key]:.2f} x the 2-core hash limit (issue 20 target >= 0.90; "
                f"private-memory floor here ~{floor:.2f}); peak RSS - baseline "
                f"{(r.max_rss - base_rss) / MIB:.0f} MiB vs 2 x largest shard + tensors "
                f"{(2 * largest + total) / MIB:.0f} MiB"
            )
    sha = "verified load_model, SHA-256"
    if by_label[sha].ok:
        per_gb, limit_gb = cpu_best[sha] / (total / 1e9), ref_cpu["sha256"]
        print(
            f"issue 32: verified SHA-256 load {per_gb:.3f} CPU s/GB, 2-core hash limit {limit_gb:.3f}: "
            f"{limit_gb / per_gb:.2f} of the limit by CPU (target >= 0.85)"
        )
        print(
            f"  its page faults: {statistics.median(faults) / (total / GIB):,.0f} per GiB (median; "
            f"4 KiB pages 262,144, huge pages 512); system-wide during those runs: "
            f"{kernel['compact_stall']} direct compaction stalls ({kernel['compact_fail']} failed), "
            f"{kernel['thp_fault_alloc']} huge pages faulted, {kernel['thp_fault_fallback']} fell back "
            "to 4 KiB"
        )
    full, part = by_label[sha], by_label["verified partial: shard 1 of N tensors"]
    if full.ok and part.ok:
        print(f"partial (shard 1 of {len(shards)}) / full: {part.best / full.best:.2f} (target <= 0.30)")
    if args.many_shards:
        _many_shards(args, keys, tmp, modelsec)
    print(f"load average after: {load_average()}")


def _keys(tmp: Path, modelsec: str, algorithms: Sequence[str]) -> Path:
    keys = tmp / "keys"
    keys.mkdir()
    for alg in algorithms:
        subprocess.run(
            [modelsec, "keygen", "-a", alg, "-o", str(keys / alg)], check=True, capture_output=True
        )
    return keys


def _only_many_shards(args: argparse.Namespace) -> None:
    print("\n".join(machine_lines()))
    print(f"load average before: {load_average()}")
    modelsec = str(Path(sys.executable).parent / "modelsec")
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    keys = _keys(tmp, modelsec, ["ecdsa-p256"])
    pythonpath = {"this checkout": None}
    if args.baseline_rev:
        pythonpath[args.baseline_rev] = str(baseline_tree(args.baseline_rev, tmp / "baseline"))
    _many_shards(args, keys, tmp, modelsec, pythonpath)
    print(f"load average after: {load_average()}")


def _many_shards(
    args: argparse.Namespace,
    keys: Path,
    tmp: Path,
    modelsec: str,
    pythonpath: dict[str, str | None] | None = None,
) -> None:
    """Issue 32: per-GB CPU of a verified load of 1 GiB in `--many-shards` shards against 4 shards.

    `pythonpath`: label -> the library first on the child's PYTHONPATH (None: this checkout's), alternated
    in ABBA order over the rounds.
    """
    libraries = pythonpath or {"this checkout": None}
    models = {}
    for n in (4, args.many_shards):
        model = ensure_model(args.workdir, ModelSpec(size_bytes=GIB, shards=n, side_files=True))
        key = keys / "ecdsa-p256.key.pem"
        subprocess.run(
            [modelsec, "sign", str(model), "--force", "--signing-key", str(key), "-q"],
            check=True,
            capture_output=True,
        )
        folder = tmp / f"shards-{n}"  # one policy file per model
        folder.mkdir(exist_ok=True)
        files = [p for p in model.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files if p.name.endswith(".safetensors"))
        models[n] = (model, _policy(folder, keys, model, "ecdsa-p256", "sha256"), files, size)
    per_gb: dict[tuple[str, int], list[float]] = {(lib, n): [] for lib in libraries for n in models}
    user_gb: dict[tuple[str, int], list[float]] = {key: [] for key in per_gb}
    full_gc: dict[tuple[str, int], int] = dict.fromkeys(per_gb, 0)
    loads: list[str] = []
    order = list(libraries)
    for r in range(args.repeat):
        # ABBA: the kernel's memory state after one load (freed huge pages) favours the next one.
        for lib in order if r % 2 == 0 else order[::-1]:
            env = dict(os.environ)
            if libraries[lib] is not None:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (libraries[lib], env.get("PYTHONPATH")) if p)
            for n in models if r % 2 == 0 else list(models)[::-1]:
                model, pol, files, size = models[n]
                warm_page_cache(files)
                run = run_timed([sys.executable, "-c", CHILD, "full", str(model), str(pol)], env=env)
                if run.rc != 0:
                    print(f"many-shards comparison skipped ({lib}): {run.stderr.strip()[-200:]}")
                    return
                out = json.loads(run.stdout)
                per_gb[lib, n].append(out["cpu"] / (size / 1e9))
                user_gb[lib, n].append(out["user"] / (size / 1e9))
                full_gc[lib, n] += out["full_gc"]
        loads.append(load_average())
    many = args.many_shards
    for lib in libraries:
        few_gb, many_gb = statistics.median(per_gb[lib, 4]), statistics.median(per_gb[lib, many])
        print(
            f"issue 32 ({lib}): verified load of 1 GiB, {many} shards {many_gb:.3f} CPU s/GB vs 4 shards "
            f"{few_gb:.3f}: {many_gb / few_gb:.2f}x per GB (target <= 1.15; medians of {args.repeat} "
            f"alternated rounds); full garbage collections inside the loads: {full_gc[lib, many]} of "
            f"{args.repeat} ({many} shards), {full_gc[lib, 4]} of {args.repeat} (4 shards)"
        )
        print(
            f"  rounds, CPU s/GB: {many} shards {', '.join(f'{v:.3f}' for v in per_gb[lib, many])}; "
            f"4 shards {', '.join(f'{v:.3f}' for v in per_gb[lib, 4])}"
        )
        # Each round loads both models back to back under one library: the median of the rounds' own ratios
        # cancels load that drifts between rounds.
        paired = statistics.median(m / f for m, f in zip(per_gb[lib, many], per_gb[lib, 4], strict=True))
        print(f"  paired (median of each round's ratio): {paired:.2f}x")
        # User time alone leaves out the kernel's provisioning of fresh memory, whose cost varies with the
        # host's free huge pages from one load to the next.
        few_user, many_user = statistics.median(user_gb[lib, 4]), statistics.median(user_gb[lib, many])
        print(
            f"  user CPU only: {many} shards {many_user:.3f} s/GB vs 4 shards {few_user:.3f}: "
            f"{many_user / few_user:.2f}x"
        )
    print(f"  load average after each round: {'; '.join(loads)}")


if __name__ == "__main__":
    main()
