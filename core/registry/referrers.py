"""Referrers: bundles attached to a manifest, and read back only if they are about it (OCI 1.1 `subject`).

The shapes `modelsec push` and the `oci://` store write and read; `_oci_registry` is the transport.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any

from modelsec.errors import MalformedArtifactError
from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    EMPTY_CONFIG,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    canonical_json,
    descriptor,
)

__all__ = ["attach_bundle", "read_referrer_bundle"]


def attach_bundle(
    client: RegistryClient, repository: str, subject: Mapping[str, Any], data: bytes, artifact_type: str
) -> tuple[str, bool]:
    """Attach a bundle to the manifest `subject` (a descriptor) as a referrer.

    Returns the referrer manifest's digest, and whether it was not listed yet.

    The referrer is an image manifest with `artifactType` (a sigstore bundle, or a modelsec binding), the
    empty config, the bundle as its one layer and `subject`: the shape cosign and oras give attached
    signatures, which a registry without OCI artifact manifests (distribution 2.8) accepts.

    Raises:
        BackendUnavailableError: The registry refused or could not be reached.
    """
    layer = descriptor(BUNDLE_ARTIFACT_TYPE, data)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": artifact_type,
        "config": EMPTY_CONFIG,
        "layers": [layer],
        "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
    }
    body = canonical_json(manifest)
    desc = descriptor(MANIFEST_MEDIA_TYPE, body, artifactType=artifact_type)
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
