"""Sign a model directory: walk, hash once, build the manifests, sign them as DSSE bundles, write them."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.attestations.bundle import add_timestamps, parse_bundle, sign_statement
from modelsec.attestations.predicates.oms import (
    SINGLE_FILE_NAME,
    Manifest,
    build_manifest,
    manifest_statement,
    parse_manifest,
)
from modelsec.attestations.statement import Statement, parse_statement
from modelsec.errors import (
    BundleExistsError,
    Error,
    KeyMaterialError,
    MalformedArtifactError,
    PolicyError,
    PolicyViolationError,
    UnsupportedAlgorithmError,
)
from modelsec.limits import Limits
from modelsec.modelformat.hashing import ProgressCallback, hash_files
from modelsec.modelformat.model_files import (
    CODE_SUFFIXES,
    PICKLE_SUFFIXES,
    ModelFile,
    open_model_root,
    validate_resource_name,
    walk_model,
)
from modelsec.modelformat.shard_index import check_index, is_index_name, shard_tensors_on_disk
from modelsec.modelformat.side_json import check_json_side_file, is_json_side_file, read_json_side_file
from modelsec.safe_io import read_regular_file
from modelsec.signer.keys import KeyBackend
from modelsec.signer.layout import (
    MODEL_IGNORE_PATHS,
    RESERVED_BUNDLE_NAMES,
    find_bundle_files,
    find_default_bundles,
    write_bundle_file,
)
from modelsec.signer.schemes import scheme_for

__all__ = [
    "BundleSigner",
    "SignedBundle",
    "SigningResult",
    "compute_manifests",
    "sign_model",
    "unverifiable_files",
]


@runtime_checkable
class BundleSigner(Protocol):
    """A signer that turns a whole statement into a bundle elsewhere (the gRPC `SigningService`).

    `sign_model` hashes locally and hands each manifest statement to `sign_bundle`; the implementation
    must check that the bundle it returns signs exactly that statement.
    """

    @property
    def algorithm(self) -> SignatureAlgorithm:
        """The signature scheme (decides the manifest hash type and the default bundle name)."""
        ...

    def public_key_pem(self) -> bytes:
        """The signing key's SubjectPublicKeyInfo PEM."""
        ...

    def sign_bundle(self, statement: Statement) -> bytes:
        """Sign `statement` and return the sigstore bundle JSON."""
        ...


@dataclass(frozen=True, slots=True)
class SignedBundle:
    """One bundle written by `sign_model`.

    Attributes:
        algorithm: The signature scheme.
        path: Where the bundle was written.
        keyid: The bundle's own `publicKey.hint` (hex(SHA-256(PEM)) for ECDSA and SM2, `ML_DSA_65:<hex>`
            for ML-DSA as model_signing writes it): what a verifier matches against its keys.
        timestamps: Number of RFC 3161 timestamps stored in the bundle.
    """

    algorithm: SignatureAlgorithm
    path: Path
    keyid: str
    timestamps: int = 0


@dataclass(frozen=True, slots=True)
class SigningResult:
    """What `sign_model` signed.

    Attributes:
        root_digest: The model root digest (hex SHA-256 over the SHA-256 resource digests).
        files: Number of signed files.
        tensors: Number of signed tensors (per-tensor digests).
        bundles: The bundles written.
        removed: Default-named bundles of the model directory that signed another model, deleted with
            `force` (see `sign_model`).
    """

    root_digest: str
    files: int
    tensors: int
    bundles: tuple[SignedBundle, ...]
    removed: tuple[Path, ...] = ()


def unverifiable_files(names: Sequence[str]) -> list[str]:
    """The files that `verify` refuses under the default policy, whatever signs them, each with the reason.

    Pickle formats (`model_files.PICKLE_SUFFIXES`: unpickling runs code) and Python modules
    (`model_files.CODE_SUFFIXES`: `*.py`, `*.pyc`, `*.pyo` in any case; remote code) are refused by name by
    the default policy, at any depth. The contents of JSON side files (`auto_map`, strict JSON) are checked
    by `refuse_unverifiable_json`, not here.

    Args:
        names: Relative POSIX paths of the files to sign.

    Returns:
        `"NAME (pickle format)"` / `"NAME (remote code)"` entries, in the order of `names`.
    """
    found = []
    for name in names:
        if name.lower().endswith(PICKLE_SUFFIXES):
            found.append(f"{name} (pickle format)")
        elif name.lower().endswith(CODE_SUFFIXES):
            found.append(f"{name} (remote code)")
    return found


