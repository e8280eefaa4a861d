"""The runtime guard's cost: hooked against plain `AutoModel` + `AutoTokenizer.from_pretrained`, same run.

Model: the real all-MiniLM-L6-v2 as a 3-shard checkpoint (examples/make_sharded_minilm.py; 90.9 MB of
weights), signed with a throwaway ECDSA P-256 key. Each case runs in its own child process (warm page
cache), timing only the two `from_pretrained` calls after transformers is imported; cases alternate, and
the figure is the median of `--repeat` runs. Cases:

  plain    transformers alone (safetensors memory-maps the shards)
  guarded  the same calls with `modelsec.verifier.guard.hook.install(policy)`: the model directory is verified
           whole once (every digest), configs and tokenizer files come from the private snapshot, shards
           from the verified loader (read into private memory and hashed again before tensors are built)

Printed: median seconds, the ratio guarded / plain, the snapshot's private copy (bytes of non-tensor files
held in sealed memory) and each child's peak RSS.

Usage: python bench/bench_guard.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MIB, REPO_ROOT, check, load_average, machine_lines, render_table, run_timed

CHILD = r"""
import json, os, sys, time
import torch
torch.set_num_threads(1)
import transformers
model_dir, key, guarded = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
copied = 0
if guarded:
    from pathlib import Path
    from modelsec.policy import Policy
    from modelsec.verifier.guard import hook
    hook.install(Policy.from_key_files([Path(key)]))
t0 = time.perf_counter()
model = transformers.AutoModel.from_pretrained(model_dir)
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
seconds = time.perf_counter() - t0
if guarded:
    from modelsec.verifier.guard.snapshot import snapshot_containing
    snap, _ = snapshot_containing(model.config._name_or_path)
    copied = sum(os.stat(os.path.join(r, f)).st_size for r, _, fs in os.walk(snap.path) for f in fs)
print(json.dumps({"seconds": seconds, "copied": copied}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from modelsec.algorithms import SignatureAlgorithm
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem

    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp:
        work = Path(tmp)
        model_dir = work / "all-MiniLM-L6-v2"
        subprocess.run(
            [sys.executable, str(REPO_ROOT / "examples/make_sharded_minilm.py"), str(model_dir)],
            check=True,
            capture_output=True,
        )
        private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
        (work / "k.pem").write_bytes(private)
        (work / "k.pub.pem").write_bytes(public)
        sign_model(model_dir, [load_private_key_file(work / "k.pem")])
        argv = [sys.executable, "-c", CHILD, str(model_dir), str(work / "k.pub.pem")]
        check(run_timed([*argv, "0"]), "warm-up")
        results: dict[str, list[dict[str, float]]] = {"plain": [], "guarded": []}
        rss: dict[str, list[int]] = {"plain": [], "guarded": []}
        for _ in range(args.repeat):
            for case, flag in (("plain", "0"), ("guarded", "1")):
                run = check(run_timed([*argv, flag]), case)
                results[case].append(json.loads(run.stdout.strip().splitlines()[-1]))
                rss[case].append(run.max_rss)
    plain = statistics.median(r["seconds"] for r in results["plain"])
    guarded = statistics.median(r["seconds"] for r in results["guarded"])
    copied = int(results["guarded"][0]["copied"])
    print("\n".join(machine_lines()))
    print(f"load average before: {load_average()}")
    rows = [
        [
            "plain",
            f"{plain:.3f}",
            "1.00",
            "-",
            f"{statistics.median(rss['plain']) / MIB:.0f}",
        ],
        [
            "guarded",
            f"{guarded:.3f}",
            f"{guarded / plain:.2f}",
            f"{copied / MIB:.2f}",
            f"{statistics.median(rss['guarded']) / MIB:.0f}",
        ],
    ]
    print(
        render_table(
            ["case", "AutoModel+AutoTokenizer s", "ratio", "private copy MiB", "peak RSS MiB"],
            rows,
            right=range(1, 5),
        )
    )


if __name__ == "__main__":
    main()
