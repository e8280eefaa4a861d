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
4. Every file is hashed once (all needed digests in one pass, safetensors headers parsed strictly) and
   compared in constant time; per-tensor digests are compared when the manifest carries them.
5. Side files are interpreted only after their bytes matched: every `*.json` file at any depth is read
   again (bounded by `Limits.max_json_side_file_bytes`; a larger one is refused, never skipped), re-hashed
   and searched for code references (`auto_map` at any nesting depth, `custom_pipelines`): refused unless
   the policy allows remote code, and even then only local references to signed modules pass; then
   `model.safetensors.index.json` (targets must be signed shards that hold the named tensors).

Metadata inside safetensors headers never influences any decision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import posixpath
import re
import stat
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from modelsec._strict_json import strict_loads
from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.oms_predicate import (
    OMS_PREDICATE_TYPE,
    Manifest,
    Resource,
    TensorEntry,
    parse_manifest,
    root_digest,
)
from modelsec.attestations.statement import parse_statement
from modelsec.errors import (
    DigestMismatchError,
    Error,
    FileSetMismatchError,
    MalformedArtifactError,
    PolicyViolationError,
    SignatureError,
)
from modelsec.limits import Limits
from modelsec.modelformat.hashing import (
    FileDigests,
    ProgressCallback,
    hash_files,
    is_safetensors_name,
    new_hasher,
)
from modelsec.modelformat.model_files import PICKLE_SUFFIXES, open_beneath, open_model_root, walk_model
from modelsec.modelformat.safetensors_header import read_header
from modelsec.policy import Policy
from modelsec.signer.keys import TrustedKey
from modelsec.signer.schemes import scheme_for
from modelsec.signer.signing import ATTESTATION_FILE_NAMES, SIGNATURE_FILE_NAMES
from modelsec.verifier.attestations import AttestationVerdict, find_attestation_bundles, verify_attestations
from modelsec.verifier.bundles import (
    family_has_key,
    find_default_bundles,
    read_bundle,
    verify_bundle_signature,
)
from modelsec.verifier.pinning import expected_digest_set
from modelsec.verifier.stores import StoredBundle

__all__ = [
    "PICKLE_SUFFIXES",
    "SignedModel",
    "VerifiedBundle",
    "VerifiedModel",
    "check_digests",
    "check_file_set",
    "check_remote_code",
    "find_default_bundles",
    "precheck_file",
    "read_bundle",
    "remote_code_references",
    "verify_bundle_signature",
    "verify_model",
    "verify_signatures",
]

INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class VerifiedBundle:
    """A bundle whose signature verified: where it is, which trusted key signed, and its manifest."""

    path: Path
    key: TrustedKey
    manifest: Manifest

    @property
    def algorithm(self) -> SignatureAlgorithm:
        """The signature scheme of the key that verified."""
        return self.key.algorithm


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

    @property
    def algorithms(self) -> tuple[SignatureAlgorithm, ...]:
        """The algorithms that produced valid signatures."""
        return tuple(dict.fromkeys(b.algorithm for b in self.bundles))


def _read_verified_side_file(
    root_fd: int, name: str, expected: FileDigests, limits: Limits, model: str
) -> bytes:
    """Read a small side file again and make sure it is byte-identical to what was hashed."""
    if expected.size > limits.max_json_side_file_bytes:
        raise MalformedArtifactError(
            f"{model}/{name}: {expected.size} bytes, larger than the JSON side-file limit of "
            f"{limits.max_json_side_file_bytes} bytes (Limits.max_json_side_file_bytes); refused unread"
        )
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