def refuse_unverifiable_json(model_dir: Path, names: Sequence[str], limits: Limits) -> None:
    """Refuse the JSON side files that `verify` refuses under the default policy, with the verifier's reason.

    Each `*.json` file among `names` (at any depth) is read (bounded) and held to the verifier's own rules
    (`modelsec.modelformat.side_json.check_json_side_file` without remote code): at most
    `limits.max_json_side_file_bytes`, strict JSON (no duplicate keys, no NaN), and no code reference
    (`auto_map`, `custom_pipelines`). Every weight index (`*.index.json`, `*.index.<variant>.json`, any
    depth) is also held to the verifier's index rules (`modelsec.modelformat.shard_index.check_index`: a
    weight_map object whose every target is a safetensors file among `names` inside the index's folder
    that holds the tensor; a pickle target is refused as the default policy refuses it), reading each
    named shard's header.

    Args:
        model_dir: The model directory.
        names: Relative POSIX paths of the files to sign.
        limits: The limits verification applies.

    Raises:
        MalformedArtifactError: A JSON file is too large or not strict JSON, or a broken index (no
            weight_map object, a target outside the index's folder or that is not a shard of the model, a
            tensor its shard does not hold).
        PolicyViolationError: A JSON file names code, an index maps to a pickle shard, or a JSON file is
            a link or special file.
    """
    json_names = [n for n in names if is_json_side_file(n) or is_index_name(n)]
    if not json_names:
        return
    model = str(model_dir)
    root_fd = open_model_root(model_dir)
    try:
        for name in json_names:
            try:
                raw = read_json_side_file(root_fd, name, limits, model)
                check_json_side_file(name, raw, names, allow_remote_code=False, model=model)
                if is_index_name(name):
                    tensors_of = shard_tensors_on_disk(root_fd, limits, model)
                    check_index(raw, name, names, tensors_of, model=model)
            except (MalformedArtifactError, PolicyViolationError) as e:
                raise type(e)(
                    f"{e.diagnostics()} (verification under the default policy will always refuse this; fix "
                    "the file, or sign anyway with --allow-unverifiable)"
                ) from e
    finally:
        os.close(root_fd)


