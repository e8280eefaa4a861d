"""Referrers: bundles attached to a manifest, and read back only if they are about it (OCI 1.1 `subject`).

The shapes `modelsec push` and the `oci://` store write and read; `modelsec.registry.client` is the
transport. `read_evidence` is the one reader of a manifest's evidence (the `oci://` store, `pull` and the
webhook's binding lookup), and it holds DESIGN.md decision 13 for registries: whoever can push to the
repository can attach referrers, so referrers never veto. What is not evidence (another `artifactType` or
media type, a repeated descriptor) is skipped before anything is counted or fetched; the work on the rest
is bounded (`ReferrerBudget`: referrers read, bytes, seconds; one listing page of at most 4 MiB), and a
referrer over the budget is left unread and reported, never an error: the verdict is the verifier's, on
what was read.

Writing follows sigstore's OCI bundle layout (cosign `specs/BUNDLE_SPEC.md`; `attach_bundle`), so cosign,
oras, sigstore-go and GitHub's tools find and label modelsec's bundles; reading accepts that layout and the
referrers earlier releases wrote (bindings under their own `artifactType`, no annotations). Annotations are
labels: nothing is selected or trusted by them.

Inside `listing_once()` (the webhook opens one per decision), each manifest's referrers are listed once:
the binding lookup (`modelsec.distribution.push_pull.bound_root_digests`) and the `oci://` store read the
same listing, so they decide on one view of the registry, and the registry is asked once. A manifest read
started early in the block (`prefetch_manifest`, on the kept-alive connections, while the decision's other
request is in flight) is answered to the block's next `manifest_in_block` of it; nothing is kept past
the block.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import contextlib
import contextvars
import hmac
import json
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from modelsec.errors import DigestMismatchError, MalformedArtifactError, NotFoundError
from modelsec.registry.client import (
    BINDING_ARTIFACT_TYPE,
    BUNDLE_ARTIFACT_TYPE,
    EMPTY_CONFIG,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    canonical_json,
    descriptor,
)

__all__ = [
    "CONTENT_ANNOTATION",
    "EVIDENCE_ARTIFACT_TYPES",
    "PREDICATE_TYPE_ANNOTATION",
    "TITLE_ANNOTATION",
    "ReferrerBudget",
    "ReferrerRead",
    "attach_bundle",
    "evidence_descriptors",
    "listing_once",
    "manifest_in_block",
    "prefetch_manifest",
    "read_evidence",
    "read_referrer_bundle",
    "sigstore_annotations",
]

# The referrers that can be evidence: sigstore bundles (signatures, attestations, bindings), and bindings
# attached by earlier releases under their own artifactType (read, never written).
EVIDENCE_ARTIFACT_TYPES = frozenset({BUNDLE_ARTIFACT_TYPE, BINDING_ARTIFACT_TYPE})


@dataclass(frozen=True, slots=True)
class ReferrerBudget:
    """The most work reading one manifest's evidence may cost (the rest is listed unread, never refused).

    Attributes:
        max_referrers: Evidence referrers read (each costs a manifest and a blob request).
        max_bundle_bytes: Bytes of one bundle (a larger one is not evidence).
        max_total_bytes: Bundle bytes read in all.
        max_seconds: Seconds spent reading, from the listing on (each request also has its own timeout).
    """

    max_referrers: int = 256
    max_bundle_bytes: int = 16 * 2**20
    max_total_bytes: int = 64 * 2**20
    max_seconds: float = 20.0


@dataclass(frozen=True, slots=True)
class ReferrerRead:
    """One evidence referrer of a manifest: its bundle, or why it was not read (untrusted either way).

    Attributes:
        digest: The referrer manifest's digest (`sha256:<hex>`).
        artifact_type: Its `artifactType` as listed.
        data: The bundle bytes, checked against their digest; empty when `note` is set.
        note: Why the bundle was not read (over the budget, not a one-layer referrer of this subject, a
            digest mismatch, gone); empty when it was.
    """

    digest: str
    artifact_type: str
    data: bytes
    note: str = ""


# The listings read in the current `listing_once` block, by (client, repository, subject); the client is
# kept in the value so that its id is not reused within the block.
_LISTINGS: contextvars.ContextVar[
    dict[tuple[int, str, str], tuple[RegistryClient, list[dict[str, Any]]]] | None
] = contextvars.ContextVar("modelsec_referrer_listings", default=None)


# Manifest reads started in the current `listing_once` block and not yet taken, by (client, repository, ref).
_ManifestRead = concurrent.futures.Future[tuple[bytes, str, str]]
_PREFETCHED: contextvars.ContextVar[
    dict[tuple[int, str, str], tuple[RegistryClient, _ManifestRead]] | None
] = contextvars.ContextVar("modelsec_prefetched_manifests", default=None)
_PREFETCH_THREADS = 8  # reads in flight at once (a webhook decides on a few threads, one read each)
_prefetch_pool: concurrent.futures.ThreadPoolExecutor | None = None
_prefetch_lock = threading.Lock()


def prefetch_manifest(client: RegistryClient, repository: str, ref: str) -> None:
    """Start `client.get_manifest(repository, ref)` now, for `manifest_in_block` later in this block.

    Outside a `listing_once` block, nothing is done. The answer is the registry's at the time of the
    read, within the block (one decision): it is never kept for another block, so it is as fresh as a read
    made when it is needed. One that is not taken is dropped.
    """
    global _prefetch_pool
    started = _PREFETCHED.get()
    key = (id(client), repository, ref)
    if started is None or key in started:
        return
    with _prefetch_lock:
        if _prefetch_pool is None:
            _prefetch_pool = concurrent.futures.ThreadPoolExecutor(
                _PREFETCH_THREADS, thread_name_prefix="modelsec-registry-prefetch"
            )
        pool = _prefetch_pool
    started[key] = (client, pool.submit(client.get_manifest, repository, ref))


def manifest_in_block(client: RegistryClient, repository: str, ref: str) -> tuple[bytes, str, str]:
    """`client.get_manifest(repository, ref)`, answered by this block's `prefetch_manifest` of it if any.

    A prefetched read is taken once (a second call reads again) and raises what the read raised.

    Raises:
        NotFoundError, DigestMismatchError, MalformedArtifactError, BackendUnavailableError: As
            `RegistryClient.get_manifest`.
    """
    started = _PREFETCHED.get()
    entry = started.pop((id(client), repository, ref), None) if started is not None else None
    if entry is None:
        return client.get_manifest(repository, ref)
    return entry[1].result()


@contextlib.contextmanager
def listing_once() -> Iterator[None]:
    """Within the block, list each manifest's referrers at most once per client (this thread or task).

    For one decision that reads a manifest's evidence more than once (its binding, then its bundles): the
    readers see one listing and the registry is asked once. The listing is the registry's answer at the
    first read, so the block must be short (one decision); outside any block every read lists again. A
    block inside another one shares the outer one's listings. Failures are not kept (a later read asks
    again).
    """
    if _LISTINGS.get() is not None:
        yield
        return
    token, prefetched = _LISTINGS.set({}), _PREFETCHED.set({})
    try:
        yield
    finally:
        _PREFETCHED.reset(prefetched)
        _LISTINGS.reset(token)


def _listing(client: RegistryClient, repository: str, subject: str) -> list[dict[str, Any]]:
    """`client.referrers(repository, subject)`, once per `listing_once` block."""
    listings = _LISTINGS.get()
    if listings is None:
        return client.referrers(repository, subject)
    key = (id(client), repository, subject)
    if key not in listings:
        listings[key] = (client, client.referrers(repository, subject))
    return listings[key][1]


def evidence_descriptors(
    client: RegistryClient,
    repository: str,
    subject: str,
    artifact_types: Collection[str] = EVIDENCE_ARTIFACT_TYPES,
) -> tuple[list[Mapping[str, Any]], int]:
    """The listed referrers of `subject` that can be evidence, in listing order, and how many were not.

    A descriptor is kept when it is an image manifest whose `artifactType` is one of `artifact_types`, the
    first time its digest is listed. The listing is the registry's (untrusted): the fallback index keeps
    the order pushers appended in, so the evidence `modelsec push` attached comes before what is added
    later.

    Inside a `listing_once` block the registry is asked once per manifest.

    Raises:
        MalformedArtifactError: The listing is not an image index of sha256 descriptors.
        BackendUnavailableError: See `RegistryClient.request`.
    """
    kept: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    listed = _listing(client, repository, subject)
    for desc in listed:
        digest = desc["digest"]
        if (
            desc.get("mediaType", MANIFEST_MEDIA_TYPE) != MANIFEST_MEDIA_TYPE
            or desc.get("artifactType") not in artifact_types
            or digest in seen
        ):
            continue
        seen.add(digest)
        kept.append(desc)
    return kept, len(listed) - len(kept)


def read_evidence(
    client: RegistryClient,
    repository: str,
    subject: str,
    budget: ReferrerBudget,
    *,
    artifact_types: Collection[str] = EVIDENCE_ARTIFACT_TYPES,
    cache: MutableMapping[tuple[str, str], bytes] | None = None,
    cache_bundle_bytes: int = 64 * 2**10,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[ReferrerRead], int]:
    """Read the evidence attached to `subject` within `budget` (see the module docstring).

    Each descriptor `evidence_descriptors` keeps is read with `read_referrer_bundle` while the budget lasts;
    one that cannot be read as a bundle about `subject`, and every one past the budget, is returned with
    a `note` instead of data. Reads from `cache` (content-addressed: referrer and subject digests) count
    against the budget as network reads do, so the result does not depend on what is cached.

    Args:
        client: The registry.
        repository: The repository holding `subject`.
        subject: The manifest digest the evidence is about (`sha256:<hex>`).
        budget: The most work to do.
        artifact_types: Which `artifactType`s are evidence for the caller.
        cache: Bundles already read, by (referrer digest, subject); filled with what is read.
        cache_bundle_bytes: Larger bundles are not put in `cache` (its caller bounds its entries).
        clock: Monotonic seconds (tests inject one).

    Returns:
        One `ReferrerRead` per evidence descriptor, in listing order, and the number of listed referrers
        that were not evidence (skipped unread).

    Raises:
        MalformedArtifactError: The listing is not an image index of sha256 descriptors.
        BackendUnavailableError: The registry cannot be reached or refuses the credentials.
    """
    started = clock()
    listed, skipped = evidence_descriptors(client, repository, subject, artifact_types)
    out: list[ReferrerRead] = []
    count, total = 0, 0
    for desc in listed:
        digest, artifact_type = str(desc["digest"]), str(desc.get("artifactType"))
        over = (
            f"{budget.max_referrers} referrers"
            if count >= budget.max_referrers
            else f"{budget.max_total_bytes} bytes"
            if total >= budget.max_total_bytes
            else f"{budget.max_seconds:g} s"
            if clock() - started > budget.max_seconds
            else ""
        )
        if over:
            out.append(ReferrerRead(digest, artifact_type, b"", f"not read: over the budget of {over}"))
            continue
        count += 1
        key = (digest, subject)
        data = cache.get(key) if cache is not None else None
        if data is None:
            limit = min(budget.max_bundle_bytes, budget.max_total_bytes - total)
            try:
                data = read_referrer_bundle(client, repository, desc, subject, limit)
            except (MalformedArtifactError, DigestMismatchError, NotFoundError) as e:
                out.append(ReferrerRead(digest, artifact_type, b"", e.diagnostics()))
                continue
            if cache is not None and len(data) <= cache_bundle_bytes:
                cache[key] = data
        if len(data) > budget.max_total_bytes - total:  # a cached bundle larger than what is left
            note = f"not read: over the budget of {budget.max_total_bytes} bytes"
            out.append(ReferrerRead(digest, artifact_type, b"", note))
            continue
        total += len(data)
        out.append(ReferrerRead(digest, artifact_type, data))
    return out, skipped


# sigstore's OCI bundle layout (cosign specs/BUNDLE_SPEC.md, "Annotations"): what a bundle holds, as labels.
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
PREDICATE_TYPE_ANNOTATION = "dev.sigstore.bundle.predicateType"
TITLE_ANNOTATION = "org.opencontainers.image.title"


def sigstore_annotations(data: bytes) -> dict[str, str]:
    """The manifest annotations sigstore's OCI bundle layout gives a bundle (labels; nothing is verified).

    `dev.sigstore.bundle.content` is `dsse-envelope` or `message-signature`, from the bundle's content;
    `dev.sigstore.bundle.predicateType` is the in-toto statement's `predicateType` when the DSSE payload
    is one (read unverified: readers never select evidence by annotation). `org.opencontainers.image.created`
    is left out, so that attaching the same bundle twice gives the same referrer digest.

    Raises:
        MalformedArtifactError: `data` is not a JSON object with `dsseEnvelope` or `messageSignature`.
    """
    try:
        doc = json.loads(data)
    except ValueError:
        raise MalformedArtifactError("bundle: not JSON") from None
    if isinstance(doc, dict) and isinstance(doc.get("messageSignature"), dict):
        return {CONTENT_ANNOTATION: "message-signature"}
    envelope = doc.get("dsseEnvelope") if isinstance(doc, dict) else None
    if not isinstance(envelope, dict):
        raise MalformedArtifactError("bundle: neither a dsseEnvelope nor a messageSignature")
    out = {CONTENT_ANNOTATION: "dsse-envelope"}
    try:
        statement = json.loads(base64.b64decode(str(envelope.get("payload", "")), validate=True))
    except (ValueError, binascii.Error):
        return out
    if isinstance(statement, dict) and isinstance(statement.get("predicateType"), str):
        out[PREDICATE_TYPE_ANNOTATION] = statement["predicateType"]
    return out


def attach_bundle(
    client: RegistryClient,
    repository: str,
    subject: Mapping[str, Any],
    data: bytes,
    artifact_type: str = BUNDLE_ARTIFACT_TYPE,
    *,
    layer_media_type: str = BUNDLE_ARTIFACT_TYPE,
) -> tuple[str, bool]:
    """Attach a bundle to the manifest `subject` (a descriptor) as a referrer, in sigstore's OCI layout.

    Returns the referrer manifest's digest, and whether it was not listed yet.

    The referrer is the manifest of sigstore's OCI bundle layout (cosign `specs/BUNDLE_SPEC.md`, which
    cosign `--new-bundle-format`, sigstore-go and GitHub's attest action write): `artifactType`
    `application/vnd.dev.sigstore.bundle.v0.3+json`, the empty config, the bundle as its one layer of that
    media type titled `sha256-<hex>.sigstore.json`, the annotations of `sigstore_annotations`, and
    `subject`. The fallback index entry carries the same annotations, as the specification asks of
    clients that maintain it. A registry without OCI artifact manifests (distribution 2.8) accepts it.

    Args:
        client: The registry.
        repository: Where `subject` is.
        subject: The manifest descriptor (`mediaType`, `digest`, `size`).
        data: The sigstore bundle's JSON bytes.
        artifact_type: Another type than a sigstore bundle gets neither the sigstore annotations nor the
            layer title: tests that recreate referrers of earlier releases, and load receipts
            (`modelsec.verifier.stores.oci.OciReceiptStore`).
        layer_media_type: The one layer's media type (a load receipt's own, for a receipt).

    Raises:
        MalformedArtifactError: `data` is not a sigstore bundle (see `sigstore_annotations`).
        BackendUnavailableError: The registry refused or could not be reached.
    """
    sigstore = artifact_type == BUNDLE_ARTIFACT_TYPE
    annotations = sigstore_annotations(data) if sigstore else {}
    layer = descriptor(layer_media_type, data)
    if sigstore:
        layer["annotations"] = {TITLE_ANNOTATION: str(layer["digest"]).replace(":", "-") + ".sigstore.json"}
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": artifact_type,
        "config": EMPTY_CONFIG,
        "layers": [layer],
        "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
        **({"annotations": annotations} if annotations else {}),
    }
    body = canonical_json(manifest)
    extra: dict[str, Any] = {"artifactType": artifact_type}
    if annotations:
        extra["annotations"] = annotations
    desc = descriptor(MANIFEST_MEDIA_TYPE, body, **extra)
    listed = any(
        d.get("digest") == desc["digest"] for d in client.referrers(repository, str(subject["digest"]))
    )
    client.put_blob(repository, str(EMPTY_CONFIG["digest"]), 2, b"{}")
    client.put_blob(repository, layer["digest"], len(data), data)
    client.push_referrer(repository, body, desc, str(subject["digest"]))
    return str(desc["digest"]), not listed


def read_referrer_bundle(
    client: RegistryClient, repository: str, desc: Mapping[str, Any], subject: str, max_bytes: int
) -> bytes:
    """The bundle a referrer descriptor points at, after checking that the referrer is about `subject`.

    A listing is untrusted: the referrer manifest is fetched by its digest, its own `subject` must be
    `subject` (a referrer of another manifest copied into this listing is refused), and its one layer is
    fetched by digest within `max_bytes`. The bundle's signature is not checked here.

    Raises:
        MalformedArtifactError: Not a one-layer manifest with a subject, another subject, or too large.
        DigestMismatchError: A manifest or blob hashes otherwise than its descriptor says.
        NotFoundError, BackendUnavailableError: See `RegistryClient.get_manifest`.
    """
    digest = str(desc.get("digest", ""))
    what = f"oci://{client.registry}/{repository}@{digest}"
    data, _, _ = client.get_manifest(repository, digest)
    try:
        doc = json.loads(data)
        layers = doc["layers"]
        their_subject = doc["subject"]["digest"]
        (layer,) = layers
        layer_digest, size = layer["digest"], layer["size"]
    except (ValueError, KeyError, TypeError):
        raise MalformedArtifactError(
            f"{what}: not a referrer manifest with one layer and a subject"
        ) from None
    if not isinstance(their_subject, str) or not hmac.compare_digest(
        their_subject.encode(), subject.encode()
    ):
        raise MalformedArtifactError(f"{what}: refers to {their_subject!r}, not {subject}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= max_bytes:
        raise MalformedArtifactError(f"{what}: bundle layer size {size!r} is not within {max_bytes} bytes")
    return client.get_blob(repository, str(layer_digest), max_bytes, what=what)
