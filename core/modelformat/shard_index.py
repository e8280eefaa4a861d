"""Weight indexes (`model.safetensors.index.json` and every other): the weight map of a sharded model.

The one home of the index rules, shared by the verifier (step 5 of `modelsec.verifier.verification`, on the
signed bytes and the headers read while hashing) and the signer (`sign` refuses before hashing an index
that verification will always refuse, unless told to sign anyway).

Which files are indexes (`is_index_name`): every `*.index.json` and `*.index.<variant>.json` at any depth,
in any letter case — `model.safetensors.index.json`, `pytorch_model.bin.index.json`,
`model.safetensors.index.fp16.json` (transformers' `_add_variant`),
`text_encoder/model.safetensors.index.json`,
`diffusion_pytorch_model.safetensors.index.json`. A loader finds shards by joining each target onto the
index's folder (transformers' `get_checkpoint_shard_files` uses `os.path.join`, where an absolute target
replaces the folder), so each index is held to these rules:

* the file is strict JSON with a `weight_map` object;
* every target is a clean relative name (`model_files.validate_resource_name`: not absolute, no `..`),
  resolved inside the index's own folder;
* it names a weight file of a permitted format: `*.safetensors`, or a pickle format (`PICKLE_SUFFIXES`) only
  where the policy allows pickles;
* that file is one of the model's signed (or to-be-signed) files;
* every tensor mapped to a safetensors shard is held by that shard (pickle shards are not parsed).

Other metadata in an index (`metadata.total_size`) is not checked. Nothing here decides which files are
signed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping

from modelsec.errors import Error, MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import is_safetensors_name
from modelsec.modelformat.model_files import PICKLE_SUFFIXES, open_beneath, validate_resource_name
from modelsec.modelformat.safetensors_header import read_header
from modelsec.strict_json import strict_loads

__all__ = [
    "INDEX_NAME",
    "check_index",
    "check_shards_hold",
    "is_index_name",
    "parse_index",
    "shard_tensors_on_disk",
    "weight_map_of",
]

INDEX_NAME = "model.safetensors.index.json"
"""The top-level safetensors index: the one the verified loader reads to find a tensor's shard."""

# `<base>.index.json` or `<base>.index.<variant>.json`; `model_index.json` (a diffusers pipeline) is not one.
_INDEX_PATTERN = re.compile(r".+\.index(?:\.[^/]+)?\.json")

TensorsOf = Callable[[str], Collection[str] | None]
"""A shard's tensor names, or None when the caller does not know them (the shard is not checked)."""


def is_index_name(name: str) -> bool:
    """Whether `name` (a relative POSIX path) is a weight index held to this module's rules.

    `*.index.json` and `*.index.<variant>.json` at any depth, compared lower-cased (a case-insensitive file
    system opens `MODEL.SAFETENSORS.INDEX.JSON` for `model.safetensors.index.json`).
    """
    return _INDEX_PATTERN.fullmatch(name.rpartition("/")[2].lower()) is not None


def _shard_name(
    index: str, tensor: str, target: object, names: Collection[str], refuse_pickle: bool, what: str
) -> str:
    """One weight_map target resolved to a model-relative name, or the refusal naming the entry."""
    entry = f"{what}: weight_map[`{tensor}`] -> {target!r}"
    if not isinstance(target, str):
        raise MalformedArtifactError(f"{entry} is not a file name")
    try:
        validate_resource_name(target, what=what)
    except MalformedArtifactError as e:
        raise MalformedArtifactError(
            f"{entry} is not a file inside the index's folder ({e.diagnostics().removeprefix(what + ': ')})"
        ) from None
    folder = index.rpartition("/")[0]
    name = f"{folder}/{target}" if folder else target
    if name.lower().endswith(PICKLE_SUFFIXES):
        if refuse_pickle:
            raise PolicyViolationError(
                f"{entry} is a pickle format, refused by policy (refusePickle: unpickling runs code even "
                "when signed; convert the weights to safetensors)"
            )
    elif not is_safetensors_name(name):
        raise MalformedArtifactError(
            f"{entry} is not a weight file (*.safetensors, or a pickle format where allowed)"
        )
    if name not in names:
        raise MalformedArtifactError(f"{entry} is not a signed file of the model")
    return name


