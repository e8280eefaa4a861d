"""Steps 1-2 of model verification: a model's bundles read, their signatures checked, their manifests parsed.

No model file is opened here. The result (`SignedModel`) says what the files must hash to; the file set and
the digests are checked by `modelsec.verifier.files`. See `modelsec.verifier.verification` for the order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.predicates.oms import (
    OMS_PREDICATE_TYPE,
    Manifest,
    Resource,
    TensorEntry,
    parse_manifest,
)
from modelsec.attestations.statement import parse_statement
from modelsec.errors import (
    DigestMismatchError,
    Error,
    MalformedArtifactError,
    PolicyViolationError,
    SignatureError,
)
from modelsec.limits import Limits
from modelsec.modelformat.model_files import open_beneath, open_model_root
from modelsec.policy import Policy
from modelsec.signer import layout
from modelsec.signer.keys import TrustedKey
from modelsec.signer.layout import (
    BUNDLE_SUFFIXES,
    STATEMENTS_DIR_NAME,
    find_attestation_files,
    find_default_bundles,
)
from modelsec.signer.schemes import scheme_for
from modelsec.verifier.admission import ModelAdmission
from modelsec.verifier.pinning import expected_digest_set
from modelsec.verifier.trust.bundles import (
    check_bundle_name,
    check_bundle_size,
    check_signature_time,
    has_key_for_bundle,
    read_bundle,
    verify_bundle_signature,
)

if TYPE_CHECKING:  # the attestation checks are imported when a policy requires attestations
    from modelsec.verifier.attestations import AttestationVerdict
    from modelsec.verifier.stores import StoredBundle

__all__ = [
    "SignedModel",
    "VerifiedBundle",
    "bind_single_file",
    "verify_signatures",
]


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
        warnings: Failures of the other matching policies in `mode: warn` (`ModelAdmission.vouch`).
        root_fd: The descriptor of `model_dir` the bundles were read through (owned by the caller, open for as
            long as this value is used), or None: every later read then opens `model_dir` by path.
    """

    model_dir: Path
    bundles: tuple[VerifiedBundle, ...]
    skipped: tuple[Path, ...]
    manifest: Manifest
    file_hashes: tuple[HashAlgorithm, ...]
    tensor_hash: HashAlgorithm | None
    excluded: tuple[str, ...] = ()
    attestations: AttestationVerdict | None = None
    warnings: tuple[str, ...] = ()
    root_fd: int | None = None

    def open_root(self) -> int:
        """A new descriptor of the model directory (the caller closes it): `root_fd` again when there is one.

        Raises:
            MalformedArtifactError: Without `root_fd`: `model_dir` is missing or not a directory.
            PolicyViolationError: Without `root_fd`: `model_dir` is a symlink.
        """
        if self.root_fd is not None:
            return os.dup(self.root_fd)
        return open_model_root(self.model_dir)

    @property
    def root_digest(self) -> str:
        """The model root digest (hex)."""
        return self.manifest.subject_digest["sha256"]

    def tensor_entries(self, files: Collection[str] | None = None) -> dict[str, tuple[str, TensorEntry]]:
        """Signed tensor name -> (file, entry) from the extension (empty for plain OMS manifests).

        Tensor names are unique within a file, not within a model (a variant's shards, or two subfolders,
        hold the same names): `files` restricts the map to those files, so that a shard is never given
        another file's entries; None takes every file (the first file naming a tensor wins).
        """
        result: dict[str, tuple[str, TensorEntry]] = {}
        for b in self.bundles:
            if b.manifest.tensor_hash is not self.tensor_hash:
                continue
            for file, entries in b.manifest.tensors.items():
                if files is not None and file not in files:
                    continue
                for name, entry in entries.items():
                    result.setdefault(name, (file, entry))
        return result


