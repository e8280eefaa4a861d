"""Verify a model directory (or one file of it) against its signed bundles and a policy.

Verification order (an invariant: each step runs only if every earlier one passed, and no model file is
opened before step 4):

1. The path is a real directory (or a regular file in one); bundles are read with a size limit, without
   following links, and parsed strictly (media type, exactly one DSSE signature, exact payloadType).
2. Each bundle's signature is checked over the DSSE PAE with the *policy's* keys (the bundle's hint and
   keyid only order the candidates); then the statement and its OMS manifest are parsed strictly, resource
   names included (no traversal). Every required algorithm must have signed; all bundles must describe
   the same files. When the policy requires attestations (watermark, robustness gate), they are checked
   now against the signed root digest (`modelsec.verifier.attestations`).
3. The directory is walked (no symlinks, no special files, signed ignore list applied exactly) and must
   hold exactly the signed files; default-policy refusals by name follow (pickle formats; `*.py` unless
   remote code is allowed).
4. Every file is hashed once (all needed digests in one pass, safetensors headers parsed strictly, every
   other file's bytes classified by `modelsec.modelformat.content`) and compared in constant time;
   per-tensor digests are compared when the manifest carries them. Then, under `refusePickle`, a file whose
   hashed bytes are or may hold a pickle is refused whatever its name (`PickleContentError`). A file
   given in `prehashed` (a pull that hashed it as it wrote it, `modelsec.modelformat.hashing.PrehashedFile`)
   is not read again when its identity is unchanged and its digests cover all of these; the comparisons
   and refusals are the same.
5. Side files are interpreted only after their bytes matched: every `*.json` file at any depth is read
   again (bounded by `Limits.max_json_side_file_bytes`; a larger one is refused, never skipped), re-hashed
   and searched for code references (`auto_map` at any nesting depth, `custom_pipelines`): refused unless
   the policy allows remote code, and even then only local references to signed modules pass; then
   every weight index at any depth and in any naming (`*.index.json`, `*.index.<variant>.json`): targets
   must be signed shards inside the index's folder, of a permitted format, that hold the named tensors.

Metadata inside safetensors headers never influences any decision.

Steps 1-2 live in `modelsec.verifier.trust.signatures` (trust: `bundles`, `identity`), 3-4 in
`modelsec.verifier.files`, 5 in `modelsec.verifier.side_files`; this module opens the model and runs them in
order.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations.predicates.oms import Manifest
from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.modelformat.hashing import PrehashedFile, ProgressCallback
from modelsec.modelformat.model_files import PICKLE_SUFFIXES, open_beneath, open_model_root
from modelsec.policy import Policy, PolicySet
from modelsec.verifier.admission import ModelAdmission, admit_opened
from modelsec.verifier.files import (
    check_digests,
    check_file_set,
    precheck_file,
    read_verified_index,
    refuse_pickle,
    verify_files,
)
from modelsec.verifier.side_files import INDEX_NAME, check_remote_code, remote_code_references
from modelsec.verifier.trust.bundles import read_bundle, verify_bundle_signature
from modelsec.verifier.trust.signatures import (
    SignedModel,
    VerifiedBundle,
    bind_single_file,
    verify_signatures,
)

if TYPE_CHECKING:
    from modelsec.verifier.attestations import AttestationVerdict

__all__ = [
    "INDEX_NAME",
    "PICKLE_SUFFIXES",
    "SignedModel",
    "VerifiedBundle",
    "VerifiedModel",
    "bind_single_file",
    "check_digests",
    "check_file_set",
    "check_remote_code",
    "open_model_path",
    "precheck_file",
    "read_bundle",
    "read_verified_index",
    "remote_code_references",
    "verify_bundle_signature",
    "verify_files",
    "verify_model",
    "verify_signatures",
]


@dataclass(frozen=True, slots=True)
class VerifiedModel:
    """The result of a successful `verify_model`.

    Attributes:
        root_digest: The model root digest (hex SHA-256 OMS subject digest).
        files: Number of signed files checked.
        tensors: Number of tensors in the verified safetensors files (all their bytes are verified).
        tensor_digests: Number of tensors whose per-tensor digests were also checked individually.
        bytes_hashed: Bytes read and hashed.
        bundles: The verified bundles.
        skipped: Bundles found by default name but not checked (no configured key of their algorithm).
        manifest: The verified manifest of the first bundle.
        attestations: The attestation verdict (evidence selected, bundles ignored and why) when the policy
            requires attestations; None otherwise.
        whole_model: Every signed file was checked (the directory, or an OMS single-file model). False when
            only some signed files were (a shard path, `files`): then the others, and hence the root digest,
            were not checked against the files; the signature over the root digest was.
        warnings: Failures of matching policies in `mode: warn` (`modelsec.verifier.admission`): reported,
            not fatal.
    """

    root_digest: str
    files: int
    tensors: int
    tensor_digests: int
    bytes_hashed: int
    bundles: tuple[VerifiedBundle, ...]
    skipped: tuple[Path, ...]
    manifest: Manifest
    attestations: AttestationVerdict | None = None
    whole_model: bool = True
    warnings: tuple[str, ...] = ()

    @property
    def algorithms(self) -> tuple[SignatureAlgorithm, ...]:
        """The algorithms that produced valid signatures."""
        return tuple(dict.fromkeys(b.algorithm for b in self.bundles))


def verify_model(
    model_path: str | os.PathLike[str],
    policy: Policy | PolicySet | ModelAdmission,
    *,
    bundles: Sequence[Path] | None = None,
    files: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
    expected_digests: Collection[str] | None = None,
    ignore_paths: Sequence[str] = (),
    dir_fd: int | None = None,
    prehashed: Mapping[str, PrehashedFile] | None = None,
) -> VerifiedModel:
    """Verify every file of a model directory (or one file of it) against its signed bundles.

    Re-hashes each file listed in the signed manifests and checks the DSSE signatures against the keys in
    `policy`. Files not listed are rejected; listed files that are missing are rejected. Predicates other
    than the weights manifest are not interpreted here (watermark and robustness attestations are checked
    by the joint verifier). See the module docstring for the order of checks.

    Args:
        model_path: The model directory, or one regular file inside it (then only that file is hashed and it
            must be listed in the manifest; pickle formats are refused before anything else). A Hugging
            Face hub cache snapshot (`models--org--name/snapshots/<rev>/`) or one of its blob links is
            accepted; its links are followed only into that cache entry's `blobs/`.
        policy: Trusted keys, required algorithms, remote-code rule and limits; a `PolicySet`, matched as
            `file://<real path>` of the directory (or file) that was opened; or the admission of every
            policy matching the model (`modelsec.verifier.admission.admit_model`), which must have matched
            the real path that was opened: its `policy` verifies the bytes, each other one its own
            signatures and attestations over the same root digest.
        files: Verify only these signed files of the directory (e.g. the shards a node holds).
        bundles: Bundle paths; default: `model.sig`, `model.p384.sig`, `model.sm2.sig` in the model
            directory (a default bundle of an algorithm no policy key has is skipped and reported; an
            explicit one must verify).
        progress: Byte-count callback for a progress bar.
        expected_digests: Model root digests this model may have (`sha256:<hex>` or hex, e.g. from
            `modelsec.verifier.pinning.digest_pins_from_env`); None pins nothing. Checked right after the
            signatures, before any model file is opened.
        ignore_paths: Relative paths the operator ignores on top of the signed lists (OMS semantics, like
            `model_signing verify --ignore-paths`); a signed file is verified all the same.
        dir_fd: A descriptor of the directory holding `model_path` (as the `*at` system calls take it):
            `model_path.name` is looked up in it without following a link, and `model_path` otherwise only
            names the model in messages. A server passes the descriptor it resolved beneath its read root,
            so no later rename of the path can change what is verified. Not closed here.
        prehashed: Only for a caller that wrote the model's files itself into a directory no other party
            can write, hashing each one's bytes as it wrote them (`modelsec.distribution.push_pull`'s
            pull, so that a download is not read twice): signed name -> `PrehashedFile`. A listed file is not
            read again when those digests cover every digest compared (file algorithms, tensor algorithm,
            the policy's limits) and its identity (device, inode, size, mtime, ctime) is unchanged since
            its last write; a changed identity is refused. Every check of steps 1-5 runs as without it,
            on those digests and headers; a file not listed, or not covered, is hashed here. The caller
            vouches that the bytes it hashed are the bytes it wrote, in a file nobody else could write.

    The model directory is opened once; its default bundles, the walk and every file read go through that
    descriptor, so the directory whose bundles verified is the one walked and the one hashed, even if its
    path is renamed or exchanged meanwhile. The policy is chosen from that descriptor too
    (`modelsec.verifier.admission.admit_opened`). Explicit `bundles` paths are read by path.

    A bundle whose one resource is `.` signs a single-file model (OMS): `model_path` must then be that
    file, and its digest is compared with the resource whatever the file is called.

    Returns:
        The verified model: root digest, counts, bundles.

    Raises:
        SignatureError: No bundle, a bundle no trusted key verifies, or a required algorithm did not sign.
        MalformedArtifactError: A bundle, statement, manifest or safetensors header is malformed.
        FileSetMismatchError: Files were added, removed or renamed.
        DigestMismatchError: A file or tensor differs from the manifest, the signed root digest is not one
            of `expected_digests`, or a `prehashed` file's identity changed since it was written.
        PolicyViolationError: Symlinks, special files, pickle formats, or remote code (by default); no
            policy of a `PolicySet` matches.
        ModelMovedError: The path named another directory than the one opened, or than the one the
            admission was matched for (it was renamed or exchanged meanwhile).
        PolicyError: `expected_digests` is empty or malformed.

    Example:
        >>> policy = Policy.from_key_files([Path("trust/ci.pub.pem")])  # doctest: +SKIP
        >>> verify_model(Path("model"), policy).root_digest  # doctest: +SKIP
    """
    model_path = Path(model_path)
    root_fd, single, model_dir = open_model_path(model_path, dir_fd)
    try:
        # The policy is chosen from what was opened, and every later read goes through `root_fd`.
        admission = admit_opened(model_path, root_fd, single, policy)
        if single is not None:
            precheck_file(model_dir / single, admission.policy, root_fd=root_fd)
        return _verify_open_model(
            root_fd,
            model_dir,
            single,
            admission,
            bundles=bundles,
            files=files,
            progress=progress,
            expected_digests=expected_digests,
            ignore_paths=ignore_paths,
            prehashed=prehashed,
        )
    finally:
        os.close(root_fd)


def _verify_open_model(
    root_fd: int,
    model_dir: Path,
    single: str | None,
    admission: ModelAdmission,
    *,
    bundles: Sequence[Path] | None,
    files: Sequence[str] | None,
    progress: ProgressCallback | None,
    expected_digests: Collection[str] | None,
    ignore_paths: Sequence[str],
    prehashed: Mapping[str, PrehashedFile] | None = None,
) -> VerifiedModel:
    model_path = model_dir / single if single is not None else model_dir
    policy = admission.policy
    signed = verify_signatures(
        model_dir,
        admission,
        bundles=bundles,
        expected_digests=expected_digests,
        ignore_paths=ignore_paths,
        root_fd=root_fd,
    )
    whole = single is None
    if signed.manifest.single_file:
        if single is None:
            raise MalformedArtifactError(
                f"{model_path}: the bundle signs a single file (resource '.'), not a directory; verify "
                "that file's path"
            )
        signed, whole = bind_single_file(signed, single), True
    if files is not None:
        if single is not None:
            raise MalformedArtifactError(f"{model_path}: give either a shard path or `files`, not both")
        if policy.refuse_pickle:
            refuse_pickle(files, str(model_dir))
        single_names: Sequence[str] | None = list(files)
    else:
        single_names = [single] if single is not None else None
    names = check_file_set(signed, policy, only=single_names, root_fd=root_fd)
    whole = whole and files is None
    computed, checked = verify_files(
        signed,
        names,
        policy,
        tensor_hash=signed.tensor_hash,
        whole_model=whole,
        progress=progress,
        root_fd=root_fd,
        prehashed=prehashed,
    )
    return VerifiedModel(
        root_digest=signed.root_digest,
        files=len(names),
        tensors=sum(len(d.header.tensors) for d in computed.values() if d.header is not None),
        tensor_digests=checked,
        bytes_hashed=sum(d.size for d in computed.values()),
        bundles=signed.bundles,
        skipped=signed.skipped,
        manifest=signed.manifest,
        attestations=signed.attestations,
        whole_model=whole,
        warnings=signed.warnings,
    )


def open_model_path(model_path: Path, dir_fd: int | None = None) -> tuple[int, str | None, Path]:
    """Open a model directory once: (its descriptor, the single file's name or None, the directory's path).

    A path to a file opens the directory holding it (the file is checked to be a regular file or a hub
    snapshot's blob link, and opened again beneath the descriptor whenever it is read). The final component
    is never followed when it is a link (but for a hub snapshot's blob link); the caller closes the
    descriptor and chooses the policy from it (`admit_opened`).

    Args:
        model_path: A model directory, or one file of it.
        dir_fd: A descriptor of the directory holding `model_path`, to look its name up in (`verify_model`).

    Raises:
        MalformedArtifactError: Missing, or neither a directory nor a regular file.
        PolicyViolationError: A symlink.
    """
    if dir_fd is not None:
        return _open_model_at(model_path, dir_fd)
    try:
        st = os.lstat(model_path)
    except OSError as e:
        raise MalformedArtifactError(f"{model_path}: cannot read: {e.strerror}") from e
    if stat.S_ISLNK(st.st_mode):
        if not _is_hub_blob_link(model_path):
            raise PolicyViolationError(f"{model_path}: is a symlink; refused")
        st = os.stat(model_path)  # a regular blob of this cache entry: checked without following links
    if stat.S_ISDIR(st.st_mode):
        return open_model_root(model_path), None, model_path
    if not stat.S_ISREG(st.st_mode):
        raise MalformedArtifactError(f"{model_path}: neither a model directory nor a regular file")
    root_fd = open_model_root(model_path.parent)
    try:
        os.close(open_beneath(root_fd, model_path.name, what=str(model_path.parent)))
    except BaseException:
        os.close(root_fd)
        raise
    return root_fd, model_path.name, model_path.parent


def _open_model_at(model_path: Path, dir_fd: int) -> tuple[int, str | None, Path]:
    name = model_path.name
    if not name:
        raise MalformedArtifactError(f"{model_path}: no file or directory name to look up")
    try:
        root_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            raise MalformedArtifactError(f"{model_path}: cannot read: {e.strerror}") from e
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise MalformedArtifactError(f"{model_path}: neither a model directory nor a regular file") from e
        # A regular file (or a hub snapshot's blob link, else refused) of the directory `dir_fd`.
        os.close(open_beneath(dir_fd, name, what=str(model_path.parent)))
        return os.dup(dir_fd), name, model_path.parent
    return root_fd, None, model_path


def _is_hub_blob_link(path: Path) -> bool:
    """Whether `path` is a hub cache snapshot's link to a regular blob of its own cache entry."""
    try:
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.close(open_beneath(parent_fd, path.name, what=str(path.parent)))
    except (PolicyViolationError, MalformedArtifactError):
        return False
    finally:
        os.close(parent_fd)
    return True
