"""Single-file hashing modes against raw hash throughput on the same bytes, measured in the same run.

Rows (median of --repeat, pairs alternated; every figure is a ratio to a reference taken in this run, so
noise from other work on a shared machine mostly cancels):

* default sign work of a single-file model (SHA-256 file digest + BLAKE3 per-tensor digests) against the
  1-core SHA-256 limit (hashlib over the same bytes already in memory): target <= 1.05;
* BLAKE3 mode (`sign --hash-type blake3 --tensor-digest none`: manifests over BLAKE3 file digests) against
  1-core BLAKE3 over the same bytes;
* partial load of every tensor by per-tensor digest (`load_model(tensors=[...])`) against 1-core BLAKE3.

Usage: python bench/bench_hash_modes.py [--mib 512] [--repeat 3] [--dir DIR]
Runs on whichever `modelsec` the interpreter imports, so the same command under another venv gives the
"before" figures.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _model(root: Path, mib: int) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    path = root / "model.safetensors"
    if not path.exists():
        rng = np.random.default_rng(0)
        tensors = {
            f"layer.{i}.weight": rng.integers(0, 255, size=(8 * 2**20,), dtype=np.uint8)
            for i in range(mib // 8)
        }
        save_file(tensors, str(path))
    return path


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()

    import blake3
    import torch
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    import modelsec
    from modelsec.algorithms import HashAlgorithm
    from modelsec.policy import Policy
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.layout import MODEL_IGNORE_PATHS
    from modelsec.signer.signing import compute_manifests
    from modelsec.verifier import load_model

    torch.set_num_threads(1)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-hash-modes-"))
    root.mkdir(parents=True, exist_ok=True)
    model_dir = root / "model"
    model_dir.mkdir(exist_ok=True)
    path = _model(model_dir, args.mib)
    raw = path.read_bytes()
    key = ec.generate_private_key(ec.SECP256R1())
    (root / "k.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (root / "k.pub.pem").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    sign_model(model_dir, [load_private_key_file(root / "k.pem")])
    policy = Policy.from_key_files([root / "k.pub.pem"])
    names = [n for n in load_model(path, policy)]
    ignore = list(MODEL_IGNORE_PATHS)

    rows: dict[str, tuple[Callable[[], object], str]] = {
        "sha256 1-core (ref)": (lambda: hashlib.sha256(raw).digest(), ""),
        "blake3 1-core (ref)": (lambda: blake3.blake3(raw).digest(), ""),
        "default sign hashing": (
            lambda: compute_manifests(path, [HashAlgorithm.SHA256], ignore_paths=ignore),
            "sha256 1-core (ref)",
        ),
        "blake3 mode hashing": (
            lambda: compute_manifests(path, [HashAlgorithm.BLAKE3], ignore_paths=ignore, tensor_hash=None),
            "blake3 1-core (ref)",
        ),
        "partial load (all tensors)": (
            lambda: load_model(model_dir, policy, tensors=names),
            "blake3 1-core (ref)",
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.repeat):
        for name, (fn, _) in rows.items():
            times[name].append(_time(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    gib = len(raw) / 2**30
    print(
        f"modelsec {modelsec.__file__}; {len(raw) / 2**20:.0f} MiB single file; {os.cpu_count()} CPUs; "
        f"median of {args.repeat} (shared machine: noisy, read the ratios)"
    )
    print(f"{'row':<28} {'s':>7} {'GiB/s':>7}  ratio to reference")
    for name, (_, ref) in rows.items():
        ratio = f"{med[name] / med[ref]:.2f} x {ref}" if ref else "-"
        print(f"{name:<28} {med[name]:7.3f} {gib / med[name]:7.2f}  {ratio}")


if __name__ == "__main__":
    main()
