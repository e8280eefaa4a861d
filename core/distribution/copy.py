"""Copy a model between registries with its evidence (`modelsec copy oci://A oci://B`).

A mirror made with `skopeo copy` or `crane copy` carries the manifest and its blobs but not the referrers,
so `pull` (and admission) from the mirror find no binding and refuse the model. `copy_model` copies, by
digest, the three things a reader needs:

1. the model's manifest, byte for byte (its digest, which every binding names as its subject, stays the
   same), fetched by digest and checked, then its config and every layer (each streamed through a spooled
   temporary file and checked against its size and digest before the destination sees it);
2. the evidence referrers (`modelsec.registry.referrers.read_evidence`, within the same budget as
   `pull`: what is not evidence is skipped, each bundle is fetched by digest and kept only if its referrer's
   subject is this manifest), each attached again to the destination's manifest in sigstore's OCI bundle
   layout (`attach_bundle`: the referrers API where the destination has it, the fallback tag index where
   it does not). The bundle bytes, hence their signatures, are unchanged; a referrer written by another tool
   gets the manifest `attach_bundle` writes, so its referrer digest may differ;
3. the tags: the destination's tag (default: the source's tag; none when neither names one) and
   `oms-sha256-<root digest>` when the manifest names its root digest (the tag the `oci://` store finds a
   model by).

Nothing is trusted by copying: the destination's readers verify as they would at the source. With a
`policy`, the model is first pulled from the source into a temporary directory and verified whole (as
`pull_model` does: the binding, the files, the attestation requirements), and nothing is written to the
destination unless it verifies.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelsec.attestations.statement import is_sha256_hex
from modelsec.distribution.push_pull import (
    MODEL_CONFIG_MEDIA_TYPE,
    ROOT_DIGEST_ANNOTATION,
    _parse_model_manifest,
    pull_model,
)
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.policy import Policy
from modelsec.registry.client import (
    MANIFEST_MEDIA_TYPE,
    OciReference,
    RegistryClient,
    RegistryOptions,
    descriptor,
    parse_reference,
    root_tag,
)
from modelsec.registry.referrers import ReferrerBudget, attach_bundle, read_evidence
from modelsec.verifier.admission import ModelAdmission

__all__ = ["CopyResult", "copy_model"]

_SPOOL_BYTES = 8 * 2**20  # blobs up to this size are copied in memory, larger ones through a temporary file


@dataclass(frozen=True, slots=True)
class CopyResult:
    """What `copy_model` copied.

    Attributes:
        reference: The destination, `oci://REGISTRY/REPOSITORY@sha256:HEX`.
        manifest_digest: The manifest digest (the same at both ends).
        blobs: Blobs copied (config and layers; those the destination held already count too).
        bytes: Bytes of those blobs.
        referrers: The destination's referrer digests of the evidence copied.
        tags: The tags set at the destination.
        skipped: Source referrers not copied, with the reason (not evidence, over the budget, unreadable).
        verified: Whether the model was verified under a policy before anything was written.
    """

    reference: str
    manifest_digest: str
    blobs: int
    bytes: int
    referrers: tuple[str, ...]
    tags: tuple[str, ...]
    skipped: tuple[str, ...] = field(default=())
    verified: bool = False


def _copy_blob(
    source: RegistryClient, src: OciReference, dest: RegistryClient, dst: OciReference, blob: tuple[str, int]
) -> None:
    digest, size = blob
    if dest.blob_exists(dst.repository, digest):
        return
    with tempfile.SpooledTemporaryFile(_SPOOL_BYTES) as spool:
        source.stream_blob(src.repository, digest, size, spool, what=f"{src.repository_uri}: blob {digest}")
        spool.seek(0)
        dest.put_blob(dst.repository, digest, size, spool)


def copy_model(
    source: str,
    destination: str,
    *,
    policy: Policy | ModelAdmission | None = None,
    source_options: RegistryOptions | None = None,
    destination_options: RegistryOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> CopyResult:
    """Copy a ModelPack artifact, its blobs and its evidence referrers from `source` to `destination`.

    See the module docstring for what is copied and checked. The destination holds the manifest only after
    every blob is there, and the referrers after the manifest (a reader never finds a manifest whose blobs
    are missing; an interrupted copy may leave evidence missing, which readers refuse: copy again).

    Args:
        source: `oci://REGISTRY/REPOSITORY(:TAG|@sha256:HEX)`.
        destination: `oci://REGISTRY/REPOSITORY[:TAG]` (a digest is refused: the manifest's own is kept).
        policy: Verify the model at the source first (as `pull_model`); None copies without verifying.
        source_options: Connection and credentials of the source (default: from the environment).
        destination_options: Those of the destination (default: `source_options`).
        progress: Called with one line per step (blob, referrer, tag), for the CLI's progress line.

    Returns:
        What was copied.

    Raises:
        MalformedArtifactError: A bad reference, a destination digest, or not a ModelPack manifest.
        DigestMismatchError: A manifest or blob differs from its digest.
        NotFoundError: No such manifest or blob at the source.
        BackendUnavailableError: A registry refused or could not be reached.
        SignatureError, AttestationError, FileSetMismatchError, PolicyViolationError: With `policy`, as
            `pull_model` (nothing was written).
    """
    src, dst = parse_reference(source), parse_reference(destination)
    if dst.digest:
        raise MalformedArtifactError(f"{destination}: copy to a repository or a tag; the digest is kept")
    say = progress or (lambda _line: None)
    source_options = source_options or RegistryOptions.from_env()
    destination_options = destination_options or source_options
    src_client = RegistryClient(src.registry, source_options)
    dst_client = RegistryClient(dst.registry, destination_options)
    try:
        data, media_type, digest = src_client.get_manifest(src.repository, src.ref)
        what = f"{src.repository_uri}@{digest}"
        if media_type and media_type != MANIFEST_MEDIA_TYPE:
            raise MalformedArtifactError(f"{what}: media type {media_type!r} is not an OCI image manifest")
        limits = ModelAdmission.of(policy).policy.limits if policy is not None else Limits()
        layers = _parse_model_manifest(data, what, limits.max_files)
        doc = json.loads(data)
        if policy is not None:
            with tempfile.TemporaryDirectory(prefix="modelsec-copy-") as scratch:
                pull_model(
                    f"{src.repository_uri}@{digest}", Path(scratch) / "model", policy, options=source_options
                )
            say(f"verified {what}")
        config = doc.get("config")
        if not isinstance(config, dict) or config.get("mediaType") != MODEL_CONFIG_MEDIA_TYPE:
            raise MalformedArtifactError(f"{what}: config is not a {MODEL_CONFIG_MEDIA_TYPE} descriptor")
        blobs = [(str(config.get("digest")), config.get("size")), *[(d, s) for _, d, s in layers]]
        total = 0
        for i, (blob_digest, size) in enumerate(blobs, 1):
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise MalformedArtifactError(f"{what}: blob {blob_digest} size {size!r} is not a byte count")
            _copy_blob(src_client, src, dst_client, dst, (blob_digest, size))
            total += size
            say(f"blob {i}/{len(blobs)} {blob_digest} ({size} bytes)")
        tags = [t for t in (dst.tag or src.tag,) if t]
        root = str(doc.get("annotations", {}).get(ROOT_DIGEST_ANNOTATION, "")).removeprefix("sha256:")
        if is_sha256_hex(root):
            tags.append(root_tag(root))
        dst_client.put_manifest(dst.repository, digest, data, MANIFEST_MEDIA_TYPE)
        for tag in tags:
            dst_client.put_manifest(dst.repository, tag, data, MANIFEST_MEDIA_TYPE)
        say(f"manifest {digest} tagged {', '.join(tags)}")
        budget = ReferrerBudget(max_bundle_bytes=limits.max_bundle_bytes)
        reads, not_evidence = read_evidence(src_client, src.repository, digest, budget)
        subject = descriptor(MANIFEST_MEDIA_TYPE, data)
        copied: list[str] = []
        skipped = [f"{not_evidence} referrers that are not evidence"] if not_evidence else []
        for i, read in enumerate(reads, 1):
            if read.note:
                skipped.append(f"{src.repository_uri}@{read.digest}: {read.note}")
                continue
            try:
                referrer, _ = attach_bundle(dst_client, dst.repository, subject, read.data)
            except MalformedArtifactError as e:
                skipped.append(f"{src.repository_uri}@{read.digest}: {e.diagnostics()}")
                continue
            copied.append(referrer)
            say(f"referrer {i}/{len(reads)} {read.digest} -> {referrer}")
    finally:
        src_client.close()
        dst_client.close()
    return CopyResult(
        f"{dst.repository_uri}@{digest}",
        digest,
        len(blobs),
        total,
        tuple(copied),
        tuple(tags),
        tuple(skipped),
        policy is not None,
    )
