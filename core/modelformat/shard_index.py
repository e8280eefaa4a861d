"""`model.safetensors.index.json`: the weight map of a sharded model, and the rules it is held to.

The one home of the index rules, shared by the verifier (step 5 of `modelsec.verifier.verification`, on the
signed bytes and the headers read while hashing) and the signer (`sign` refuses before hashing an index
that verification will always refuse, unless told to sign anyway):

* the file is strict JSON with a `weight_map` object;
* every target is one of the model's (signed or to-be-signed) `*.safetensors` files;
* every tensor it maps is held by the shard it names.

Only the top-level index is interpreted (a loader reads it to find a tensor's shard); other metadata in
it (`metadata.total_size`) is not checked. Nothing here decides which files are signed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

from modelsec.errors import Error, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import is_safetensors_name
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.safetensors_header import read_header
from modelsec.strict_json import strict_loads

__all__ = ["INDEX_NAME", "check_index", "parse_index", "shard_tensors_on_disk"]

INDEX_NAME = "model.safetensors.index.json"

TensorsOf = Callable[[str], Collection[str] | None]
"""A shard's tensor names, or None when the caller does not know them (the shard is not checked)."""


def parse_index(raw: bytes, shards: Collection[str], what: str) -> dict[str, str]:
    """The weight_map of an index file; every target a `*.safetensors` name among `shards`.

    Whether each shard holds the tensors mapped to it is not checked here; see `check_index`.

    Args:
        raw: The index file's bytes.
        shards: The model's file names (signed, or to be signed).
        what: Names the index file in errors (e.g. `model/model.safetensors.index.json`).

    Returns:
        Tensor name -> shard name.

    Raises:
        MalformedArtifactError: Not strict JSON, no weight_map object, or a target that is not a
            safetensors file among `shards`.
    """
    doc = strict_loads(raw, what=what, bounded_ints=False)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise MalformedArtifactError(f"{what}: weight_map is missing or not an object")
    for tensor, target in weight_map.items():
        if not isinstance(target, str) or target not in shards or not is_safetensors_name(target):
            raise MalformedArtifactError(
                f"{what}: weight_map[`{tensor}`] -> {target!r} is not a signed safetensors file of the model"
            )
    return weight_map


def check_index(raw: bytes, shards: Collection[str], tensors_of: TensorsOf, what: str) -> dict[str, str]:
    """Parse an index (`parse_index`) and check that each tensor it maps is held by the shard it names.

    Args:
        raw: The index file's bytes.
        shards: The model's file names (signed, or to be signed).
        tensors_of: A shard's tensor names (from its parsed header), or None for a shard not checked
            (e.g. not hashed by a partial verification); called once per shard.
        what: Names the index file in errors.

    Returns:
        Tensor name -> shard name.

    Raises:
        MalformedArtifactError: As `parse_index`, or a tensor its shard does not hold.
    """
    weight_map = parse_index(raw, shards, what)
    held: dict[str, Collection[str] | None] = {}
    for tensor, target in weight_map.items():
        if target not in held:
            held[target] = tensors_of(target)
        names = held[target]
        if names is not None and tensor not in names:
            raise MalformedArtifactError(
                f"{what}: weight_map names `{tensor}`, which {target!r} does not hold"
            )
    return weight_map


def shard_tensors_on_disk(root_fd: int, limits: Limits, model: str) -> TensorsOf:
    """A `tensors_of` for `check_index` that reads each shard's header beneath `root_fd` (no link followed).

    For the signer, before hashing. A shard that cannot be opened or whose header is malformed gives None
    (not checked here): the hashing pass refuses it with its own defect, whatever the index says. The
    verifier uses the headers read while hashing instead.
    """

    def tensors_of(name: str) -> set[str] | None:
        try:
            fd = open_beneath(root_fd, name, what=model)
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                header, _ = read_header(f, size, path=f"{model}/{name}", limits=limits)
        except Error:
            return None
        return {t.name for t in header.tensors}

    return tensors_of