def verify_model(
    model_path: Path,
    policy: Policy,
    *,
    bundles: Sequence[Path] | None = None,
    files: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
    expected_digests: Collection[str] | None = None,
    ignore_paths: Sequence[str] = (),
    dir_fd: int | None = None,
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
        policy: Trusted keys, required algorithms, remote-code rule and limits.
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

    The model directory is opened once; its default bundles, the walk and every file read go through that
    descriptor, so the directory whose bundles verified is the one walked and the one hashed, even if its
    path is renamed or exchanged meanwhile. Explicit `bundles` paths are read by path.

    A bundle whose one resource is `.` signs a single-file model (OMS): `model_path` must then be that
    file, and its digest is compared with the resource whatever the file is called.

    Returns:
        The verified model: root digest, counts, bundles.

    Raises:
        SignatureError: No bundle, a bundle no trusted key verifies, or a required algorithm did not sign.
        MalformedArtifactError: A bundle, statement, manifest or safetensors header is malformed.
        FileSetMismatchError: Files were added, removed or renamed.
        DigestMismatchError: A file or tensor differs from the manifest, or the signed root digest is not one
            of `expected_digests`.
        PolicyViolationError: Symlinks, special files, pickle formats, or remote code (by default).
        PolicyError: `expected_digests` is empty or malformed.

    Example:
        >>> policy = Policy.from_key_files([Path("trust/ci.pub.pem")])  # doctest: +SKIP
        >>> verify_model(Path("model"), policy).root_digest  # doctest: +SKIP
    """
    root_fd, single, model_dir = _open_model(model_path, policy, dir_fd)
    try:
        return _verify_open_model(
            root_fd,
            model_dir,
            single,
            policy,
            bundles=bundles,
            files=files,
            progress=progress,
            expected_digests=expected_digests,
            ignore_paths=ignore_paths,
        )
    finally:
        os.close(root_fd)


def _verify_open_model(
    root_fd: int,
    model_dir: Path,
    single: str | None,
    policy: Policy,
    *,
    bundles: Sequence[Path] | None,
    files: Sequence[str] | None,
    progress: ProgressCallback | None,
    expected_digests: Collection[str] | None,
    ignore_paths: Sequence[str],
) -> VerifiedModel:
    model_path = model_dir / single if single is not None else model_dir
    signed = verify_signatures(
        model_dir,
        policy,
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
            _refuse_pickle(files, str(model_dir))
        single_names: Sequence[str] | None = list(files)
    else:
        single_names = [single] if single is not None else None
    names = check_file_set(signed, policy, only=single_names, root_fd=root_fd)
    computed, checked = verify_files(
        signed,
        names,
        policy,
        tensor_hash=signed.tensor_hash,
        whole_model=whole and files is None,
        progress=progress,
        root_fd=root_fd,
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
    )


def _open_model(model_path: Path, policy: Policy, dir_fd: int | None) -> tuple[int, str | None, Path]:
    """Open the model directory once: (its descriptor, the single file's name or None, its path)."""
    if dir_fd is not None:
        return _open_model_at(model_path, policy, dir_fd)
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
        precheck_file(model_path, policy, root_fd=root_fd)
    except BaseException:
        os.close(root_fd)
        raise
    return root_fd, model_path.name, model_path.parent


def _open_model_at(model_path: Path, policy: Policy, dir_fd: int) -> tuple[int, str | None, Path]:
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
        root_fd = os.dup(dir_fd)
        try:
            precheck_file(model_path, policy, root_fd=root_fd)
        except BaseException:
            os.close(root_fd)
            raise
        return root_fd, name, model_path.parent
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


def verify_files(
    signed: SignedModel,
    names: Sequence[str],
    policy: Policy,
    *,
    tensor_hash: HashAlgorithm | None,
    whole_model: bool,
    progress: ProgressCallback | None = None,
    root_fd: int | None = None,
) -> tuple[Mapping[str, FileDigests], int]:
    """Hash the files `names` of a signed model once and compare every digest with its manifests.

    Args:
        signed: From `verify_signatures`; `names` from `check_file_set`.
        names: The files to hash.
        policy: Hash algorithms to recompute, limits, refusals.
        tensor_hash: Per-tensor digest algorithm to compute as well (None: file digests only).
        whole_model: The whole directory is being verified (index and remote-code checks apply).
        progress: Byte-count callback.
        root_fd: The model directory's descriptor that the walk used (not closed here); default: the
            directory is opened by its path.

    Returns:
        The computed digests by file, and how many per-tensor digests were checked.

    Raises:
        DigestMismatchError, MalformedArtifactError, PolicyViolationError: As `check_digests`.
    """
    if root_fd is None:
        fd = open_model_root(signed.model_dir)
        try:
            return verify_files(
                signed,
                names,
                policy,
                tensor_hash=tensor_hash,
                whole_model=whole_model,
                progress=progress,
                root_fd=fd,
            )
        finally:
            os.close(fd)
    computed = hash_files(
        root_fd,
        names,
        algorithms=signed.file_hashes,
        tensor_hash=tensor_hash,
        limits=policy.limits,
        progress=progress,
        model=str(signed.model_dir),
    )
    return computed, check_digests(signed, computed, policy, root_fd, whole_model=whole_model)


@dataclass(frozen=True, slots=True)
class SignedModel:
    """A model directory whose bundles verified (step 2): what its files must hash to.

    Attributes:
        model_dir: The model directory.
        bundles: The verified bundles (at least one; every required algorithm present).
        skipped: Default bundles not checked (no configured key of their algorithm).
        manifest: The first bundle's manifest (all bundles describe the same files).
        file_hashes: File digest algorithms to compute: SHA-256 plus each manifest's hash type.
        tensor_hash: The per-tensor digest algorithm of the extension, or None.
        excluded: Relative paths never part of the file set: every bundle file in the directory (those
            read, and modelsec's reserved signature and attestation names) and the operator's ignore paths.
        attestations: The attestation verdict when the policy requires attestations, else None.
    """

    model_dir: Path
    bundles: tuple[VerifiedBundle, ...]
    skipped: tuple[Path, ...]
    manifest: Manifest
    file_hashes: tuple[HashAlgorithm, ...]
    tensor_hash: HashAlgorithm | None
    excluded: tuple[str, ...] = ()
    attestations: AttestationVerdict | None = None

    @property
    def root_digest(self) -> str:
        """The model root digest (hex)."""
        return self.manifest.subject_digest["sha256"]

    def tensor_entries(self) -> dict[str, tuple[str, TensorEntry]]:
        """Signed tensor name -> (file, entry) from the extension (empty for plain OMS manifests)."""
        result: dict[str, tuple[str, TensorEntry]] = {}
        for b in self.bundles:
            if b.manifest.tensor_hash is not self.tensor_hash:
                continue
            for file, entries in b.manifest.tensors.items():
                for name, entry in entries.items():
                    result.setdefault(name, (file, entry))
        return result


def verify_signatures(
    model_dir: Path,
    policy: Policy,
    *,
    bundles: Sequence[Path] | None = None,
    expected_digests: Collection[str] | None = None,
    ignore_paths: Sequence[str] = (),
    root_fd: int | None = None,
) -> SignedModel:
    """Steps 1-2: read, parse and verify the bundles of `model_dir`; no model file is opened.

    Several bundles must sign the same set of files (and the same model root digest); their ignore lists
    may differ (model_signing records its own list, in set order): each is applied when the directory is
    walked (`check_file_set`).

    Args:
        model_dir: The model directory.
        policy: Trusted keys, required algorithms, limits.
        bundles: Explicit bundle paths (each must verify), or None for the default names.
        expected_digests: Model root digests the signed model may have (`sha256:<hex>` or hex; e.g. the
            pins of `MODELSEC_MODEL_DIGEST`), checked as soon as the signatures verified; None: no pin.
        ignore_paths: Relative paths the operator ignores as well (`SignedModel.excluded`).
        root_fd: A descriptor of `model_dir` (not closed here): the default bundles and the attestations
            inside the directory are read through it; default: by path.

    Returns:
        The verified bundles and what the files must hash to.

    Raises:
        SignatureError: No bundle, no trusted key verifies one, or a required algorithm is missing.
        MalformedArtifactError: A bundle, statement or manifest is malformed, or bundles disagree.
        PolicyViolationError: A bundle path is a symlink.
        DigestMismatchError: The signed model root digest is not one of `expected_digests`.
        PolicyError: `expected_digests` is empty or malformed.
    """
    limits = policy.limits
    pins = None if expected_digests is None else expected_digest_set(expected_digests)
    model = str(model_dir)
    explicit = bundles is not None
    if bundles is not None:
        bundle_paths = list(bundles)
    elif root_fd is not None:
        bundle_paths = [model_dir / n for n in SIGNATURE_FILE_NAMES if _present(root_fd, n)]
    else:
        bundle_paths = find_default_bundles(model_dir)
    if not bundle_paths:
        looked_for = ", ".join(SIGNATURE_FILE_NAMES)
        raise SignatureError(f"{model}: no signature bundle found (looked for {looked_for})")
    verified: list[VerifiedBundle] = []
    skipped: list[Path] = []
    for path in bundle_paths:
        bundle = (
            read_bundle(path, limits)
            if explicit or root_fd is None
            else _read_bundle_at(root_fd, path, limits)
        )
        try:
            key = verify_bundle_signature(bundle, policy.keys)
        except SignatureError:
            if not explicit and not family_has_key(path, policy.keys):
                skipped.append(path)
                continue
            raise
        statement = parse_statement(bundle.envelope.payload, what=str(path))
        if statement.predicate_type != OMS_PREDICATE_TYPE:
            raise MalformedArtifactError(
                f"{path}: predicateType must be {OMS_PREDICATE_TYPE!r} for a weights signature, "
                f"got {statement.predicate_type!r}"
            )
        manifest = parse_manifest(statement, what=str(path), limits=limits)
        if manifest.hash_type not in scheme_for(key.algorithm).signable_hashes:
            raise MalformedArtifactError(
                f"{path}: a {key.algorithm} signature over a {manifest.hash_type} manifest is not accepted"
            )
        verified.append(VerifiedBundle(path, key, manifest))
    if not verified:
        raise SignatureError(f"{model}: no bundle was signed by a configured key")
    missing_algs = policy.require_algorithms - {b.algorithm for b in verified}
    if missing_algs:
        missing = ", ".join(sorted(a.value for a in missing_algs))
        raise SignatureError(f"{model}: required signature(s) missing: {missing}")
    first = verified[0].manifest
    for b in verified[1:]:
        if set(b.manifest.names) != set(first.names):
            raise MalformedArtifactError(f"{b.path}: describes other files than {verified[0].path}")
        if b.manifest.subject_digest.get("sha256") != first.subject_digest.get("sha256"):
            raise MalformedArtifactError(f"{b.path}: model root digest differs from {verified[0].path}")
    if pins is not None and first.subject_digest["sha256"] not in pins:
        raise DigestMismatchError(
            f"{model} (model root digest, pinned)",
            " or ".join(f"sha256:{p}" for p in sorted(pins)),
            f"sha256:{first.subject_digest['sha256']}",
        )
    verdict = None
    if policy.requires_attestations:
        # Evidence about the weights is checked before any weight byte is read (no hashing wasted on a model
        # the policy refuses anyway); it is bound to the root digest the verified bundles sign.
        root = first.subject_digest["sha256"]
        found = find_attestation_bundles(model_dir if root_fd is None else None, root, policy)
        if root_fd is not None:
            found = [*_attestations_at(root_fd, model_dir, root, limits), *found]
        verdict = verify_attestations(root, found, policy, require_signatures=False)
        verdict.raise_for_policy()
    checked = [b for b in verified if not policy.check_hashes or b.manifest.hash_type in policy.check_hashes]
    if not checked:
        wanted = ", ".join(sorted(h.value for h in policy.check_hashes))
        raise SignatureError(f"{model}: no verified bundle has a manifest of the policy's hashes ({wanted})")
    return SignedModel(
        model_dir=model_dir,
        bundles=tuple(verified),
        skipped=tuple(skipped),
        manifest=first,
        file_hashes=_file_hashes(checked, policy),
        tensor_hash=next((b.manifest.tensor_hash for b in verified if b.manifest.tensor_hash), None),
        excluded=_excluded_paths(model_dir, bundle_paths, ignore_paths),
        attestations=verdict,
    )


def _present(root_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=root_fd)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # present but unreadable: reading it reports why
    return True


def _read_at(root_fd: int, name: str, path: Path, max_bytes: int) -> bytes:
    """At most `max_bytes + 1` bytes of the file `name` of the directory `root_fd` (no link followed)."""
    fd = open_beneath(root_fd, name, what=str(path.parent))
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes + 1)


def _read_bundle_at(root_fd: int, path: Path, limits: Limits) -> Bundle:
    """`read_bundle` for a default bundle, read through the model directory's descriptor."""
    try:
        data = _read_at(root_fd, path.name, path, limits.max_bundle_bytes)
    except PolicyViolationError:
        raise PolicyViolationError(f"{path}: signature bundle is a symlink; refused") from None
    if len(data) > limits.max_bundle_bytes:
        raise MalformedArtifactError(f"{path}: signature bundle exceeds {limits.max_bundle_bytes} bytes")
    return parse_bundle(data, source=str(path))


def _attestations_at(root_fd: int, model_dir: Path, root: str, limits: Limits) -> list[Path | StoredBundle]:
    """The attestation bundles under their reserved names in the model directory, read through `root_fd`.

    One that cannot be read (a link, a special file) is passed on by path: reading it there fails the same
    way, and `verify_attestations` lists the reason among the ignored bundles.
    """
    found: list[Path | StoredBundle] = []
    for name in ATTESTATION_FILE_NAMES:
        if _present(root_fd, name):
            path = model_dir / name
            try:
                data = _read_at(root_fd, name, path, limits.max_bundle_bytes)
            except Error:
                found.append(path)
                continue
            found.append(StoredBundle(hashlib.sha256(data).hexdigest(), root, data, str(path)))
    return found


def _excluded_paths(
    model_dir: Path, bundle_paths: Sequence[Path], ignore_paths: Sequence[str]
) -> tuple[str, ...]:
    """Every bundle file inside `model_dir` (read or reserved by name) plus the operator's ignore paths.

    Bundles are never model files: a bundle written inside the directory under any name (model_signing's
    Python API records no ignore path for it) and modelsec's reserved names are left out of every walk,
    whichever bundle's ignore list names them.
    """
    excluded = dict.fromkeys((*SIGNATURE_FILE_NAMES, *ATTESTATION_FILE_NAMES, *ignore_paths))
    root = os.path.abspath(model_dir)
    for p in bundle_paths:
        rel = os.path.relpath(os.path.abspath(p), root)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            excluded[Path(rel).as_posix()] = None
    return tuple(excluded)


def bind_single_file(signed: SignedModel, name: str) -> SignedModel:
    """Bind the single-file manifests of `signed` (resource `.`) to the file `name` of its directory.

    OMS names the one resource of a single-file model `.`; the file's own name is informational, like the
    subject name. Every verified bundle must sign a single file.

    Raises:
        MalformedArtifactError: A bundle signs a directory while another signs a single file.
    """
    bound = []
    for b in signed.bundles:
        m = b.manifest
        if not m.single_file:
            raise MalformedArtifactError(
                f"{b.path}: signs a directory while another bundle signs a single file"
            )
        r = m.resources[0]
        tensors = dict.fromkeys([name], *m.tensors.values()) if m.tensors else {}
        bound.append(
            dataclasses.replace(
                b,
                manifest=dataclasses.replace(
                    m, resources=(Resource(name, r.algorithm, r.digest),), tensors=MappingProxyType(tensors)
                ),
            )
        )
    return dataclasses.replace(signed, bundles=tuple(bound), manifest=bound[0].manifest)


def _file_hashes(checked: Sequence[VerifiedBundle], policy: Policy) -> tuple[HashAlgorithm, ...]:
    """The file digests to compute: every checked manifest's hash type, plus SHA-256 for the model root.

    A policy restricted to SM3 (`checkHashes: [sm3]`, e.g. SM-only deployments) skips SHA-256: the SM3
    file digests bind the bytes, and the SHA-256 root in the SM2 statement is the trusted signer's claim
    (still the identity attestations are matched against).
    """
    hashes = [b.manifest.hash_type for b in checked]
    if not policy.check_hashes or HashAlgorithm.SHA256 in policy.check_hashes:
        hashes.insert(0, HashAlgorithm.SHA256)
    return tuple(dict.fromkeys(hashes))


def check_file_set(
    signed: SignedModel, policy: Policy, *, only: Sequence[str] | None = None, root_fd: int | None = None
) -> list[str]:
    """Step 3: the files to hash, after the file-set comparison and the refusals by name.

    Args:
        signed: The verified bundles.
        policy: Remote-code rule and limits.
        only: Check just these signed names (single-shard verification) instead of the whole directory.
        root_fd: The model directory's descriptor to walk (not closed here); default: opened by path.

    Returns:
        The names to hash, in manifest order.

    Raises:
        FileSetMismatchError: Extra or missing files (or a name in `only` that is not signed).
        PolicyViolationError: Pickle formats; `*.py` files unless remote code is allowed; symlinks.
    """
    model = str(signed.model_dir)
    signed_names = set(signed.manifest.names)
    if signed.manifest.single_file:
        raise MalformedArtifactError(
            f"{model}: the bundle signs a single file (resource '.'), not a directory; verify that "
            "file's path"
        )
    if only is not None:
        unsigned = [n for n in only if n not in signed_names]
        if unsigned:
            raise FileSetMismatchError(model, unsigned, [])
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
        _refuse_pickle(names, model)
    if not policy.allow_remote_code:
        code = [n for n in names if n.endswith(".py")]
        if code:
            raise PolicyViolationError(
                f"{model}: remote code is refused by policy: {', '.join(code)} (modelsec never imports it)"
            )
    return names


def check_digests(
    signed: SignedModel,
    computed: Mapping[str, FileDigests],
    policy: Policy,
    root_fd: int,
    *,
    whole_model: bool,
) -> int:
    """Steps 4-5: compare computed digests with every manifest, then interpret the side files.

    Args:
        signed: The verified bundles.
        computed: What the engine hashed (files or private buffers), by name.
        policy: Remote-code rule and limits.
        root_fd: Descriptor of the model root (side files are re-read and re-hashed).
        whole_model: Also check the model root digest (all files were hashed).

    Returns:
        The number of tensors whose per-tensor digests were compared.

    Raises:
        DigestMismatchError: A file, tensor or the root digest differs.
        MalformedArtifactError: Per-tensor digests missing, a bad index, or a JSON file that is not strict
            JSON or exceeds `Limits.max_json_side_file_bytes`.
        PolicyViolationError: Code references in a JSON file (`check_remote_code`).
    """
    model, limits = str(signed.model_dir), policy.limits
    checked = 0
    for b in signed.bundles:
        if b.manifest.hash_type in signed.file_hashes:
            checked = max(checked, _compare(b.manifest, computed, signed.tensor_hash, model))
    if whole_model and HashAlgorithm.SHA256 in signed.file_hashes:
        root = root_digest([computed[n].digests[HashAlgorithm.SHA256] for n in signed.manifest.names]).hex()
        for b in signed.bundles:
            expected = b.manifest.subject_digest["sha256"]
            if b.manifest.hash_type is not HashAlgorithm.BLAKE3 and not hmac.compare_digest(expected, root):
                raise DigestMismatchError(f"{model} (model root)", expected, root)
    _check_remote_code(root_fd, computed, set(signed.manifest.names), policy, model)
    if INDEX_NAME in computed:
        _check_index(root_fd, computed, set(signed.manifest.names), limits, model)
    return checked


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
        _refuse_pickle([path.name], str(path.parent))
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


def _refuse_pickle(names: Sequence[str], model: str) -> None:
    pickles = [n for n in names if n.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise PolicyViolationError(
            f"{model}: pickle format not allowed: {', '.join(pickles)} (unpickling runs code even when "
            "signed; convert the weights to safetensors)"
        )


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
                f"{model}/{name} (tensor names)", ",".join(sorted(signed)), ",".join(sorted(got.tensors))
            )
        for tname, entry in signed.items():
            t = got.tensors[tname]
            if (t.dtype, t.shape, t.begin, t.end) != (entry.dtype, entry.shape, entry.begin, entry.end):
                raise DigestMismatchError(
                    f"{model}/{name}:`{tname}` (dtype/shape/offsets)",
                    f"{entry.dtype}{list(entry.shape)}@{entry.begin}-{entry.end}",
                    f"{t.dtype}{list(t.shape)}@{t.begin}-{t.end}",
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


def _check_remote_code(
    root_fd: int,
    computed: Mapping[str, FileDigests],
    signed_names: Collection[str],
    policy: Policy,
    model: str,
) -> None:
    for name in computed:
        if not name.endswith(".json"):
            continue
        what = f"{model}/{name}"
        raw = _read_verified_side_file(root_fd, name, computed[name], policy.limits, model)
        # Every JSON file is parsed (no byte-level pre-filter): `"auto\\u005fmap"` is `auto_map` to a loader.
        references = remote_code_references(strict_loads(raw, what=what, bounded_ints=False), what=what)
        check_remote_code(
            name, references, signed_names, allow_remote_code=policy.allow_remote_code, model=model
        )


_CODE_KEYS = ("auto_map", "custom_pipelines")
_CLASS_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+\Z")


def remote_code_references(doc: object, *, what: str = "JSON document") -> list[str]:
    """Every code reference a Hugging Face loader could import from a JSON document, at any depth.

    A reference is a value under an `auto_map` object (`"AutoModel": "modeling_x.Model"`, or a tokenizer's
    `[slow, fast]` list whose entries may be null) or a `custom_pipelines.<task>.impl` value, wherever the
    key occurs in the document (e.g. `vision_config.auto_map`). The references are returned as written,
    not checked; see `check_remote_code`.

    Args:
        doc: A decoded JSON document (strict_loads output).
        what: Names the document in errors.

    Returns:
        The references, in document order (empty when the document names no code).

    Raises:
        MalformedArtifactError: An `auto_map` is not an object, or one of its values is not a string or a
            list of strings and nulls; a `custom_pipelines` entry's `impl` is not a string.
    """
    references: list[str] = []
    # Iterative, so a document nested as deeply as the JSON decoder allows cannot exhaust the stack here.
    stack: list[tuple[str, object]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
            continue
        if not isinstance(value, dict):
            continue
        for key, item in reversed(list(value.items())):
            where = f"{path}.{key}" if path else key
            if key == "auto_map":
                references.extend(_auto_map_targets(item, f"{what}: {where}"))
            elif key == "custom_pipelines" and isinstance(item, dict):
                for task, spec in item.items():
                    impl = spec.get("impl") if isinstance(spec, dict) else None
                    if impl is not None and not isinstance(impl, str):
                        raise MalformedArtifactError(f"{what}: {where}.{task}.impl must be a string")
                    if impl is not None:
                        references.append(impl)
            stack.append((where, item))
    return references


def _auto_map_targets(value: object, what: str) -> list[str]:
    if not isinstance(value, dict):
        raise MalformedArtifactError(f"{what} must be an object (auto class -> module.Class)")
    targets: list[str] = []
    for auto_class, target in value.items():
        entries = target if isinstance(target, list) else [target]
        for entry in entries:
            if isinstance(entry, str):
                targets.append(entry)
            elif entry is not None or not isinstance(target, list):
                raise MalformedArtifactError(
                    f"{what}.{auto_class} must be a module.Class string or a list of them (or nulls)"
                )
    return targets


def check_remote_code(
    json_name: str,
    references: Sequence[str],
    signed_names: Collection[str],
    *,
    allow_remote_code: bool,
    model: str,
) -> None:
    """Refuse the code references of one JSON file unless policy allows them and the code is signed.

    Without `allow_remote_code` any reference is refused. With it, each reference must be local: a dotted
    `module.Class` (or `package.module.Class`) whose module file (`module.py`, `package/module.py`),
    relative to the directory holding `json_name`, is one of `signed_names`. A cross-repository reference
    (`org/repo--module.Class`: anything with `--` or `/`) would make a loader fetch code from the Hub and
    is always refused. Whether the signed module is safe to run is not judged here.

    Args:
        json_name: The JSON file's relative name in the model (e.g. `text_encoder/config.json`).
        references: From `remote_code_references`.
        signed_names: The signed resource names of the model.
        allow_remote_code: The policy's remote-code rule.
        model: Names the model in errors.

    Raises:
        PolicyViolationError: Remote code is not allowed, a reference is cross-repository, or its module is
            not a signed file.
        MalformedArtifactError: A reference is not a dotted Python name.
    """
    if not references:
        return
    what = f"{model}/{json_name}"
    if not allow_remote_code:
        raise PolicyViolationError(
            f"{what}: auto_map requires remote code ({', '.join(references)}); refused by policy"
        )
    base = posixpath.dirname(json_name)
    for ref in references:
        if "--" in ref or "/" in ref:
            raise PolicyViolationError(
                f"{what}: auto_map reference {ref!r} names code in another repository; refused (only signed "
                "code of this model may run, and nothing is fetched)"
            )
        if not _CLASS_REFERENCE.match(ref):
            raise MalformedArtifactError(f"{what}: auto_map reference {ref!r} is not a module.Class name")
        module = posixpath.join(base, *ref.split(".")[:-1]) + ".py"
        if module not in signed_names:
            raise PolicyViolationError(
                f"{what}: auto_map reference {ref!r} needs {module!r}, which is not a signed file of the "
                "model"
            )


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
    root_fd = open_model_root(signed.model_dir)
    try:
        raw = _read_verified_side_file(root_fd, INDEX_NAME, computed, policy.limits, model)
    finally:
        os.close(root_fd)
    return _parse_index(raw, set(signed.manifest.names), f"{model}/{INDEX_NAME}")


def _parse_index(raw: bytes, signed: set[str], what: str) -> dict[str, str]:
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


def _check_index(
    root_fd: int, computed: Mapping[str, FileDigests], signed: set[str], limits: Limits, model: str
) -> None:
    what = f"{model}/{INDEX_NAME}"
    raw = _read_verified_side_file(root_fd, INDEX_NAME, computed[INDEX_NAME], limits, model)
    weight_map = _parse_index(raw, signed, what)
    held: dict[str, set[str]] = {}
    for tensor, target in weight_map.items():
        if target not in held and target in computed:
            header = computed[target].header
            held[target] = {t.name for t in header.tensors} if header is not None else set()
        if target in held and tensor not in held[target]:
            raise MalformedArtifactError(
                f"{what}: weight_map names `{tensor}`, which {target!r} does not hold"
            )