def compute_manifests(
    model_dir: Path,
    hash_types: Sequence[HashAlgorithm],
    *,
    ignore_paths: Sequence[str],
    tensor_hash: HashAlgorithm | None = HashAlgorithm.BLAKE3,
    limits: Limits | None = None,
    progress: ProgressCallback | None = None,
    refuse_unverifiable: bool = False,
) -> dict[HashAlgorithm, Manifest]:
    """Walk and hash `model_dir` once and build one manifest per requested file hash type.

    Every `*.safetensors` file is strictly parsed on the way; a malformed one stops signing. Sigstore
    bundles found in the directory (`find_bundle_files`) are left out and added to the recorded ignore
    list. A regular file instead of a directory is a single-file model: its one resource is named `.`, as
    OMS names it.

    Args:
        model_dir: The model directory, or a single model file.
        hash_types: Manifest hash types to build (`sha256`, `sm3`, `blake3`).
        ignore_paths: Exact relative paths left out (and recorded in the manifests).
        tensor_hash: Per-tensor digest algorithm, or None.
        limits: Limits; defaults to `Limits()`.
        progress: Byte-count callback for a progress bar.
        refuse_unverifiable: Refuse, before hashing, a directory holding files that `verify` refuses under
            the default policy (see `unverifiable_files` and `refuse_unverifiable_json`), and after hashing
            one whose bytes are or may hold pickles (`modelsec.modelformat.content`), whatever their names.

    Returns:
        Manifest by hash type.

    Raises:
        MalformedArtifactError: The directory is empty or not a directory, or a file is malformed.
        PolicyViolationError: A symlink or special file is present, or (with `refuse_unverifiable`) a
            pickle or `*.py` file, or a JSON file naming code.
        MalformedArtifactError: Also (with `refuse_unverifiable`): a JSON file too large or not strict JSON.
    """
    limits = limits or Limits()
    single = _single_file(model_dir)
    if single is not None:
        files = [single]
        root_dir = model_dir.parent
    else:
        root_dir = model_dir
        files = walk_model(model_dir, ignore_paths=ignore_paths, limits=limits)
        bundles = find_bundle_files(model_dir, [f.name for f in files], limits)
        if bundles:
            ignore_paths = [*ignore_paths, *(b for b in bundles if b not in ignore_paths)]
            files = [f for f in files if f.name not in bundles]
    if not files:
        raise MalformedArtifactError(f"{model_dir}: the model directory holds no files to sign")
    if refuse_unverifiable:
        refused = unverifiable_files([f.name for f in files])
        if refused:
            raise PolicyViolationError(
                f"{model_dir}: verification under the default policy will always refuse "
                f"{', '.join(refused)}; convert pickles to safetensors and remove code files, or sign "
                "anyway (--allow-unverifiable; a policy with refusePickle: false / allowRemoteCode: true "
                "accepts them)"
            )
        if single is None:
            refuse_unverifiable_json(model_dir, [f.name for f in files], limits)
    # SHA-256 is also the root of SM3 manifests (their subject carries the SHA-256 model root); a BLAKE3
    # manifest's root is SHA-256 over its BLAKE3 digests, so BLAKE3 alone reads no SHA-256 at all.
    roots = [HashAlgorithm.SHA256] if HashAlgorithm.SM3 in hash_types else []
    algorithms = list(dict.fromkeys([*roots, *hash_types]))
    root_fd = open_model_root(root_dir)
    try:
        digests = hash_files(
            root_fd,
            [f.name for f in files],
            algorithms=algorithms,
            tensor_hash=tensor_hash,
            limits=limits,
            progress=progress,
            model=str(root_dir),
        )
    finally:
        os.close(root_fd)
    if refuse_unverifiable:
        pickles = [f"{n} ({d.pickle})" for n, d in sorted(digests.items()) if d.pickle is not None]
        if pickles:
            raise PolicyViolationError(
                f"{root_dir}: verification under the default policy will always refuse pickle content, "
                f"whatever the file names: {', '.join(pickles)}; convert pickles to safetensors and sign "
                "unpacked files rather than archives, or sign anyway (--allow-unverifiable; a policy with "
                "refusePickle: false accepts them)"
            )
    if single is not None:
        digests = {SINGLE_FILE_NAME: dataclasses.replace(digests[single.name], name=SINGLE_FILE_NAME)}
    name = model_dir.resolve().name
    return {
        h: build_manifest(name, digests, hash_type=h, ignore_paths=ignore_paths, tensor_hash=tensor_hash)
        for h in dict.fromkeys(hash_types)
    }


