"""Models as OCI artifacts (CNCF ModelPack) with their evidence attached as referrers (DESIGN.md decision 15).

`push_model` verifies a signed model directory, uploads each signed file as one raw layer (its digest is
the file's SHA-256; its path is in `org.cncf.model.filepath`), the ModelPack config and an image manifest
with `artifactType: application/vnd.cncf.model.manifest.v1+json`; it then attaches the directory's bundles
and a signed *binding* statement as referrers, each in sigstore's OCI bundle layout
(`modelsec.registry.referrers.attach_bundle`). The binding (`modelsec.attestations.predicates.oci_binding`)
is an in-toto statement whose subject is the OCI manifest digest and whose predicate names the model root
digest: the OMS root digest stays the model's identity, tools that verify attestations about an image digest
(cosign `verify-attestation`, `@sigstore/verify`, policy-controller, Kyverno) can check it, and modelsec
readers check it with a policy key holding the `weights` role.

`pull_model` trusts nothing the registry says until it is verified, in this order:

1. the manifest is fetched by digest (or tag, then hashed), strictly parsed, and every layer path is a
   plain relative path (no `..`, no absolute path, no duplicate, no reserved bundle name);
2. referrers are listed (`modelsec.registry.referrers.read_evidence`): those that are not evidence
   (another `artifactType`) are skipped unread, the rest are read within a budget (256 referrers,
   64 MiB, 20 s; past it they are listed as ignored, never a refusal: a writer cannot veto), each
   fetched by digest and kept only if its own subject is this manifest;
3. a binding signed by a trusted key has this manifest digest as its subject, and its predicate names the
   model root digest (else nothing is downloaded); a binding of the deprecated v1 form (subject = root
   digest, `manifestDigest` in the predicate) still counts, with a deprecation note in `PullResult.notes`;
4. the layers are downloaded into a private staging directory next to the destination (mode 0700, each
   file created with `O_EXCL`, no link followed), several at once (`RegistryOptions.transfers`), each
   checked against its size and digest, and the weights bundles about a bound root digest are written
   under their default names. Each byte is read from the network once: as it is written, it is hashed for
   the layer digest (SHA-256, which is also the file's OMS digest) and fed to a
   `modelsec.modelformat.hashing.StreamHasher` for every other digest the signed manifests name (SM3
   file digests; the safetensors header, parsed strictly, and each tensor's digest over its byte range);
   the file's identity (device, inode, size, mtime, ctime) is recorded after its last write;
5. `verify_model` verifies the staging directory against the policy, pinned to the bound root digests
   (file set, every digest, pickle and remote-code rules), and the policy's attestation requirements are
   checked with the referrer bundles. It takes the digests of step 4 (`prehashed`) instead of reading a
   file again only where they cover every digest it compares and the file's identity is unchanged (else
   it refuses: `DigestMismatchError` on the file identity); a file whose streamed hashing failed (e.g. a
   malformed header) is hashed by the verifier, which refuses it in its own order, as before;
6. the identity of every prehashed file is checked once more, then the staging directory is renamed to
   the destination (one `rename`); on any error it is removed and the destination does not exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.bundle import Bundle, parse_bundle, sign_statement
from modelsec.attestations.predicates.oci_binding import (
    binding_statement,
    is_binding_type,
    parse_binding_statement,
)
from modelsec.attestations.predicates.oms import OMS_PREDICATE_TYPE, Resource, parse_manifest
from modelsec.attestations.statement import is_sha256_hex, parse_statement
from modelsec.errors import (
    Error,
    MalformedArtifactError,
    PolicyError,
    SignatureError,
    UntrustedSignerError,
)
from modelsec.modelformat.hashing import (
    FileDigests,
    FileIdentity,
    PrehashedFile,
    StreamHasher,
    check_identity,
)
from modelsec.modelformat.model_files import WEIGHT_SUFFIXES, open_model_root
from modelsec.policy import Policy
from modelsec.progress import step
from modelsec.registry.client import (
    MANIFEST_MEDIA_TYPE,
    OciReference,
    RegistryClient,
    RegistryOptions,
    canonical_json,
    descriptor,
    parse_reference,
    root_tag,
    run_bounded,
    shared_client,
)
from modelsec.registry.referrers import ReferrerBudget, attach_bundle, read_evidence
from modelsec.signer.keys import KeyBackend, TrustedKey
from modelsec.signer.layout import (
    GATE_BUNDLE_NAME,
    MODEL_IGNORE_PATHS,
    STATEMENTS_DIR_NAME,
    WATERMARK_BUNDLE_NAME,
    find_default_bundles,
    write_bundle_file,
)
from modelsec.signer.schemes import scheme_for
from modelsec.verifier import (
    find_attestation_bundles,
    verify_attestations,
    verify_bundle_signature,
    verify_model,
)
from modelsec.verifier.admission import ModelAdmission
from modelsec.verifier.attestations import find_statement_files
from modelsec.verifier.stores import StoredBundle
from modelsec.verifier.trust.bundles import check_signature_time, read_bundle_bytes

__all__ = [
    "MODEL_ARTIFACT_TYPE",
    "PullResult",
    "PushResult",
    "SkippedReferrer",
    "bound_root_digests",
    "pull_model",
    "push_model",
]

MODEL_ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG_MEDIA_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"
FILEPATH_ANNOTATION = "org.cncf.model.filepath"
TITLE_ANNOTATION = "org.opencontainers.image.title"
ROOT_DIGEST_ANNOTATION = "dev.modelsec.model.root-digest"  # informational: the binding is the evidence
_DOC_NAMES = re.compile(r"^(readme|license|licence|notice)(\.[a-z]+)?$", re.IGNORECASE)
_MAX_REFERRERS = 256  # evidence referrers read per manifest (more are listed unread, never refused)


def _layer_media_type(name: str) -> str:
    base = PurePosixPath(name).name
    if base.endswith(WEIGHT_SUFFIXES):
        return WEIGHT_RAW
    return DOC_RAW if _DOC_NAMES.match(base) else WEIGHT_CONFIG_RAW


@dataclass(frozen=True, slots=True)
class PushResult:
    """What `push_model` pushed: the manifest digest, the model root digest and the referrers attached."""

    reference: str
    manifest_digest: str
    root_digest: str
    layers: int
    referrers: tuple[str, ...]


def _push_layer(
    client: RegistryClient, repository: str, model_dir: Path, resource: Resource, position: str
) -> dict[str, Any]:
    """Upload one signed file as a raw layer (read once, hashed as it is sent); its layer descriptor.

    The verified manifest's SHA-256 of the file, where it has one (`hash_type` sha256), is the expected
    digest: a file changed since verification is refused before its upload is committed.
    """
    name = resource.name
    path = model_dir / name
    step(f"push: layer {position} {name}")
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise MalformedArtifactError(f"{path}: cannot be read: {e.strerror}") from e
    expected = f"sha256:{resource.digest.hex()}" if resource.algorithm == HashAlgorithm.SHA256 else None
    digest = client.push_file(repository, path, size, digest=expected)
    annotations = {FILEPATH_ANNOTATION: name, TITLE_ANNOTATION: name}
    return {"mediaType": _layer_media_type(name), "digest": digest, "size": size, "annotations": annotations}


def _bundle_files(model_dir: Path, policy: Policy) -> list[tuple[str, bytes]]:
    out = []
    # The signatures, the reserved attestations and the statements of `model.attestations/` (provenance,
    # `attest sign`): all of a model's evidence travels with it.
    statements = find_statement_files(model_dir, limits=policy.limits)
    for path in (*find_default_bundles(model_dir), *statements):
        data = read_bundle_bytes(path, policy.limits.max_bundle_bytes)
        if len(data) > policy.limits.max_bundle_bytes:
            raise MalformedArtifactError(f"{path}: larger than {policy.limits.max_bundle_bytes} bytes")
        out.append((path.name, data))
    return out


def push_model(
    model_dir: str | os.PathLike[str],
    reference: str,
    policy: Policy | ModelAdmission,
    binding_key: KeyBackend,
    *,
    options: RegistryOptions | None = None,
) -> PushResult:
    """Verify a signed model directory and push it as a ModelPack artifact with its evidence as referrers.

    The directory is verified with `verify_model` first (a model the policy refuses is not pushed); each
    signed file then becomes one raw layer. The bundles in the directory (`model.sig`, `model.sm2.sig`, …,
    `model.gate.sig`, `model.watermark.sig`, the statements in `model.attestations/`) and a binding of the
    manifest digest to the root digest, signed with `binding_key`, are attached as referrers. The manifest
    is tagged with the reference's tag and with `root_tag(root digest)`. Up to `RegistryOptions.transfers`
    layers are uploaded at once, each file read once and hashed as it is sent; a file changed between
    verification and upload is refused before its upload is committed when the manifest holds SHA-256 file
    digests (`hash_type` sha256; with SM3 or BLAKE3 it is not detected here, and `pull` refuses it).

    Args:
        model_dir: A signed model directory.
        reference: `oci://REGISTRY/REPOSITORY[:TAG]` (default tag `latest`; a digest cannot be pushed to).
        policy: Verifies the directory before it is pushed (an admission: every policy matching the
            reference).
        binding_key: Signs the binding statement (readers need its public key with the `weights` role).
        options: Registry connection and credentials (default: from the environment).

    Returns:
        The manifest digest, the root digest and the referrer digests.

    Raises:
        MalformedArtifactError: A bad reference, a single-file model, or an unreadable file.
        SignatureError, DigestMismatchError, FileSetMismatchError, PolicyViolationError: From verification
            (a `DigestMismatchError` also for a file changed during the upload).
        BackendUnavailableError: The registry refused or could not be reached (after the retries that
            `modelsec.registry.client` describes).
    """
    model_dir = Path(model_dir)
    ref = parse_reference(reference)
    if ref.digest:
        raise MalformedArtifactError(f"{reference}: push to a tag, not a digest")
    step(f"push: verifying {model_dir}")
    verified = verify_model(model_dir, policy)
    names = [r.name for r in verified.manifest.resources]
    if names == ["."]:
        raise MalformedArtifactError(f"{model_dir}: a single-file model cannot be pushed; push its directory")
    bundles = _bundle_files(model_dir, ModelAdmission.of(policy).policy)
    client = RegistryClient(ref.registry, options or RegistryOptions.from_env())
    try:
        resources = verified.manifest.resources
        layers = run_bounded(
            [
                functools.partial(_push_layer, client, ref.repository, model_dir, r, f"{i}/{len(resources)}")
                for i, r in enumerate(resources, 1)
            ],
            client.options.transfers,
        )
        config = canonical_json(
            {
                "descriptor": {"name": model_dir.name},
                "config": {"format": "safetensors"},
                "modelfs": {"type": "layers", "diffIds": [layer["digest"] for layer in layers]},
            }
        )
        config_desc = descriptor(MODEL_CONFIG_MEDIA_TYPE, config)
        client.put_blob(ref.repository, config_desc["digest"], len(config), config)
        manifest = canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "artifactType": MODEL_ARTIFACT_TYPE,
                "config": config_desc,
                "layers": layers,
                "annotations": {ROOT_DIGEST_ANNOTATION: f"sha256:{verified.root_digest}"},
            }
        )
        subject = descriptor(MANIFEST_MEDIA_TYPE, manifest)
        for tag in (ref.tag or "latest", root_tag(verified.root_digest)):
            client.put_manifest(ref.repository, tag, manifest, MANIFEST_MEDIA_TYPE)
        statement = binding_statement(
            f"{ref.registry}/{ref.repository}",
            subject["digest"],
            verified.root_digest,
            model_name=model_dir.name,
            artifact_type=MODEL_ARTIFACT_TYPE,
        )
        step(f"push: attaching the binding and {len(bundles)} bundles")
        binding = sign_statement(statement, binding_key)
        attached = [attach_bundle(client, ref.repository, subject, binding)[0]]
        for _, data in bundles:
            attached.append(attach_bundle(client, ref.repository, subject, data)[0])
    finally:
        client.close()
    return PushResult(
        f"{ref.repository_uri}@{subject['digest']}",
        subject["digest"],
        verified.root_digest,
        len(layers),
        tuple(attached),
    )


@dataclass(frozen=True, slots=True)
class SkippedReferrer:
    """A referrer `pull` did not use, and why (`PullResult.skipped`).

    Attributes:
        referrer: `oci://REGISTRY/REPOSITORY@sha256:<referrer manifest digest>`, or the repository for
            referrers counted without being read.
        kind: What it is: `signature` (a signature of the model's weights), `binding`, `attestation`
            (any other statement), or `other` (not evidence, unreadable, malformed).
        reason: Why, as a code: `untrusted-key` (no trusted key verifies it: another signer's),
            `invalid-signature` (it names a trusted key whose check fails), `other-manifest`,
            `other-model`, `not-evidence`, `unread` (over the budget or unreadable), `malformed`, or the
            error class of another refusal.
        detail: The whole reason, one line (printed under `--verbose`).
    """

    referrer: str
    kind: str
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class PullResult:
    """What `pull_model` verified and placed.

    Attributes:
        path: The destination directory (it exists only after everything verified).
        manifest_digest: The OCI manifest digest pulled.
        root_digest: The verified model root digest.
        files: Number of files placed.
        ignored: Referrers that were not evidence (unparseable, another subject, untrusted), with reasons:
            the `detail` of each entry of `skipped`.
        skipped: The same referrers, each with its kind and a reason code. A signature skipped here is not
            placed in the destination: the pulled folder holds only the bundles a trusted key verified.
        signers: The names of the policy keys whose weights signatures verified (one per bundle).
        notes: Evidence that counted but is deprecated (a v1 binding), with what to do.
    """

    path: Path
    manifest_digest: str
    root_digest: str
    files: int
    ignored: tuple[str, ...] = field(default=())
    signers: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())
    skipped: tuple[SkippedReferrer, ...] = field(default=())


def _safe_path(value: object, what: str) -> str:
    """A layer's file path: relative, POSIX, no `..`/`.`/empty component, no backslash or control char."""
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise MalformedArtifactError(f"{what}: {FILEPATH_ANNOTATION} is missing or not a path")
    parts = value.split("/")
    if (
        value.startswith("/")
        or "\\" in value
        or any(ord(c) < 0x20 or c == "\x7f" for c in value)
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise MalformedArtifactError(f"{what}: {FILEPATH_ANNOTATION} {value!r} is not a plain relative path")
    if value in MODEL_IGNORE_PATHS or parts[0] in MODEL_IGNORE_PATHS:
        raise MalformedArtifactError(f"{what}: {FILEPATH_ANNOTATION} {value!r} is a reserved name")
    return value


def _parse_model_manifest(data: bytes, what: str, max_files: int) -> list[tuple[str, str, int]]:
    """`(path, digest, size)` of every layer of a ModelPack manifest (strict; see the module docstring)."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise MalformedArtifactError(f"{what}: manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("mediaType") != MANIFEST_MEDIA_TYPE:
        raise MalformedArtifactError(f"{what}: not an OCI image manifest")
    config = doc.get("config")
    if doc.get("artifactType") != MODEL_ARTIFACT_TYPE and not (
        isinstance(config, dict) and config.get("mediaType") == MODEL_CONFIG_MEDIA_TYPE
    ):
        raise MalformedArtifactError(f"{what}: not a ModelPack artifact ({MODEL_ARTIFACT_TYPE})")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers or len(layers) > max_files:
        raise MalformedArtifactError(f"{what}: layers must be a list of 1 to {max_files} descriptors")
    out: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for i, layer in enumerate(layers):
        where = f"{what} layer {i}"
        if not isinstance(layer, dict) or not isinstance(layer.get("annotations"), dict):
            raise MalformedArtifactError(f"{where}: not a descriptor with annotations")
        media_type, digest, size = layer.get("mediaType"), layer.get("digest"), layer.get("size")
        if not isinstance(media_type, str) or not media_type.endswith(".raw"):
            raise MalformedArtifactError(f"{where}: media type {media_type!r} is not a raw file layer")
        if (
            not isinstance(digest, str)
            or not is_sha256_hex(digest.removeprefix("sha256:"))
            or digest[:7] != "sha256:"
        ):
            raise MalformedArtifactError(f"{where}: digest {digest!r} is not sha256:<hex>")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise MalformedArtifactError(f"{where}: size {size!r} is not a byte count")
        path = _safe_path(layer["annotations"].get(FILEPATH_ANNOTATION), where)
        folded = path.casefold()
        if folded in seen or any(folded.startswith(s + "/") or s.startswith(folded + "/") for s in seen):
            raise MalformedArtifactError(f"{where}: path {path!r} repeats or nests inside another layer's")
        seen.add(folded)
        out.append((path, digest, size))
    return out


@dataclass(slots=True)
class _Evidence:
    bound: set[str] = field(default_factory=set)
    weights: dict[str, bytes] = field(default_factory=dict)
    other: list[StoredBundle] = field(default_factory=list)
    skipped: list[SkippedReferrer] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ignored(self) -> list[str]:
        return [s.detail for s in self.skipped]

    def skip(self, source: str, kind: str, reason: str | Error, detail: str) -> None:
        code = reason if isinstance(reason, str) else _reason_code(reason)
        self.skipped.append(SkippedReferrer(source, kind, code, detail))


def _verify_weights_signature(bundle: Bundle, policy: Policy) -> TrustedKey:
    """The policy key or authority (`weights` role) that signed `bundle`, at a time its window allows.

    The same checks `verify_signatures` makes: pinned keys, then certificate and keyless authorities, then
    the bundle's RFC 3161 timestamps and the key's validity window (`check_signature_time`).
    """
    key = verify_bundle_signature(
        bundle,
        policy.keys,
        role="weights",
        authorities=policy.authorities,
        timestamp_authorities=policy.timestamp_authorities,
    )
    check_signature_time(bundle, key, policy)
    return key


def _collect(
    client: RegistryClient,
    ref: OciReference,
    manifest_digest: str,
    policy: Policy,
    *,
    bindings_only: bool = False,
) -> _Evidence:
    """Read every referrer, keep the verified bindings of this manifest and the bundles about them.

    With `bindings_only`, the bundles about the bound models are neither checked nor kept (only `bound`
    is filled): the caller reads and verifies the models' evidence itself.
    """
    found = _Evidence()
    budget = ReferrerBudget(max_referrers=_MAX_REFERRERS, max_bundle_bytes=policy.limits.max_bundle_bytes)
    reads, skipped = read_evidence(client, ref.repository, manifest_digest, budget)
    if skipped:
        found.skip(
            ref.repository_uri,
            "other",
            "not-evidence",
            f"{ref.repository_uri}: {skipped} referrers that are not evidence (not read)",
        )
    raw: list[tuple[str, bytes]] = []
    for read in reads:
        source = f"{ref.repository_uri}@{read.digest}"
        if read.note:
            found.skip(source, "other", "unread", f"{source}: {read.note.removeprefix(f'{source}: ')}")
        else:
            raw.append((source, read.data))
    statements = []
    for source, data in raw:
        try:
            bundle = parse_bundle(data, source=source)
            statement = parse_statement(bundle.envelope.payload, what=source)
        except Error as e:
            found.skip(source, "other", "malformed", _reason(source, e))
            continue
        if is_binding_type(statement.predicate_type):
            try:
                binding = parse_binding_statement(statement, what=source)
                _verify_weights_signature(bundle, policy)
            except Error as e:
                found.skip(source, "binding", e, _reason(source, e, "binding"))
                continue
            named = binding.manifest_digest
            if not hmac.compare_digest(named.encode(), manifest_digest.encode()):
                found.skip(
                    source, "binding", "other-manifest", f"{source}: binding of another manifest ({named})"
                )
                continue
            found.bound.add(binding.root_digest)
            if binding.deprecated:
                found.notes.append(
                    f"{source}: deprecated binding ({statement.predicate_type}, subject = the model root "
                    "digest): other tools cannot read it; push the model again to attach a current one"
                )
        elif not bindings_only:
            statements.append((source, data, bundle, statement))
    for source, data, bundle, statement in statements:
        root = statement.subjects[0].digest.get("sha256", "")
        if root not in found.bound:
            kind = "signature" if statement.predicate_type == OMS_PREDICATE_TYPE else "attestation"
            detail = f"{source}: about model {root or '?'}, which no trusted binding names"
            found.skip(source, kind, "other-model", detail)
        elif statement.predicate_type == OMS_PREDICATE_TYPE:
            try:
                key = _verify_weights_signature(bundle, policy)
            except Error as e:
                found.skip(source, "signature", e, _reason(source, e))
                continue
            found.weights.setdefault(scheme_for(key.algorithm).default_bundle_name, data)
        else:
            found.other.append(StoredBundle(hashlib.sha256(data).hexdigest(), root, data, source))
    return found


def _no_binding(what: str, reasons: Sequence[str]) -> SignatureError:
    """The refusal of a manifest no trusted binding names: one line, each skipped referrer in `details`."""
    # The line ends with what to do; a skipped signature's own advice says the same.
    first = reasons[0].removesuffix(UntrustedSignerError.NEXT_STEP) if reasons else "no referrers"
    # The referrer is in the manifest's repository: its short digest names it here, `details` in full.
    first = re.sub(r"^oci://[^@\s]+@(sha256:[0-9a-f]{12})[0-9a-f]{52}", r"referrer \1…", first)
    first = first if len(first) <= 400 else f"{first[:399]}…"
    more = f"; {len(reasons) - 1} more skipped (--verbose lists them)" if len(reasons) > 1 else ""
    error = SignatureError(
        f"{what}: no binding to a model root digest signed by a trusted key ({first}{more}); "
        "pull with the key that pushed it (--trusted-key) or a policy that trusts it"
    )
    error.details = tuple(reasons)
    return error


def _reason_code(e: Error) -> str:
    """A skipped referrer's reason code for an error (`SkippedReferrer.reason`)."""
    if isinstance(e, UntrustedSignerError):
        return "untrusted-key"
    if isinstance(e, SignatureError):
        return "invalid-signature"
    return type(e).__name__


def _reason(source: str, e: Error, what: str = "") -> str:
    """Why a referrer was skipped: its source named once (an error about it usually names it already)."""
    message = e.diagnostics().removeprefix(f"{source}: ")
    return f"{source}: {what}: {message}" if what else f"{source}: {message}"


def bound_root_digests(reference: str, policy: Policy, *, options: RegistryOptions | None = None) -> set[str]:
    """The model root digests a trusted binding attaches to an OCI manifest (admission by OCI digest).

    Only bindings whose signature verifies under a policy key with the `weights` role and which name the
    manifest's digest count; nothing about the model files is checked (admission then checks the root
    digest's evidence, and `pull` verifies the files).

    Read through the process's shared client for the registry and `options`
    (`modelsec.registry.client.shared_client`); inside a `modelsec.registry.referrers.listing_once` block
    the manifest's referrers are listed once for this lookup and the evidence read that follows.

    Raises:
        MalformedArtifactError, DigestMismatchError: A bad reference, manifest or listing.
        NotFoundError: No such manifest.
        BackendUnavailableError: The registry cannot be reached.
    """
    ref = parse_reference(reference)
    # The process's shared client: a webhook looks bindings up on every uncached decision, and a client of
    # its own would pay a TLS handshake and an authentication challenge each time.
    client = shared_client(ref.registry, options)
    _, _, digest = client.get_manifest(ref.repository, ref.ref)
    # The bundles about the bound models are the caller's to verify (admission reads them from its stores).
    return _collect(client, ref, digest, policy, bindings_only=True).bound


def _open_new(root: Path, relative: str) -> Any:
    """Create `root/relative` (and its directories) without following links: only new entries are made."""
    directory = root
    for part in relative.split("/")[:-1]:
        directory = directory / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o755)
        if not directory.is_dir() or directory.is_symlink():
            raise MalformedArtifactError(f"{relative}: {part} is not a directory")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(directory / relative.split("/")[-1], flags, 0o644), "wb")


def pull_model(
    reference: str,
    destination: str | os.PathLike[str],
    policy: Policy | ModelAdmission,
    *,
    options: RegistryOptions | None = None,
) -> PullResult:
    """Download a ModelPack artifact, verify it and its evidence, and only then place it at `destination`.

    See the module docstring for the order of checks. The destination must not exist; it is created by
    renaming the verified staging directory (same file system), so it either holds the verified model or
    does not exist.

    Args:
        reference: `oci://REGISTRY/REPOSITORY@sha256:HEX` (a tag is resolved, and the digest it resolves to
            is what the binding must name).
        destination: The directory to create.
        policy: Trusted keys (`weights` role for signatures and bindings), algorithms, attestations, limits;
            an admission (`modelsec.verifier.admission.admit`) is verified as `verify_model` verifies it, its
            `policy` reading the bindings and the referrers' attestations.
        options: Registry connection and credentials (default: from the environment).

    Returns:
        The verified digests and the number of files placed.

    Raises:
        PolicyError: `destination` exists, or its parent cannot hold a staging directory.
        MalformedArtifactError: A bad reference or manifest, a layer path that escapes, a wrong size.
        DigestMismatchError: A manifest or layer differs from its digest, or a file from the signed
            manifest.
        SignatureError: No trusted binding of this manifest, or no trusted signature of the model.
        FileSetMismatchError, PolicyViolationError: From `verify_model`.
        AttestationError: The policy's attestation requirements are not met.
        NotFoundError, BackendUnavailableError: The artifact or registry is missing.
    """
    ref = parse_reference(reference)
    admission = ModelAdmission.of(policy)
    policy = admission.policy
    destination = Path(destination)
    if os.path.lexists(destination):
        raise PolicyError(f"{destination}: exists; pull creates the directory")
    client = RegistryClient(ref.registry, options or RegistryOptions.from_env())
    try:
        step(f"pull: reading the manifest of {ref.repository_uri}")
        data, _, manifest_digest = client.get_manifest(ref.repository, ref.ref)
        what = f"{ref.repository_uri}@{manifest_digest}"
        layers = _parse_model_manifest(data, what, policy.limits.max_files)
        step("pull: reading the evidence referrers")
        evidence = _collect(client, ref, manifest_digest, policy)
        if not evidence.bound:
            raise _no_binding(what, evidence.ignored)
        try:
            staging = Path(tempfile.mkdtemp(prefix=".modelsec-pull-", dir=destination.parent))
        except OSError as e:
            raise PolicyError(f"{destination.parent}: cannot create a staging directory: {e.strerror}") from e
        try:
            root, signers = _stage(client, ref, layers, evidence, staging, admission)
            os.rename(staging, destination)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        client.close()
    return PullResult(
        destination,
        manifest_digest,
        root,
        len(layers),
        tuple(evidence.ignored),
        signers,
        tuple(evidence.notes),
        tuple(evidence.skipped),
    )


def _stage(
    client: RegistryClient,
    ref: OciReference,
    layers: Sequence[tuple[str, str, int]],
    evidence: _Evidence,
    staging: Path,
    admission: ModelAdmission,
) -> tuple[str, tuple[str, ...]]:
    """Download, place the evidence and verify `staging`: the root digest and the signing keys' names."""
    policy = admission.policy
    algorithms, tensor_hash = _streamed_digests(evidence, policy)
    hashed: dict[str, PrehashedFile] = {}

    def pull_layer(i: int, path: str, digest: str, size: int) -> None:
        step(f"pull: layer {i}/{len(layers)} {path} ({size} bytes)")
        what = f"{ref.repository_uri}: {path}"

        def start() -> StreamHasher:
            return StreamHasher(
                path, size, algorithms=algorithms, tensor_hash=tensor_hash, limits=policy.limits, what=what
            )

        with _open_new(staging, path) as file:
            sink = _HashingSink(file, start)
            client.stream_blob(ref.repository, digest, size, sink, what=what)
            file.flush()
            identity = FileIdentity.of(os.fstat(file.fileno()))
        streamed = sink.result()
        if streamed is not None:
            # stream_blob verified this SHA-256 over the very bytes written: the layer digest is the file's.
            sha256 = {HashAlgorithm.SHA256: bytes.fromhex(digest.removeprefix("sha256:"))}
            digests = dataclasses.replace(streamed, digests={**streamed.digests, **sha256})
            hashed[path] = PrehashedFile(digests, identity, tensor_hash, policy.limits)

    # Several layers at once, each hashed as it is written into the staging directory; nothing there is
    # used before every layer and then the whole model verified (pull_model removes it otherwise).
    run_bounded(
        [functools.partial(pull_layer, i, *layer) for i, layer in enumerate(layers, 1)],
        client.options.transfers,
    )
    for name, data in evidence.weights.items():
        (staging / name).write_bytes(data)
    # The referrers' statements go where `verify_model` reads a model's evidence (`model.attestations/`), so
    # a policy requiring a gate, a watermark or a condition judges them as beside a local model; those not
    # accepted are taken out again below, before the model is placed.
    statements = staging / STATEMENTS_DIR_NAME
    staged: dict[str, Path] = {}
    if evidence.other:
        statements.mkdir()
        for bundle in evidence.other:
            statement_file = statements / f"{bundle.id}.sig"
            statement_file.write_bytes(bundle.data)
            staged[bundle.source] = statement_file
    # The policies were chosen for the OCI reference, not for the staging directory's own file:// path (a
    # name of pull's choosing): the admission is handed on without a URI, so verify_model does not compare
    # it with the path it opens (DESIGN decision 20 guards local models, whose path is what was matched).
    unbound = dataclasses.replace(admission, uri="")
    step("pull: verifying the staged model")
    verified = verify_model(staging, unbound, expected_digests=sorted(evidence.bound), prehashed=hashed)
    # The stores every front door reads (`modelsec.verifier.stores.evidence_stores`): the referrers, read
    # above, and the policy's attestationStore.
    found = [*evidence.other, *find_attestation_bundles(None, verified.root_digest, policy)]
    verdict = verify_attestations(verified.root_digest, found, policy, require_signatures=False)
    verdict.raise_for_policy()
    _place_attestations(staging, verdict.evidence, [f for f in found if isinstance(f, StoredBundle)])
    kept = {e.source for e in verdict.evidence if e.kind not in ("robustness", "watermark")}
    for source, statement_file in staged.items():
        if source not in kept:  # not evidence here, or placed under its reserved name
            statement_file.unlink()
    if staged and not any(statements.iterdir()):
        statements.rmdir()
    # The files whose digests were taken as written are, right before the rename, still those files.
    root_fd = open_model_root(staging)
    try:
        for name, entry in hashed.items():
            check_identity(root_fd, name, entry.identity, model=str(staging))
    finally:
        os.close(root_fd)
    return verified.root_digest, tuple(b.key.name for b in verified.bundles)


def _streamed_digests(
    evidence: _Evidence, policy: Policy
) -> tuple[list[HashAlgorithm], HashAlgorithm | None]:
    """What to hash while layers arrive besides their SHA-256: the file and tensor algorithms signed.

    Those the weights bundles' manifests name (file hash types, the per-tensor algorithm): a guess from
    bundles whose signatures verified. `verify_model` decides what it compares, and hashes any file these
    digests do not cover itself.
    """
    algorithms: list[HashAlgorithm] = []
    tensor_hash: HashAlgorithm | None = None
    for name, data in evidence.weights.items():
        try:
            statement = parse_statement(parse_bundle(data, source=name).envelope.payload, what=name)
            manifest = parse_manifest(statement, what=name, limits=policy.limits)
        except Error:
            continue  # refused by `verify_model`, which reads these bundles again
        if manifest.hash_type is not HashAlgorithm.SHA256 and manifest.hash_type not in algorithms:
            algorithms.append(manifest.hash_type)
        tensor_hash = tensor_hash or manifest.tensor_hash
    return algorithms, tensor_hash


class _HashingSink:
    """A staged file being written, each byte also fed to a `StreamHasher` (`stream_blob` writes into it).

    A hashing refusal (a malformed safetensors header) is not raised here: the layer digest is checked
    first, as it always was, and the verifier then hashes that file itself and refuses it in its own order.
    """

    def __init__(self, file: Any, start: Callable[[], StreamHasher]) -> None:
        self._file, self._start = file, start
        self._hasher: StreamHasher | None = start()

    def write(self, data: bytes, /) -> int:
        if self._hasher is not None:
            try:
                self._hasher.update(data)
            except MalformedArtifactError:
                self._hasher = None
        return int(self._file.write(data))

    def seekable(self) -> bool:
        return bool(self._file.seekable())

    def seek(self, offset: int, /) -> int:
        if offset != 0:  # a resumed download continues in place; only a restart seeks, to 0
            raise ValueError(f"seek to {offset}")
        self._hasher = self._start()
        return int(self._file.seek(0))

    def truncate(self) -> int:
        return int(self._file.truncate())

    def result(self) -> FileDigests | None:
        """The digests of the bytes written, or None where hashing refused them (the verifier hashes it)."""
        if self._hasher is None:
            return None
        try:
            return self._hasher.finish()
        except MalformedArtifactError:
            return None


def _place_attestations(staging: Path, accepted: Sequence[Any], bundles: Sequence[StoredBundle]) -> None:
    """Write the first accepted gate and watermark attestation under their reserved names."""
    by_source: Mapping[str, bytes] = {b.source: b.data for b in bundles}
    names = {"robustness": GATE_BUNDLE_NAME, "watermark": WATERMARK_BUNDLE_NAME}
    for item in accepted:
        name = names.get(item.kind)
        if name and item.source in by_source and not (staging / name).exists():
            write_bundle_file(staging / name, by_source[item.source], what="attestation")
