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
from dataclasses import dataclass, field

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
    "InterpretedSideFiles",
    "check_remote_code",
    "check_side_files",
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


@dataclass(slots=True)
class InterpretedSideFiles:
    """JSON side files a `check_side_files` call read, interpreted and accepted, for a later call to reuse.

    The verified loader checks the side files while the shards are still being read, then checks the whole
    set again with the shards' headers: a file is not read and parsed again when the later call is given
    the very same `FileDigests` object it was accepted with (so the same verified bytes), and a weight
    index's parsed map is reused for the check against the headers.

    Attributes:
        digests: Name -> the digests the file was accepted under.
        weight_maps: Index name -> its parsed weight map (`shard_index.parse_index`).
    """

    digests: dict[str, FileDigests] = field(default_factory=dict)
    weight_maps: dict[str, dict[str, str]] = field(default_factory=dict)

    def covers(self, name: str, digests: FileDigests) -> bool:
        """Whether `name` was accepted with exactly these digests."""
        return self.digests.get(name) is digests


def check_side_files(
    root_fd: int,
    computed: Mapping[str, FileDigests],
    signed: Collection[str],
    policy: Policy,
    model: str,
    interpreted: InterpretedSideFiles | None = None,
) -> None:
    """Re-read every hashed `*.json` file (bounded, re-hashed), refuse its code references, check the indexes.

    First every JSON file is parsed strictly and its code references refused unless the policy allows
    them (`side_json.check_json_side_file`); then every file that `shard_index.is_index_name` names an index
    (any depth, any variant, safetensors or pickle) is held to the index rules: targets inside its folder,
    signed, a permitted format under `policy`'s pickle rule, and each tensor held by its safetensors shard,
    as the header read while hashing that shard says (shards not in `computed` are not checked). Each file
    is read and decoded once.

    Args:
        root_fd: The model root's descriptor.
        computed: What the engine hashed, by name; the digests were compared with the manifests.
        signed: The model's signed names.
        policy: Remote-code and pickle rules, limits.
        model: Names the model in errors.
        interpreted: Files an earlier call accepted (not re-read when their digests are the same object
            here; their indexes' maps are checked against the headers in `computed` again); the files this
            call accepts are added.

    Raises:
        DigestMismatchError: A JSON file changed since it was hashed.
        MalformedArtifactError: Too large, not strict JSON, a bad index, a target outside its folder,
            unsigned or not a weight file, or a tensor its shard does not hold.
        PolicyViolationError: Code references the policy refuses (`check_remote_code`), or a pickle target
            while the policy refuses pickles.
    """
    done = interpreted if interpreted is not None else InterpretedSideFiles()
    docs: dict[str, object] = {}
    for name, digests in computed.items():
        if not is_json_side_file(name) or done.covers(name, digests):
            continue
        raw = read_verified_side_file(root_fd, name, digests, policy.limits, model)
        docs[name] = check_json_side_file(
            name, raw, signed, allow_remote_code=policy.allow_remote_code, model=model
        )

    def tensors_of(name: str) -> set[str] | None:
        if name not in computed:
            return None
        header = computed[name].header
        return {t.name for t in header.tensors} if header is not None else set()

    weight_maps: dict[str, dict[str, str]] = {}
    for index in sorted(n for n in computed if is_index_name(n)):
        # Every index name is a `*.json` side file: decoded above, or accepted (with its map) by the earlier
        # call that `done` covers it for.
        if index in docs:
            weight_map = shard_index.weight_map_of(
                docs[index], index, signed, refuse_pickle=policy.refuse_pickle, model=model
            )
        else:
            weight_map = done.weight_maps[index]
        shard_index.check_shards_hold(weight_map, index, tensors_of, model=model)
        weight_maps[index] = weight_map
    for name in (*docs, *weight_maps):
        done.digests[name] = computed[name]
    done.weight_maps.update(weight_maps)