def verify_signatures(
    model_dir: Path,
    policy: Policy | ModelAdmission,
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
        policy: Trusted keys, required algorithms, limits; an admission (`modelsec.verifier.admission`) is
            verified under its `policy`, and each of its other matching policies then verifies its own
            signatures and attestations over the same root digest (an enforcing one's failure is raised, a
            warn one's is returned in `SignedModel.warnings`).
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
    admission = ModelAdmission.of(policy)
    policy = admission.policy
    limits = policy.limits
    pins = None if expected_digests is None else expected_digest_set(expected_digests)
    model = str(model_dir)
    explicit = bundles is not None
    if bundles is not None:
        bundle_paths = list(bundles)
    else:
        bundle_paths = find_default_bundles(model_dir, root_fd=root_fd)
    if not bundle_paths:
        looked_for = ", ".join(layout.SIGNATURE_FILE_NAMES)
        raise SignatureError(f"{model}: no signature bundle found (looked for {looked_for})")
    verified: list[VerifiedBundle] = []
    skipped: list[Path] = []
    seen: set[tuple[bytes, bytes]] = set()
    for path in bundle_paths:
        bundle = (
            read_bundle(path, limits)
            if explicit or root_fd is None
            else _read_bundle_at(root_fd, path, limits)
        )
        try:
            key = verify_bundle_signature(
                bundle,
                policy.keys,
                authorities=policy.authorities,
                timestamp_authorities=policy.timestamp_authorities,
            )
        except SignatureError:
            if not explicit and not has_key_for_bundle(path, bundle, policy.keys, policy.authorities):
                skipped.append(path)
                continue
            raise
        check_bundle_name(path, key)
        check_signature_time(bundle, key, policy)
        if (bundle.signature.sig, bundle.envelope.payload) in seen:
            continue  # the same signature read twice (one bundle given twice): one signer, listed once
        seen.add((bundle.signature.sig, bundle.envelope.payload))
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
        unchecked = "".join(f"; {p.name} not checked (no configured key of its algorithm)" for p in skipped)
        advice = (
            ": give the signer's public key (--trusted-key) or a policy that trusts it" if skipped else ""
        )
        raise SignatureError(
            f"{model}: no signature bundle was signed by a configured key{unchecked}{advice}"
        )
    missing_algs = policy.require_algorithms - {b.algorithm for b in verified}
    if missing_algs:
        missing = ", ".join(sorted(a.value for a in missing_algs))
        raise SignatureError(f"{model}: required signature(s) missing: {missing} (policy {policy.name!r})")
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
            compared="root digest",  # not "sha256 digest sha256:…"
        )
    verdict = None
    if policy.requires_attestations:
        # Evidence about the weights is checked before any weight byte is read (no hashing wasted on a model
        # the policy refuses anyway); it is bound to the root digest the verified bundles sign.
        from modelsec.verifier.attestations import find_attestation_bundles, verify_attestations

        root = first.subject_digest["sha256"]
        found = find_attestation_bundles(model_dir if root_fd is None else None, root, policy)
        if root_fd is not None:
            found = [*_attestations_at(root_fd, model_dir, root, limits), *found]
        verdict = verify_attestations(root, found, policy, require_signatures=False)
        verdict.raise_for_policy()
    root = first.subject_digest["sha256"]
    # Every other matching policy must pass too, over this same root digest, before any model file is read.
    warnings = admission.vouch(
        root,
        lambda other: verify_signatures(
            model_dir,
            other,
            bundles=bundles,
            expected_digests=[root],
            ignore_paths=ignore_paths,
            root_fd=root_fd,
        ),
    )
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
        warnings=warnings,
        root_fd=root_fd,
    )


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
    check_bundle_size(data, path, limits)
    return parse_bundle(data, source=str(path))


def _attestations_at(root_fd: int, model_dir: Path, root: str, limits: Limits) -> list[Path | StoredBundle]:
    """The attestation bundles under their reserved names in the model directory, read through `root_fd`.

    One that cannot be read (a link, a special file) is passed on by path: reading it there fails the same
    way, and `verify_attestations` lists the reason among the ignored bundles.
    """
    from modelsec.verifier.stores import StoredBundle

    found: list[Path | StoredBundle] = []
    names = [p.name for p in find_attestation_files(model_dir, root_fd=root_fd)]
    names += [f"{STATEMENTS_DIR_NAME}/{n}" for n in _statement_names_at(root_fd)]
    for name in names:
        path = model_dir / name
        try:
            data = _read_at(root_fd, name, path, limits.max_bundle_bytes)
        except Error:
            found.append(path)
            continue
        found.append(StoredBundle(hashlib.sha256(data).hexdigest(), root, data, str(path)))
    return found


# As many statements as a store hands one verification (`StoreOptions.max_bundles`' default); a folder
# holding more is someone's flood, and the rest are not read.
_MAX_STATEMENT_FILES = 256


def _statement_names_at(root_fd: int) -> list[str]:
    """The bundle names (by suffix) in `model.attestations/` below `root_fd`; none if it is a link or absent.

    As `find_statement_files` does by path: `attest sign`, `attest provenance` and `release` write there.
    """
    try:
        fd = os.open(STATEMENTS_DIR_NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    except OSError:
        return []
    try:
        names = sorted(
            e.name
            for e in os.scandir(fd)
            if e.is_file(follow_symlinks=False) and e.name.endswith(BUNDLE_SUFFIXES)
        )
    except OSError:
        return []
    finally:
        os.close(fd)
    return names[:_MAX_STATEMENT_FILES]


def _excluded_paths(
    model_dir: Path, bundle_paths: Sequence[Path], ignore_paths: Sequence[str]
) -> tuple[str, ...]:
    """Every bundle file inside `model_dir` (read or reserved by name) plus the operator's ignore paths.

    Bundles are never model files: a bundle written inside the directory under any name (model_signing's
    Python API records no ignore path for it) and modelsec's reserved names are left out of every walk,
    whichever bundle's ignore list names them.
    """
    excluded = dict.fromkeys((*layout.RESERVED_BUNDLE_NAMES, *ignore_paths))
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
    """The file digests to compute: every checked manifest's hash type, plus SHA-256 for an SM3 model root.

    An SM3 manifest's subject carries the SHA-256 model root, which is checked against SHA-256 file digests
    unless the policy is restricted to SM3 (`checkHashes: [sm3]`, e.g. SM-only deployments): the SM3 file
    digests bind the bytes, and that root is the trusted signer's claim (still the identity attestations
    are matched against). SHA-256 and BLAKE3 manifests bind their root themselves (it is SHA-256 over the
    signed resource digests, checked when the manifest is parsed), so a BLAKE3 bundle hashes BLAKE3 only.
    """
    hashes = [b.manifest.hash_type for b in checked]
    sm3_root = HashAlgorithm.SM3 in hashes
    if sm3_root and (not policy.check_hashes or HashAlgorithm.SHA256 in policy.check_hashes):
        hashes.insert(0, HashAlgorithm.SHA256)
    return tuple(dict.fromkeys(hashes))
