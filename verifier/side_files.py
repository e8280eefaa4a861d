"""Step 5 of model verification: JSON side files interpreted, only after their bytes matched the manifest.

Code references (`auto_map`, `custom_pipelines`) are refused unless the policy allows remote code, and then
only local references to signed modules pass (the rules live in `modelsec.modelformat.side_json`, shared
with the signer); `model.safetensors.index.json` must name signed shards that hold the tensors it maps.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Collection, Mapping

from modelsec._strict_json import strict_loads
from modelsec.algorithms import HashAlgorithm
from modelsec.errors import DigestMismatchError, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import FileDigests, new_hasher
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.side_json import (
    check_json_side_file,
    check_json_side_file_size,
    check_remote_code,
    is_json_side_file,
    remote_code_references,
)
from modelsec.policy import Policy

__all__ = [
    "INDEX_NAME",
    "check_index",
    "check_json_code",
    "check_remote_code",
    "parse_index",
    "read_verified_side_file",
    "remote_code_references",
]

INDEX_NAME = "model.safetensors.index.json"


def read_verified_side_file(
    root_fd: int, name: str, expected: FileDigests, limits: Limits, model: str
) -> bytes:
    """Read a small side file again and make sure it is byte-identical to what was hashed."""
    check_json_side_file_size(name, expected.size, limits, model)
    fd = open_beneath(root_fd, name, what=model)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limits.max_json_side_file_bytes + 1)
    algorithm = (
        HashAlgorithm.SHA256 if HashAlgorithm.SHA256 in expected.digests else next(iter(expected.digests))
    )
    h = new_hasher(algorithm)
    h.update(data)
    if not hmac.compare_digest(h.digest(), expected.digests[algorithm]):
        raise DigestMismatchError(
            f"{model}/{name}", expected.digests[algorithm].hex(), h.digest().hex(), algorithm=algorithm.value
        )
    return data


def check_json_code(
    root_fd: int,
    computed: Mapping[str, FileDigests],
    signed_names: Collection[str],
    policy: Policy,
    model: str,
) -> None:
    """Re-read every hashed `*.json` file (bounded, re-hashed) and refuse the code references in it.

    Raises:
        DigestMismatchError: A JSON file changed since it was hashed.
        MalformedArtifactError: Too large, or not strict JSON.
        PolicyViolationError: Code references the policy refuses (`check_remote_code`).
    """
    for name in computed:
        if not is_json_side_file(name):
            continue
        raw = read_verified_side_file(root_fd, name, computed[name], policy.limits, model)
        check_json_side_file(name, raw, signed_names, allow_remote_code=policy.allow_remote_code, model=model)


def parse_index(raw: bytes, signed: set[str], what: str) -> dict[str, str]:
    """The weight_map of an index file; every target a signed `*.safetensors` name in `signed`.

    Raises:
        MalformedArtifactError: Not strict JSON, no weight_map object, or a target that is not a signed shard.
    """
    doc = strict_loads(raw, what=what, bounded_ints=False)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise MalformedArtifactError(f"{what}: weight_map is missing or not an object")
    for tensor, target in weight_map.items():
        if not isinstance(target, str) or target not in signed or not target.endswith(".safetensors"):
            raise MalformedArtifactError(
                f"{what}: weight_map[`{tensor}`] -> {target!r} is not a signed safetensors file of the model"
            )
    return weight_map


def check_index(
    root_fd: int, computed: Mapping[str, FileDigests], signed: set[str], limits: Limits, model: str
) -> None:
    """Re-read the verified index and check that each tensor it maps is held by its (hashed) shard.

    Raises:
        DigestMismatchError: The index changed since it was hashed.
        MalformedArtifactError: A bad index, or a tensor its shard does not hold.
    """
    what = f"{model}/{INDEX_NAME}"
    raw = read_verified_side_file(root_fd, INDEX_NAME, computed[INDEX_NAME], limits, model)
    weight_map = parse_index(raw, signed, what)
    held: dict[str, set[str]] = {}
    for tensor, target in weight_map.items():
        if target not in held and target in computed:
            header = computed[target].header
            held[target] = {t.name for t in header.tensors} if header is not None else set()
        if target in held and tensor not in held[target]:
            raise MalformedArtifactError(
                f"{what}: weight_map names `{tensor}`, which {target!r} does not hold"
            )
