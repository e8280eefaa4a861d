"""One GPU check for issue 20: verified loading into CUDA memory and the PGD gate vs torchattacks.

Not run yet: no GPU machine was lent when it was written, so no figure from it exists. When one is lent,
run it once from the repository root (budget: under 10 minutes on one GPU, 2 GiB model by default):

    python bench/gpu_check.py [--size-gib 2] [--shards 4] [--repeat 2] [--pgd-timeout 300]

It prints, each as a ratio in the same run:

1. **Verified load into device memory**: `load_model(model, policy, device="cuda")` (read into pinned
   private memory, hash, compare, build tensors, copy to the GPU; SHA-256 policy, then SM3) against
   (a) the 2-thread hashing limit of the same bytes (`reference_hash`, the host-side bound; target >= 0.9)
   and (b) `safetensors.torch.load_file(device="cuda")` (unverified). `torch.cuda.synchronize()` ends each
   timing; each case runs in its own child process (CUDA context creation is timed separately, not in the
   figure).
2. **PGD gate**: `bench/bench_pgd.py` (ours vs torchattacks.PGD on the same GPU, fp32 reference plus the fast
   paths and their robust-accuracy gap); its table is printed as is.

Exit status 2 when CUDA is unavailable (nothing is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import GIB, REPO_ROOT, ModelSpec, ensure_model, machine_lines, reference_hash, warm_page_cache

CHILD = r"""
import json, sys, time
from pathlib import Path
import torch
mode, model, policy_file = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
t = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
context = time.perf_counter() - t
import safetensors.torch
from modelsec.policy import PolicySet
from modelsec.verifier import load_model
shards = sorted(model.glob("*.safetensors"))
policy = PolicySet.from_file(Path(policy_file)) if policy_file != "-" else None
t0 = time.perf_counter()
if mode == "load_file":
    out = {}
    for s in shards:
        out.update(safetensors.torch.load_file(s, device="cuda"))
else:
    out = load_model(model, policy, device="cuda")
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
assert all(v.is_cuda for v in out.values())
print(json.dumps({"seconds": seconds, "context": context, "tensors": len(out),
                  "gpu_bytes": torch.cuda.max_memory_allocated()}))
"""


def _child(mode: str, model: Path, policy: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(model), policy], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def _policy(tmp: Path, key: Path, model: Path, hashes: str) -> str:
    p = tmp / f"policy-{hashes}.yaml"
    p.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: gpu\n    match: ['file://{model.resolve()}']\n    keys: ['{key}']\n"
        f"    checkHashes: [{hashes}]\n"
    )
    return str(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=REPO_ROOT / ".bench")
    ap.add_argument("--pgd-timeout", type=int, default=300)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("CUDA is not available: nothing measured")
        raise SystemExit(2)
    print("\n".join(machine_lines()))
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    started = time.perf_counter()

    args.workdir.mkdir(parents=True, exist_ok=True)
    model = ensure_model(args.workdir, ModelSpec(size_bytes=int(args.size_gib * GIB), shards=args.shards))
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    modelsec = str(Path(sys.executable).parent / "modelsec")
    for alg in ("ecdsa-p256", "sm2"):
        subprocess.run([modelsec, "keygen", "-a", alg, "-o", str(tmp / alg)], check=True, capture_output=True)
    subprocess.run(
        [
            modelsec,
            "sign",
            str(model),
            "--force",  # the model is cached in the work directory and may be signed already
            "--signing-key",
            str(tmp / "ecdsa-p256.key.pem"),
            "--signing-key",
            str(tmp / "sm2.key.pem"),
            "-q",
        ],
        check=True,
        capture_output=True,
    )
    shards = sorted(model.glob("*.safetensors"))
    warm_page_cache([p for p in model.rglob("*") if p.is_file()])
    threads = min(2, os.cpu_count() or 1)
    policies = {
        "sha256": _policy(tmp, tmp / "ecdsa-p256.pub.pem", model, "sha256"),
        "sm3": _policy(tmp, tmp / "sm2.pub.pem", model, "sm3"),
    }
    best: dict[str, float] = {}
    for _ in range(args.repeat):  # rounds interleave the cases
        for label, mode, pol in [
            ("load_file cuda", "load_file", "-"),
            ("verified sha256 cuda", "full", policies["sha256"]),
            ("verified sm3 cuda", "full", policies["sm3"]),
        ]:
            r = _child(mode, model, pol)
            best[label] = min(best.get(label, float("inf")), r["seconds"])
        for alg in ("sha256", "sm3"):
            s = reference_hash(shards, [alg], threads, 2**20)
            best[f"hash {alg} x{threads}"] = min(best.get(f"hash {alg} x{threads}", float("inf")), s)
    total = sum(p.stat().st_size for p in shards)
    print(
        f"\nverified loading into CUDA memory: {total / GIB:.2f} GiB in {len(shards)} shards, "
        f"best of {args.repeat}"
    )
    for label, seconds in best.items():
        print(f"  {label:28} {seconds:8.3f} s  {total / seconds / 1e9:6.2f} GB/s")
    for alg in ("sha256", "sm3"):
        v, h = best[f"verified {alg} cuda"], best[f"hash {alg} x{threads}"]
        print(f"  ratio verified {alg} / {threads}-thread hash limit: {h / v:.2f} (target >= 0.90)")
        print(f"  ratio verified {alg} / unverified load_file(cuda): {best['load_file cuda'] / v:.2f}")

    print(f"\nPGD gate vs torchattacks (bench/bench_pgd.py), after {time.perf_counter() - started:.0f} s:")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "examples")}
    try:
        subprocess.run(
            [sys.executable, str(REPO_ROOT / "bench" / "bench_pgd.py"), "--repeats", "3"],
            env=env,
            timeout=args.pgd_timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"bench_pgd.py ran past {args.pgd_timeout} s and was stopped")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
