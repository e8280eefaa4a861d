"""Step 5 of model verification: JSON side files interpreted, only after their bytes matched the manifest.

Code references (`auto_map`, `custom_pipelines`) are refused unless the policy allows remote code, and then
only local references to signed modules pass (the rules live in `modelsec.modelformat.side_json`, shared
with the signer); every weight index at any depth (`*.index.json`, `*.index.<variant>.json`) must name
signed shards of a permitted format inside its own folder that hold the tensors it maps
(`modelsec.modelformat.shard_index`, also shared with the signer).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Collection, Mapping

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import DigestMismatchError
from modelsec.limits import Limits
from modelsec.modelformat import shard_index
from modelsec.modelformat.hashing import FileDigests, new_hasher
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.shard_index import INDEX_NAME, is_index_name, parse_index
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
    "check_indexes",
    "check_json_code",
    "check_remote_code",
    "parse_index",
    "read_verified_side_file",
    "remote_code_references",
]


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


def check_indexes(
    root_fd: int, computed: Mapping[str, FileDigests], signed: set[str], policy: Policy, model: str
) -> None:
    """Re-read every verified weight index and hold it to `modelsec.modelformat.shard_index.check_index`.

    Every hashed file that `shard_index.is_index_name` names an index (any depth, any variant, safetensors
    or pickle) is checked: targets inside its folder, signed, a permitted format under `policy`'s pickle
    rule, and each tensor held by its safetensors shard, as the header read while hashing that shard says
    (shards not hashed by this call are not checked).

    Raises:
        DigestMismatchError: An index changed since it was hashed.
        MalformedArtifactError: A bad index, a target outside its folder, unsigned or not a weight file, or
            a tensor its shard does not hold.
        PolicyViolationError: A pickle target while the policy refuses pickles.
    """

    def tensors_of(name: str) -> set[str] | None:
        if name not in computed:
            return None
        header = computed[name].header
        return {t.name for t in header.tensors} if header is not None else set()

    for index in sorted(n for n in computed if is_index_name(n)):
        raw = read_verified_side_file(root_fd, index, computed[index], policy.limits, model)
        shard_index.check_index(
            raw, index, signed, tensors_of, refuse_pickle=policy.refuse_pickle, model=model
        )
