"""Steps 3-4 of model verification: the directory holds exactly the signed files, and each hashes as signed.

Refusals by name (pickle formats, `*.py` without remote code) come with the file-set check; digests are
compared in constant time, per file and per tensor, and the side files are then handed to
`modelsec.verifier.side_files`. See `modelsec.verifier.verification` for the order.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.predicates.oms import Manifest, root_digest
from modelsec.errors import (
    DigestMismatchError,
    FileSetMismatchError,
    MalformedArtifactError,
    PickleContentError,
    PolicyViolationError,
)
from modelsec.limits import Limits
from modelsec.modelformat.hashing import (
    FileDigests,
    PrehashedFile,
    ProgressCallback,
    check_identity,
    hash_files,
    is_safetensors_name,
)
from modelsec.modelformat.model_files import (
    CODE_SUFFIXES,
    PICKLE_SUFFIXES,
    oms_order,
    open_beneath,
    open_model_root,
    walk_model,
)
from modelsec.modelformat.safetensors_header import read_header
from modelsec.policy import Policy
from modelsec.verifier.side_files import (
    INDEX_NAME,
    InterpretedSideFiles,
    check_side_files,
    parse_index,
    read_verified_side_file,
)
from modelsec.verifier.trust.signatures import SignedModel

__all__ = [
    "check_digests",
    "check_file_set",
    "precheck_file",
    "read_verified_index",
    "refuse_pickle",
    "refuse_pickle_content",
    "verify_files",
]


def check_file_set(
    signed: SignedModel, policy: Policy, *, only: Sequence[str] | None = None, root_fd: int | None = None
) -> list[str]:
    """Step 3: the files to hash, after the file-set comparison and the refusals by name.

    Args:
        signed: The verified bundles.
        policy: Remote-code rule and limits.
        only: Check just these signed names (single-shard verification) instead of the whole directory.
        root_fd: The model directory's descriptor to walk (not closed here); default: `signed.root_fd`,
            else opened by path.

    Returns:
        The names to hash, in manifest order.

    Raises:
        FileSetMismatchError: Extra or missing files (or a name in `only` that is not signed).
        PolicyViolationError: Pickle formats; Python modules (`CODE_SUFFIXES`, any case: `*.py`, `*.pyc`,
            `*.pyo`) unless remote code is allowed; symlinks.
    """
    model = str(signed.model_dir)
    if root_fd is None:
        root_fd = signed.root_fd
    signed_names = set(signed.manifest.names)
    if signed.manifest.single_file:
        raise MalformedArtifactError(
            f"{model}: the bundle signs a single file (resource '.'), not a directory; verify that "
            "file's path"
        )
    if only is not None:
        unsigned = [n for n in only if n not in signed_names]
        if unsigned:
            raise FileSetMismatchError(model, unsigned, [], requested=True)
        names = list(only)
    else:
        # A file is part of the set unless every verified bundle's signed list ignores it (OMS semantics),
        # or it is a bundle / operator-ignored path; a signed file is never ignored. So an unsigned file
        # that any one bundle neither lists nor ignores is extra.
        walked = walk_model(
            signed.model_dir,
            ignore_paths=signed.excluded,
            ignore_lists=[b.manifest.ignore_paths for b in signed.bundles],
            keep=signed_names,
            limits=policy.limits,
            root_fd=root_fd,
        )
        present = {f.name for f in walked}
        extra, missing = sorted(present - signed_names), sorted(signed_names - present)
        if extra or missing:
            raise FileSetMismatchError(model, extra, missing)
        names = list(signed.manifest.names)
    if policy.refuse_pickle:
        refuse_pickle(names, model)
    if not policy.allow_remote_code:
        code = [n for n in names if n.lower().endswith(CODE_SUFFIXES)]
        if code:
            raise PolicyViolationError(
                f"{model}: remote code is refused by policy: {', '.join(code)} (modelsec never imports it)"
            )
    return names


def verify_files(
    signed: SignedModel,
    names: Sequence[str],
    policy: Policy,
    *,
    tensor_hash: HashAlgorithm | None,
    whole_model: bool,
    progress: ProgressCallback | None = None,
    root_fd: int | None = None,
    prehashed: Mapping[str, PrehashedFile] | None = None,
) -> tuple[Mapping[str, FileDigests], int]:
    """Hash the files `names` of a signed model once and compare every digest with its manifests.

    A file of `prehashed` is not read again when those digests cover every digest compared here
    (`PrehashedFile.covers`: the file algorithms, the tensor algorithm, the same limits); its identity is
    then checked first (`check_identity`), and a file whose identity changed is refused, not re-hashed.
    Every other file is hashed here. The comparisons are the same either way.

    Args:
        signed: From `verify_signatures`; `names` from `check_file_set`.
        names: The files to hash.
        policy: Hash algorithms to recompute, limits, refusals.
        tensor_hash: Per-tensor digest algorithm to compute as well (None: file digests only).
        whole_model: The whole directory is being verified (index and remote-code checks apply).
        progress: Byte-count callback.
        root_fd: The model directory's descriptor that the walk used (not closed here); default: the
            directory is opened by its path.
        prehashed: Digests of files hashed as they were written, by name (`verify_model`).

    Returns:
        The computed digests by file, and how many per-tensor digests were checked.

    Raises:
        DigestMismatchError, MalformedArtifactError, PolicyViolationError: As `check_digests`; also a
            prehashed file whose identity changed (`DigestMismatchError`, `compared` "file identity ...").
    """
    if root_fd is None:
        fd = signed.open_root()
        try:
            return verify_files(
                signed,
                names,
                policy,
                tensor_hash=tensor_hash,
                whole_model=whole_model,
                progress=progress,
                root_fd=fd,
                prehashed=prehashed,
            )
        finally:
            os.close(fd)
    model = str(signed.model_dir)
    taken: dict[str, FileDigests] = {}
    for name in names:
        entry = (prehashed or {}).get(name)
        if entry is not None and entry.covers(signed.file_hashes, tensor_hash, policy.limits):
            check_identity(root_fd, name, entry.identity, model=model)
            taken[name] = entry.digests
    computed = hash_files(
        root_fd,
        [n for n in names if n not in taken],
        algorithms=signed.file_hashes,
        tensor_hash=tensor_hash,
        limits=policy.limits,
        progress=progress,
        model=model,
    )
    computed.update(taken)
    return computed, check_digests(signed, computed, policy, root_fd, whole_model=whole_model)


def check_digests(
    signed: SignedModel,
    computed: Mapping[str, FileDigests],
    policy: Policy,
    root_fd: int,
    *,
    whole_model: bool,
    interpreted: InterpretedSideFiles | None = None,
) -> int:
    """Steps 4-5: compare computed digests with every manifest, then interpret the side files.

    Args:
        signed: The verified bundles.
        computed: What the engine hashed (files or private buffers), by name.
        policy: Remote-code rule and limits.
        root_fd: Descriptor of the model root (side files are re-read and re-hashed).
        whole_model: Also check the model root digest (all files were hashed).
        interpreted: Side files an earlier call with these same `computed` digests already read and
            accepted (the loader checks side files while shards are still hashed): not re-read; the files
            this call accepts are added (`side_files.check_side_files`).

    Returns:
        The number of tensors whose per-tensor digests were compared.

    Raises:
        DigestMismatchError: A file, tensor or the root digest differs.
        MalformedArtifactError: Per-tensor digests missing, a bad weight index at any depth
            (`side_files.check_side_files`), or a JSON file that is not strict JSON or exceeds
            `Limits.max_json_side_file_bytes`.
        PickleContentError: A file's bytes are or may hold a pickle, under `refuse_pickle`.
        PolicyViolationError: Code references in a JSON file (`check_remote_code`), or a weight index that
            maps to a pickle shard while the policy refuses pickles.
    """
    model = str(signed.model_dir)
    checked = 0
    for b in signed.bundles:
        if b.manifest.hash_type in signed.file_hashes:
            checked = max(checked, _compare(b.manifest, computed, signed.tensor_hash, model))
    if policy.refuse_pickle:
        refuse_pickle_content(computed, model)
    if whole_model and HashAlgorithm.SHA256 in signed.file_hashes:
        root = root_digest([computed[n].digests[HashAlgorithm.SHA256] for n in signed.manifest.names]).hex()
        for b in signed.bundles:
            expected = b.manifest.subject_digest["sha256"]
            if b.manifest.hash_type is not HashAlgorithm.BLAKE3 and not hmac.compare_digest(expected, root):
                raise DigestMismatchError(f"{model} (model root)", expected, root)
    check_side_files(root_fd, computed, set(signed.manifest.names), policy, model, interpreted)
    return checked


def read_verified_index(signed: SignedModel, computed: FileDigests, policy: Policy) -> dict[str, str]:
    """Read `model.safetensors.index.json` after its digests matched, and return its checked weight_map.

    Args:
        signed: The verified bundles (the index must be one of their resources).
        computed: The engine's digests of the index file.
        policy: Limits.

    Returns:
        Tensor name -> shard name; every shard is a signed `*.safetensors` resource.

    Raises:
        DigestMismatchError: The index differs from the manifest (or changed since it was hashed).
        MalformedArtifactError: Not strict JSON, no weight_map, or a target that is not a signed shard.
    """
    model = str(signed.model_dir)
    for b in signed.bundles:
        if b.manifest.hash_type in signed.file_hashes:
            _compare(b.manifest, {INDEX_NAME: computed}, None, model)
    root_fd = signed.open_root()
    try:
        raw = read_verified_side_file(root_fd, INDEX_NAME, computed, policy.limits, model)
    finally:
        os.close(root_fd)
    # The loader builds tensors from safetensors only: a pickle target is refused whatever the policy says.
    return parse_index(raw, INDEX_NAME, set(signed.manifest.names), refuse_pickle=True, model=model)


def precheck_file(path: Path, policy: Policy, *, root_fd: int | None = None) -> None:
    """Refuse a single file for what it is, before any bundle is looked for.

    Pickle formats are refused by name (unless the policy allows them as opaque files) and a
    `*.safetensors` file's header is parsed strictly, so the diagnostic names the real defect.

    Args:
        path: The file.
        policy: Pickle rule and limits.
        root_fd: A descriptor of the file's directory to open `path.name` in (not closed here); default:
            the directory is opened by path.

    Raises:
        PolicyViolationError: A pickle format.
        MalformedArtifactError: A malformed safetensors header.
    """
    if policy.refuse_pickle:
        refuse_pickle([path.name], str(path.parent))
    if is_safetensors_name(path.name):
        _check_safetensors_structure(path, policy.limits, root_fd)


def _check_safetensors_structure(path: Path, limits: Limits, root_fd: int | None) -> None:
    # The same no-symlink open as every other read: refusals are modelsec errors, never a raw OSError.
    if root_fd is None:
        parent_fd = open_model_root(path.parent)
        try:
            fd = open_beneath(parent_fd, path.name, what=str(path.parent))
        finally:
            os.close(parent_fd)
    else:
        fd = open_beneath(root_fd, path.name, what=str(path.parent))
    with os.fdopen(fd, "rb") as f:
        read_header(f, os.fstat(f.fileno()).st_size, path=str(path), limits=limits)


def refuse_pickle(names: Sequence[str], model: str) -> None:
    """Refuse pickle formats by name (`PICKLE_SUFFIXES`).

    Raises:
        PolicyViolationError: A name ends with a pickle suffix.
    """
    pickles = [n for n in names if n.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise PolicyViolationError(
            f"{model}: pickle format not allowed: {', '.join(pickles)} (unpickling runs code even when "
            "signed; convert the weights to safetensors)"
        )


def refuse_pickle_content(computed: Mapping[str, FileDigests], model: str) -> None:
    """Refuse files whose hashed bytes are, or may hold, a pickle, whatever their names.

    The verdict is the hashing engine's (`FileDigests.pickle`, from `modelsec.modelformat.content`), made on
    the very bytes that were hashed: a torch zip named `checkpoint.pth.tar`, a `classifier.pkl.gz`, a
    pickle renamed `weights.bin.json`, and an archive or compressed file that could not be inspected
    completely within `Limits.max_content_inspect_bytes` (it may hold pickles).

    Raises:
        PickleContentError: The first such file in OMS order, with what its bytes are.
    """
    for name in sorted(computed, key=oms_order):
        finding = computed[name].pickle
        if finding is not None:
            raise PickleContentError(f"{model}/{name}", finding)


def _compare(
    manifest: Manifest, computed: Mapping[str, FileDigests], tensor_hash: HashAlgorithm | None, model: str
) -> int:
    checked = 0
    for name, got in computed.items():
        resource = manifest.resource(name)
        if resource is None:  # the caller guarantees equal name sets; kept as a fail-closed guard
            raise FileSetMismatchError(model, [name], [])
        actual = got.digests[manifest.hash_type]
        if not hmac.compare_digest(actual, resource.digest):
            raise DigestMismatchError(
                f"{model}/{name}", resource.digest.hex(), actual.hex(), algorithm=manifest.hash_type.value
            )
        if manifest.tensor_hash is None or manifest.tensor_hash is not tensor_hash:
            continue
        signed = manifest.tensors.get(name)
        if got.tensors is None and signed is None:
            continue
        if signed is None or got.tensors is None:
            raise MalformedArtifactError(
                f"{model}/{name}: per-tensor digests missing from the signed manifest"
            )
        if set(signed) != set(got.tensors):
            raise DigestMismatchError(
                f"{model}/{name}",
                ", ".join(sorted(signed)),
                ", ".join(sorted(got.tensors)),
                compared="tensor names",
            )
        for tname, entry in signed.items():
            t = got.tensors[tname]
            if (t.dtype, t.shape, t.begin, t.end) != (entry.dtype, entry.shape, entry.begin, entry.end):
                raise DigestMismatchError(
                    f"{model}/{name}:`{tname}`",
                    f"{entry.dtype}{list(entry.shape)}@{entry.begin}-{entry.end}",
                    f"{t.dtype}{list(t.shape)}@{t.begin}-{t.end}",
                    compared="dtype/shape/offsets",
                )
            if not hmac.compare_digest(t.digest, entry.digest):
                raise DigestMismatchError(
                    f"{model}/{name}:`{tname}`",
                    entry.digest.hex(),
                    t.digest.hex(),
                    algorithm=tensor_hash.value,
                )
            checked += 1
    return checked