def parse_index(
    raw: bytes, index: str, names: Collection[str], *, refuse_pickle: bool = True, model: str
) -> dict[str, str]:
    """The weight_map of the index file `index`, every target resolved and held to the module's rules.

    Whether each shard holds the tensors mapped to it is not checked here; see `check_index`.

    Args:
        raw: The index file's bytes.
        index: Its relative name in the model (`model.safetensors.index.json`, `unet/…index.fp16.json`).
        names: The model's file names (signed, or to be signed).
        refuse_pickle: The policy's pickle rule (a pickle target is refused when True).
        model: Names the model in errors (the index is named `<model>/<index>`).

    Returns:
        Tensor name -> shard name relative to the model root (`<index folder>/<target>`).

    Raises:
        MalformedArtifactError: Not strict JSON, no weight_map object, or a target that is not a clean
            relative name, not a weight file, or not among `names`.
        PolicyViolationError: A pickle target while `refuse_pickle`.
    """
    doc = strict_loads(raw, what=f"{model}/{index}", bounded_ints=False)
    return weight_map_of(doc, index, names, refuse_pickle=refuse_pickle, model=model)


def weight_map_of(
    doc: object, index: str, names: Collection[str], *, refuse_pickle: bool = True, model: str
) -> dict[str, str]:
    """`parse_index` of an index already decoded by `strict_loads(raw, bounded_ints=False)` (same errors).

    For a caller that decoded the file once for another check too (the verifier's remote-code scan).
    """
    what = f"{model}/{index}"
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise MalformedArtifactError(f"{what}: weight_map is missing or not an object")
    # Many tensors name the same shard: each distinct target is resolved (and refused) once, at its first
    # entry, so the refusal names the same entry as resolving every one would.
    resolved: dict[object, str] = {}
    out: dict[str, str] = {}
    for tensor, target in weight_map.items():
        name = resolved.get(target) if isinstance(target, str) else None
        if name is None:
            name = _shard_name(index, tensor, target, names, refuse_pickle, what)
            resolved[target] = name
        out[tensor] = name
    return out


def check_index(
    raw: bytes,
    index: str,
    names: Collection[str],
    tensors_of: TensorsOf,
    *,
    refuse_pickle: bool = True,
    model: str,
) -> dict[str, str]:
    """Parse an index (`parse_index`) and check that each tensor it maps is held by the shard it names.

    Args:
        raw: The index file's bytes.
        index: Its relative name in the model.
        names: The model's file names (signed, or to be signed).
        tensors_of: A safetensors shard's tensor names (from its parsed header), or None for a shard not
            checked (e.g. not hashed by a partial verification); called once per shard, with the
            model-relative name.
        refuse_pickle: The policy's pickle rule.
        model: Names the model in errors.

    Returns:
        Tensor name -> shard name relative to the model root.

    Raises:
        MalformedArtifactError: As `parse_index`, or a tensor its shard does not hold.
        PolicyViolationError: As `parse_index`.
    """
    weight_map = parse_index(raw, index, names, refuse_pickle=refuse_pickle, model=model)
    check_shards_hold(weight_map, index, tensors_of, model=model)
    return weight_map


def check_shards_hold(
    weight_map: Mapping[str, str], index: str, tensors_of: TensorsOf, *, model: str
) -> None:
    """Check that each tensor of a parsed weight map (`parse_index`) is held by the shard it names.

    Args:
        weight_map: Tensor name -> model-relative shard name, as `parse_index` returns it.
        index: The index's relative name, for errors.
        tensors_of: As `check_index`'s.
        model: Names the model in errors.

    Raises:
        MalformedArtifactError: A tensor its shard does not hold.
    """
    held: dict[str, Collection[str] | None] = {}
    for tensor, target in weight_map.items():
        if not is_safetensors_name(target):
            continue  # a pickle shard (allowed by policy) has no header to compare with
        if target not in held:
            held[target] = tensors_of(target)
        in_shard = held[target]
        if in_shard is not None and tensor not in in_shard:
            raise MalformedArtifactError(
                f"{model}/{index}: weight_map names `{tensor}`, which {target!r} does not hold"
            )


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
