"""Weight-index attacks on the runtime guard, runnable in-process or as a script under another transformers.

Issue 27 item 1: transformers loads a local sharded checkpoint through `get_checkpoint_shard_files`, which
joins each `weight_map` value onto the folder with `os.path.join` (an absolute value replaces the folder)
and never reaches the hooked `cached_files`. transformers 5.25 refuses names outside the folder itself,
5.24 does not: the guard must refuse whatever the framework checks.

`write_models(root, sign)` writes the models (small real BERTs); `run_case(name, models)` runs one load
and returns `{"value": ...}` or `{"error": "module.Class", "message": ...}`. Run as a script
(`python _index_cases.py MODELS_DIR`, with `$MODELSEC_POLICY` set so that the start-up hook installs the
guard, as in production) it runs every case and prints one JSON line. It imports only torch, transformers,
safetensors and modelsec, so that it also runs with another transformers first on `PYTHONPATH`.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHARD = "model-00001-of-00001.safetensors"
VARIANT_SHARD = "model.fp16-00001-of-00001.safetensors"
INDEX = "model.safetensors.index.json"
VARIANT_INDEX = "model.safetensors.index.fp16.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
CHECKED = "embeddings.word_embeddings.weight"


class _Payload:
    """Unpickling it creates the file `marker`: evidence that an unverified pickle ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return exec, (f"open({self.marker!r}, 'w').write('unpickled')",)


def _bert(out: Path, seed: int, weights: str, index: str | None, target: str | None = None) -> dict[str, Any]:
    """A tiny BertModel in `out`: config, one safetensors shard `weights`, and optionally an index."""
    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
    )
    state = {k: v.contiguous() for k, v in transformers.BertModel(config).state_dict().items()}
    out.mkdir(parents=True, exist_ok=True)
    config.to_json_file(out / "config.json")
    save_file(state, out / weights)
    if index is not None:
        total = sum(v.numel() * v.element_size() for v in state.values())
        weight_map = dict.fromkeys(state, target or weights)
        (out / index).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return state


def write_models(root: Path, sign: Callable[[Path], None], marker: Path) -> dict[str, Any]:
    """Write and sign every model; returns the paths (str) and the checksum each good load must give."""
    import torch

    models = root / "models"
    # B: another signed model, whose shard the attacks name.
    other = models / "other"
    other_state = _bert(other, 1, SHARD, INDEX)
    sign(other)
    outside = root / "outside"
    outside.mkdir()
    payload = outside / "pytorch_model-00001-of-00001.bin"
    payload.write_bytes(pickle.dumps(_Payload(str(marker)), protocol=2))
    # (a) a pickle index naming an absolute path outside the model (the shard is never signed).
    pickle_abs = models / "pickle-absolute"
    _bert(pickle_abs, 0, "unused.safetensors", None)
    (pickle_abs / "unused.safetensors").unlink()
    (pickle_abs / PICKLE_INDEX).write_text(
        json.dumps(
            {"metadata": {}, "weight_map": {CHECKED: str(payload), "pooler.dense.weight": str(payload)}}
        )
    )
    sign(pickle_abs)
    # (b) text_encoder/model.safetensors.index.json naming the other signed model's shard.
    sub_other = models / "subfolder-other"
    _bert(sub_other / "text_encoder", 0, SHARD, INDEX, target=str(other / SHARD))
    sign(sub_other)
    # (c) the same through the fp16 variant index.
    var_other = models / "variant-other"
    _bert(var_other / "text_encoder", 0, VARIANT_SHARD, VARIANT_INDEX, target=str(other / SHARD))
    sign(var_other)
    # A good model: a subfolder with a plain and a variant index, each naming its own shard.
    good = models / "good"
    good_state = _bert(good / "text_encoder", 2, SHARD, INDEX)
    variant_state = _bert(good / "text_encoder", 3, VARIANT_SHARD, VARIANT_INDEX)
    sign(good)

    def checksum(state: dict[str, Any]) -> float:
        return float(torch.as_tensor(state[CHECKED]).double().sum().item())

    return {
        "models": str(models),
        "other": str(other),
        "pickle_absolute": str(pickle_abs),
        "subfolder_other": str(sub_other),
        "variant_other": str(var_other),
        "good": str(good),
        "payload": str(payload),
        "checksums": {
            "other": checksum(other_state),
            "good": checksum(good_state),
            "good_variant": checksum(variant_state),
        },
    }


def _checksum(model: Any) -> float:
    return float(model.embeddings.word_embeddings.weight.detach().double().sum().item())


CASES: dict[str, Callable[[dict[str, Any]], object]] = {}


def _case(f: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], object]:
    CASES[f.__name__] = f
    return f


@_case
def pickle_absolute(m: dict[str, Any]) -> object:
    from transformers import BertModel

    return _checksum(BertModel.from_pretrained(m["pickle_absolute"]))


@_case
def subfolder_other(m: dict[str, Any]) -> object:
    from transformers import BertModel

    return _checksum(BertModel.from_pretrained(m["subfolder_other"], subfolder="text_encoder"))


@_case
def variant_other(m: dict[str, Any]) -> object:
    from transformers import BertModel

    return _checksum(BertModel.from_pretrained(m["variant_other"], subfolder="text_encoder", variant="fp16"))


@_case
def good(m: dict[str, Any]) -> object:
    from transformers import BertModel

    return _checksum(BertModel.from_pretrained(m["good"], subfolder="text_encoder"))


@_case
def good_variant(m: dict[str, Any]) -> object:
    from transformers import BertModel

    return _checksum(BertModel.from_pretrained(m["good"], subfolder="text_encoder", variant="fp16"))


@_case
def shard_files_direct(m: dict[str, Any]) -> object:
    """transformers' own shard resolution, called with the signed directory's paths."""
    from transformers.utils.hub import get_checkpoint_shard_files

    index = os.path.join(m["good"], "text_encoder", INDEX)
    shards, _ = get_checkpoint_shard_files(m["good"], index, subfolder="text_encoder")
    return [str(s) for s in shards]


def run_case(name: str, models: dict[str, Any]) -> dict[str, Any]:
    """Run one case: `{"value": ...}` or `{"error": "module.Class", "message": ...}`."""
    try:
        value = CASES[name](models)
    except Exception as e:  # noqa: BLE001 - every failure is the case's result, reported by class
        return {"error": f"{type(e).__module__}.{type(e).__name__}", "message": str(e)}
    return {"value": value}


def main(models_json: str) -> None:
    import torch
    import transformers

    from modelsec.verifier.guard import hook

    torch.set_num_threads(1)
    if not hook.installed():
        raise SystemExit("the runtime guard is not installed: set MODELSEC_POLICY")
    models = json.loads(Path(models_json).read_text())
    results = {name: run_case(name, models) for name in CASES}
    print(json.dumps({"transformers": transformers.__version__, "results": results}))


if __name__ == "__main__":
    main(sys.argv[1])
