"""The cost of a TPM-quoted load receipt per load, against the verified load itself (issue 33).

Model: a generated 1 GiB, 4-shard safetensors model (`_common.ensure_model`, cached under `--workdir`),
signed with a throwaway ECDSA P-256 key; warm page cache; CPU; torch on one thread. The node's TPM is a
software TPM (swtpm on loopback, provisioned as the tests provision it: `tests/support/tpm.py`), so the
figures are those of the TSS path and swtpm, not of a hardware TPM (a discrete TPM's ECDSA quote takes
tens to hundreds of milliseconds itself).

In one process, alternating over `--repeat` rounds:

  load             `load_model` under a policy without `loadReceipt`
  load+receipt     the same with `loadReceipt` (directory store): verification, then the receipt (AK keyid
                   cached after the first load, PCR read, quote, write)
  receipt only     `emit_load_receipt` alone (`--receipts` times): the per-load cost itself

for each TPM access path the machine has: `tools` (tpm2-tools processes, `TPM2TOOLS_TCTI`) and `esys`
(tpm2-pytss, one ESYS context kept per process), when `tpm2_pytss` imports.

Target (issue 33): receipt <= max(5 % of the load, 50 ms). Printed: medians, p90 of the receipt alone, the
target and whether it is met.

Usage: python bench/bench_receipts.py [--repeat 5] [--receipts 30] [--size-gib 1] [--workdir .bench]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    GIB,
    REPO_ROOT,
    ModelSpec,
    ensure_model,
    load_average,
    machine_lines,
    model_files,
    percentile,
    render_table,
    warm_page_cache,
)

sys.path.insert(0, str(REPO_ROOT))


def _policy(path: Path, key: Path, receipt: dict[str, object] | None) -> Path:
    import json

    entry: dict[str, object] = {"name": "bench", "match": ["file:///**"], "keys": [str(key)]}
    if receipt is not None:
        entry["loadReceipt"] = receipt
    doc = {"apiVersion": "modelsec.dev/v1alpha1", "kind": "ModelPolicy", "policies": [entry]}
    path.write_text(json.dumps(doc))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--receipts", type=int, default=30)
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--workdir", type=Path, default=REPO_ROOT / ".bench")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from modelsec.algorithms import SignatureAlgorithm
    from modelsec.policy import PolicySet
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem
    from modelsec.signer.tpm import DEFAULT_AK_HANDLE, TpmAttestationKey, esys_available
    from modelsec.verifier import load_model
    from modelsec.verifier.receipts import emit_load_receipt
    from tests.support.tpm import run_swtpm, tpm_missing_reason

    if reason := tpm_missing_reason():
        sys.exit(reason)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = ensure_model(args.workdir, ModelSpec(size_bytes=int(args.size_gib * GIB), shards=4, seed=33))
    files = model_files(model)
    with tempfile.TemporaryDirectory(prefix="bench-receipts-") as tmp:
        work = Path(tmp)
        private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
        (work / "k.pem").write_bytes(private)
        (work / "k.pub.pem").write_bytes(public)
        for old in model.glob("*.sig"):
            old.unlink()
        sign_model(model, [load_private_key_file(work / "k.pem")])
        with run_swtpm(work / "tpm") as tpm:
            pcrs = {str(i): tpm.pcr(i) for i in (0, 7)}
            receipt = {
                "pcrs": pcrs,
                "nodes": [{"name": "bench", "key": str(tpm.ak_pem)}],
                "store": str(work / "receipts"),
            }
            plain = PolicySet.from_file(_policy(work / "plain.json", work / "k.pub.pem", None))
            paths = ["tools", *(["esys"] if esys_available() else [])]
            with_receipt = PolicySet.from_file(_policy(work / "receipt.json", work / "k.pub.pem", receipt))
            import os

            from modelsec.signer.tpm import ACCESS_ENV

            os.environ["TPM2TOOLS_TCTI"] = tpm.tcti
            warm_page_cache(files)
            load_model(model, plain)  # warm-up (imports, first-use self tests)
            times: dict[str, list[float]] = {"load": [], **{f"load+receipt ({p})": [] for p in paths}}
            cases = [("load", plain, None), *((f"load+receipt ({p})", with_receipt, p) for p in paths)]
            for _ in range(args.repeat):
                for name, policies, access in cases:
                    if access is not None:
                        os.environ[ACCESS_ENV] = access  # the loader's TpmAttestationKey reads it
                    warm_page_cache(files)
                    t0 = time.perf_counter()
                    out = load_model(model, policies)
                    times[name].append(time.perf_counter() - t0)
                    del out
            alone: dict[str, list[float]] = {}
            for p in paths:
                requirement = with_receipt.policies[0].load_receipt
                assert requirement is not None
                ak = TpmAttestationKey(DEFAULT_AK_HANDLE, tcti=tpm.tcti, access=p)
                emit_load_receipt(
                    requirement, root_digest="ab" * 32, model_name="m", files=[], tensors=0, device="cpu",
                    policy_digest="", pinned_digests=(), tpm=ak,
                )  # fmt: skip
                alone[p] = []
                for _ in range(args.receipts):
                    t0 = time.perf_counter()
                    emit_load_receipt(
                        requirement, root_digest="ab" * 32, model_name="m", files=[], tensors=0,
                        device="cpu", policy_digest="", pinned_digests=(), tpm=ak,
                    )  # fmt: skip
                    alone[p].append(time.perf_counter() - t0)
    print("\n".join(machine_lines()))
    print(f"load average before: {load_average()}")
    print(
        f"model: {sum(f.stat().st_size for f in files) / GIB:.2f} GiB in {len(files)} files (4 shards); "
        "swtpm on loopback"
    )
    load = statistics.median(times["load"])
    target = max(0.05 * load, 0.050)
    rows = [["load", f"{load * 1000:.0f}", "-", "-", "-"]]
    for p in paths:
        both = statistics.median(times[f"load+receipt ({p})"])
        own = sorted(alone[p])
        med = statistics.median(own)
        rows.append(
            [
                f"load+receipt ({p})",
                f"{both * 1000:.0f}",
                f"{(both - load) * 1000:+.0f}",
                f"{med * 1000:.1f} (p90 {percentile(own, 90) * 1000:.1f})",
                f"{med / load * 100:.1f} %: {'met' if med <= target else 'NOT met'}",
            ]
        )
    print(
        render_table(
            ["case", "median ms", "vs load ms", "receipt alone ms", "receipt / load"],
            rows,
            right=range(1, 5),
        )
    )
    print(f"target: receipt <= max(5 % of the load, 50 ms) = {target * 1000:.0f} ms")


if __name__ == "__main__":
    main()