def _single_file(path: Path) -> ModelFile | None:
    """The model file when `path` is a regular file (a single-file model), else None (a directory)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # walk_model reports it
    if stat.S_ISREG(st.st_mode):
        return ModelFile(path.name, st.st_size)
    return None


def sign_model(
    model_dir: str | os.PathLike[str],
    signers: Sequence[KeyBackend | BundleSigner],
    *,
    signature_paths: Mapping[int, Path] | None = None,
    tensor_hash: HashAlgorithm | None = HashAlgorithm.BLAKE3,
    limits: Limits | None = None,
    progress: ProgressCallback | None = None,
    refuse_unverifiable: bool = False,
    ignore_paths: Sequence[str] = (),
    timestamper: Callable[[bytes], Sequence[bytes]] | None = None,
    hash_type: HashAlgorithm = HashAlgorithm.SHA256,
    force: bool = False,
) -> SigningResult:
    """Sign a model directory with one or more keys, writing one sigstore bundle per key.

    ECDSA keys sign the SHA-256 (or, with `hash_type`, BLAKE3) manifest (OMS interop profile); SM2 keys sign
    the SM3 manifest. All files are hashed once, with every needed digest in the same pass. Bundles go to
    `model.sig` (P-256), `model.p384.sig` (P-384), `model.sm2.sig` (SM2) and `model.ml-dsa-{44,65,87}.sig`
    in the model directory unless `signature_paths` maps the signer's index to another path. All default
    signature names are recorded as ignored, so signing the same files again with another key (a
    co-signature) leaves earlier bundles valid; so are bundles found under other names (`find_bundle_files`).

    An existing bundle is never replaced silently (model_signing overwrites; ssh-keygen and cosign refuse,
    as this does): without `force`,

    * a bundle path that exists is refused before any file is hashed (`BundleExistsError`), and the write
      itself never replaces a file that appeared meanwhile (`write_bundle_file(replace=False)`);
    * when a bundle lands in the model directory, every other default-named bundle there must sign the
      files just hashed (the same model root digest and file names, read without verifying its signature):
      `verify` reads every default-named bundle and refuses bundles that disagree, or checks only those of
      its keys' algorithms, so a stale `model.sm2.sig` left beside a new `model.sig` is refused here.

    With `force`, the bundle paths are replaced and those stale default-named bundles are deleted
    (`SigningResult.removed`); co-signatures of the same files stay.

    A single file may be signed instead of a directory (OMS single-file model, resource `.`). It has no
    default bundle name: the default names in its folder are that folder's own signature, which `verify`
    of the folder reads, so every key needs a `signature_paths` entry (e.g. `FILE.sig`), and a reserved
    bundle name in the file's own folder is refused even with `force`. `verify FILE --signature PATH`
    verifies it.

    Args:
        model_dir: The model directory (safetensors shards, index, config, tokenizer files), or one file.
        signers: Key backends, or `BundleSigner`s that sign remotely (the private key stays on the signing
            server); at most one per algorithm unless explicit paths are given.
        signature_paths: Output path by index into `signers`.
        tensor_hash: Per-tensor digest algorithm recorded in the extension (None: plain OMS manifest).
        limits: Limits; defaults to `Limits()`.
        progress: Byte-count callback for a progress bar.
        refuse_unverifiable: Refuse, before hashing, files that `verify` refuses under the default policy
            (pickle formats, `*.py`, JSON side files that are not strict JSON or name code, a broken
            `model.safetensors.index.json`; see `unverifiable_files` and `refuse_unverifiable_json`). The
            `sign` command sets it by default.
        ignore_paths: More relative paths to leave out and record (OMS semantics: a directory with
            everything below it); see `relative_ignore_paths` for paths given on a command line.
        timestamper: Called with each bundle's signature bytes; returns the DER RFC 3161 `TimeStampResp`s
            stored in that bundle (`modelsec.verifier.trust.timestamps.request_timestamp`). Every bundle is
            signed and timestamped before the first is written: a failing TSA leaves no bundle behind.
        hash_type: File digest algorithm of the manifests ECDSA and ML-DSA keys sign: `sha256` (the OMS
            default) or `blake3` (OMS/model_signing `hashing_algorithm="blake3"`: resources with BLAKE3
            digests, subject digest SHA-256 over them; no SHA-256 pass over the files). SM2 keys always
            sign the SM3 manifest, whose subject carries the SHA-256 model root, so they refuse `blake3`.
        force: Replace existing bundle paths and delete stale default-named bundles (see above); the
            `sign --force` option.

    Returns:
        The model root digest, counts, the bundles written and the stale bundles removed.

    Raises:
        BundleExistsError: Without `force`: a bundle path exists, or a default-named bundle left in the
            model directory signs another model (or cannot be read as a weights signature); nothing is
            written.
        KeyMaterialError: No signer, or two signers would write the same bundle.
        UnsupportedAlgorithmError: `hash_type` is neither SHA-256 nor BLAKE3, or a signer's scheme cannot
            sign a `hash_type` manifest (SM2 with BLAKE3).
        MalformedArtifactError: The directory is empty, or a file is malformed, or a bundle would be larger
            than `limits.max_bundle_bytes` (what verifiers accept; nothing is written).
        PolicyError: A bundle path is a symlink or cannot be written; a single file is signed without a
            bundle path for every key, or onto a reserved bundle name of its own folder.
        PolicyViolationError: A symlink or special file is present, or (with `refuse_unverifiable`) a
            pickle or `*.py` file, or a JSON file naming code.
        MalformedArtifactError: Also (with `refuse_unverifiable`): a JSON file too large or not strict JSON.

    Example:
        >>> from modelsec.signer import load_private_key_file, sign_model
        >>> sign_model(Path("model"), [load_private_key_file(Path("ci.key.pem"))])  # doctest: +SKIP
    """
    model_dir = Path(model_dir)
    if not signers:
        raise KeyMaterialError("no signing key given")
    single = _single_file(model_dir) is not None
    paths = _bundle_paths(model_dir, signers, signature_paths or {}, single=single)
    if len({os.path.abspath(p) for p in paths}) != len(paths):
        raise KeyMaterialError("two keys would write the same bundle; map each key to its own signature path")
    if not force:
        for p in paths:
            if os.path.lexists(p):
                raise BundleExistsError(str(p), "a signature bundle exists already and would be replaced")
    ignore = list(MODEL_IGNORE_PATHS)
    for extra in ignore_paths:
        if validate_resource_name(extra, what=f"{model_dir}: ignore path") not in ignore:
            ignore.append(extra)
    root = os.path.abspath(model_dir)
    for p in paths:
        rel = os.path.relpath(os.path.abspath(p), root)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):  # `..weird.sig` is inside
            rel_posix = Path(rel).as_posix()
            if rel_posix not in ignore:
                ignore.append(rel_posix)
    signed_hashes = [_manifest_hash(s.algorithm, hash_type) for s in signers]
    hash_types = list(dict.fromkeys(signed_hashes))
    manifests = compute_manifests(
        model_dir,
        hash_types,
        ignore_paths=ignore,
        tensor_hash=tensor_hash,
        limits=limits,
        progress=progress,
        refuse_unverifiable=refuse_unverifiable,
    )
    signed = []
    max_bundle_bytes = (limits or Limits()).max_bundle_bytes
    for signer, path, h in zip(signers, paths, signed_hashes, strict=True):
        manifest = manifests[h]
        statement = manifest_statement(manifest)
        if isinstance(signer, BundleSigner):
            bundle = signer.sign_bundle(statement)
        else:
            bundle = sign_statement(statement, signer)
        parsed = parse_bundle(bundle, source=str(path))
        tokens = list(timestamper(parsed.signature.sig)) if timestamper is not None else []
        if tokens:
            bundle = add_timestamps(bundle, tokens, source=str(path))
        _check_bundle_size(bundle, path, manifest, max_bundle_bytes)
        hint = parsed.hint or parsed.signature.keyid
        signed.append((bundle, SignedBundle(signer.algorithm, path, hint, len(tokens))))
    lands_inside = not single and any(os.path.dirname(os.path.abspath(p)) == root for p in paths)
    stale = _stale_default_bundles(model_dir, paths, manifests.values(), limits) if lands_inside else []
    if stale and not force:
        path, why = stale[0]
        raise BundleExistsError(
            str(path),
            f"this default-named bundle {why}, and would be left beside the new one (verify reads every "
            "default-named bundle: it refuses the two together, or checks only the one of its key's "
            "algorithm); remove it, or sign the model it signs",
        )
    for bundle, result in signed:
        write_bundle_file(result.path, bundle, replace=force)
    for path, _ in stale:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise PolicyError(f"{path}: cannot remove the stale bundle: {e.strerror}") from e
    written = [result for _, result in signed]
    sha = manifests.get(HashAlgorithm.SHA256) or next(iter(manifests.values()))
    return SigningResult(
        root_digest=sha.subject_digest["sha256"],
        files=len(sha.resources),
        tensors=sum(len(t) for t in sha.tensors.values()),
        bundles=tuple(written),
        removed=tuple(p for p, _ in stale),
    )


def _bundle_paths(
    model_dir: Path,
    signers: Sequence[KeyBackend | BundleSigner],
    explicit: Mapping[int, Path],
    *,
    single: bool,
) -> list[Path]:
    """Each signer's bundle path: the explicit one, else its scheme's default name in the model directory.

    Raises:
        PolicyError: A single file is signed without an explicit path for a key, or onto a reserved bundle
            name (`RESERVED_BUNDLE_NAMES`) of its own folder.
    """
    if not single:
        return [
            explicit.get(i, model_dir / scheme_for(s.algorithm).default_bundle_name)
            for i, s in enumerate(signers)
        ]
    folder = os.path.realpath(model_dir.parent)
    if any(i not in explicit for i in range(len(signers))):
        raise PolicyError(
            f"{model_dir}: a single file has no default bundle name (the default names in its folder are the "
            f"folder's own signature, which `verify {model_dir.parent}` reads); give each key a bundle path "
            f"(sign --signature, e.g. {model_dir}.sig) and verify with the same --signature"
        )
    paths = [explicit[i] for i in range(len(signers))]
    signed_folder = find_default_bundles(model_dir.parent)
    for p in paths:
        parent = os.path.realpath(p.parent)
        if p.name in RESERVED_BUNDLE_NAMES and parent == folder:
            raise PolicyError(
                f"{p}: a single file's bundle may not take the reserved name {p.name!r} of its own folder "
                "(verify of the folder reads it as the folder's signature); give another --signature path"
            )
        if signed_folder and os.path.commonpath([parent, folder]) == folder:
            raise PolicyError(
                f"{p}: {model_dir.parent} is a signed model ({signed_folder[0].name}), and a new file in it "
                f"would be an unsigned extra file for `verify {model_dir.parent}`; write the single file's "
                "bundle outside that folder"
            )
    return paths


def _stale_default_bundles(
    model_dir: Path, paths: Sequence[Path], manifests: Iterable[Manifest], limits: Limits | None
) -> list[tuple[Path, str]]:
    """The default-named bundles of `model_dir` other than `paths` that sign none of `manifests`, with why.

    A bundle signs a manifest when its subject's SHA-256 model root and its file names are the manifest's,
    as `verify_signatures` requires of bundles read together. Its signature is not verified (nothing is
    trusted here: a bundle that only claims the same files stays, and `verify` checks it); one that cannot
    be read or parsed as a weights signature counts as stale, since `verify` would refuse it.
    """
    limits = limits or Limits()
    targets = {os.path.abspath(p) for p in paths}
    new = [(m.subject_digest.get("sha256"), set(m.names)) for m in manifests]
    stale: list[tuple[Path, str]] = []
    for path in find_default_bundles(model_dir):
        if os.path.abspath(path) in targets:
            continue
        try:
            data = read_regular_file(
                path,
                "signature bundle",
                max_bytes=limits.max_bundle_bytes,
                error=MalformedArtifactError,
                follow_symlinks=False,
            )
            statement = parse_statement(parse_bundle(data, source=str(path)).envelope.payload, what=str(path))
            old = parse_manifest(statement, what=str(path), limits=limits)
        except Error as e:
            stale.append((path, f"cannot be read as a weights signature ({e.diagnostics()})"))
            continue
        old_root = old.subject_digest.get("sha256")
        if any(root == old_root and names == set(old.names) for root, names in new):
            continue
        if old.single_file:
            why = "signs a single file, not this directory"
        elif all(root != old_root for root, _ in new):
            why = f"signs another model (root digest sha256:{old_root}, not sha256:{new[0][0]})"
        else:
            why = "signs other file names than the model just signed"
        stale.append((path, why))
    return stale


def _manifest_hash(algorithm: SignatureAlgorithm, hash_type: HashAlgorithm) -> HashAlgorithm:
    """The manifest hash type a key of `algorithm` signs when the caller asks for `hash_type` manifests."""
    if hash_type not in (HashAlgorithm.SHA256, HashAlgorithm.BLAKE3):
        raise UnsupportedAlgorithmError(f"manifest hash type {hash_type} cannot be chosen (sha256 or blake3)")
    scheme = scheme_for(algorithm)
    if hash_type is HashAlgorithm.SHA256:
        return scheme.manifest_hash
    if hash_type not in scheme.signable_hashes:
        raise UnsupportedAlgorithmError(
            f"{algorithm} keys sign {scheme.manifest_hash} manifests bound to the SHA-256 model root, not "
            f"{hash_type} manifests; sign with hash type sha256, or without the {algorithm} key"
        )
    return hash_type


def _check_bundle_size(bundle: bytes, path: Path, manifest: Manifest, max_bytes: int) -> None:
    """Refuse to write a bundle verifiers refuse by default (`Limits.max_bundle_bytes`).

    Raises:
        MalformedArtifactError: The bundle is larger than `max_bytes`; the message says what shrinks it.
    """
    if len(bundle) <= max_bytes:
        return
    tensors = sum(len(t) for t in manifest.tensors.values())
    shrink = (
        f"per-tensor digests of {tensors} tensors take most of it: sign with --tensor-digest none (file "
        "digests only), or raise"
        if tensors
        else "raise"
    )
    raise MalformedArtifactError(
        f"{path}: the bundle would be {len(bundle)} bytes, over the {max_bytes} bytes verifiers accept by "
        f"default (limits.maxBundleBytes); {shrink} maxBundleBytes in every verifier's policy and sign with "
        "the same Limits"
    )
