"""The OCI binding predicate (`https://modelsec.dev/oci-binding/v2`): this OCI manifest carries this model.

`modelsec push` signs one binding per pushed manifest (DESIGN.md decision 15): the model root digest stays
the model's identity, and the binding is the signed evidence that this OCI manifest carries that model. Its
subject is the OCI manifest, as every statement about an image is (in-toto Statement v1; cosign
`verify-attestation`, sigstore policy-controller and Kyverno look attestations up by the artifact's
digest), and its predicate names the model:

```json
{"_type": "https://in-toto.io/Statement/v1",
 "subject": [{"name": "registry.example/models/llm", "digest": {"sha256": "<OCI manifest digest, hex>"}}],
 "predicateType": "https://modelsec.dev/oci-binding/v2",
 "predicate": {"model": {"name": "<model dir name>", "digest": {"sha256": "<model root digest, hex>"}},
               "mediaType": "application/vnd.oci.image.manifest.v1+json",
               "artifactType": "application/vnd.cncf.model.manifest.v1+json"}}
```

The subject's `name` (the repository it was pushed to) and the model's `name` are informational and never
compared: a copy to another registry keeps the manifest digest, so the binding stays valid there.
`parse_binding_statement` checks the shape only (exactly one subject, with a SHA-256 digest; a model with a
SHA-256 root digest); the reader (`modelsec.distribution.push_pull`) checks the signature (a `weights` key)
and that the subject is the manifest the binding was found under.

**Deprecated form** (`https://modelsec.dev/oci-artifact/v1`, written before this version): subject = the
model root digest, `predicate.manifestDigest` = `sha256:<hex>` of the manifest. It is still read, so that
models pushed before keep pulling, and every reader reports it as deprecated (push again to replace it);
it is never written. No tool but modelsec can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits

__all__ = [
    "LEGACY_OCI_BINDING_PREDICATE_TYPE",
    "OCI_BINDING_PREDICATE_TYPE",
    "OciBinding",
    "binding_statement",
    "is_binding_type",
    "parse_binding_statement",
]

OCI_BINDING_PREDICATE_TYPE = "https://modelsec.dev/oci-binding/v2"
LEGACY_OCI_BINDING_PREDICATE_TYPE = "https://modelsec.dev/oci-artifact/v1"
_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


def is_binding_type(predicate_type: str) -> bool:
    """Whether `predicate_type` is a binding, current or deprecated (neither is evidence about a model)."""
    return predicate_type in (OCI_BINDING_PREDICATE_TYPE, LEGACY_OCI_BINDING_PREDICATE_TYPE)


@dataclass(frozen=True, slots=True)
class OciBinding:
    """A parsed binding (its signature is not checked here).

    Attributes:
        manifest_digest: The OCI manifest it binds, `sha256:<hex>`.
        root_digest: The model root digest it names (hex SHA-256).
        deprecated: Read from the deprecated v1 form (subject = root digest).
    """

    manifest_digest: str
    root_digest: str
    deprecated: bool = False


def binding_statement(
    repository: str, manifest_digest: str, root_digest: str, *, model_name: str, artifact_type: str
) -> Statement:
    """The unsigned binding statement of a manifest (see the module docstring for its shape).

    Args:
        repository: Where the manifest is pushed (`REGISTRY/REPOSITORY`; informational).
        manifest_digest: The OCI manifest digest, `sha256:<hex>`.
        root_digest: The model root digest (hex SHA-256).
        model_name: The model directory's name (informational).
        artifact_type: The manifest's `artifactType`.

    Raises:
        MalformedArtifactError: A digest is not SHA-256.
    """
    hex_ = manifest_digest.removeprefix("sha256:")
    if not manifest_digest.startswith("sha256:") or not is_sha256_hex(hex_) or not is_sha256_hex(root_digest):
        raise MalformedArtifactError(
            f"binding of {manifest_digest!r} to {root_digest!r}: not SHA-256 digests"
        )
    return Statement(
        (Subject(repository, {"sha256": hex_}),),
        OCI_BINDING_PREDICATE_TYPE,
        {
            "model": {"name": model_name, "digest": {"sha256": root_digest}},
            "mediaType": _MEDIA_TYPE,
            "artifactType": artifact_type,
        },
    )


def _sha256(value: object) -> str | None:
    return value["sha256"] if isinstance(value, Mapping) and is_sha256_hex(value.get("sha256")) else None


def parse_binding_statement(statement: Statement, *, what: str, limits: Limits | None = None) -> OciBinding:
    """The manifest and model digests of a binding, current or deprecated (strict; nothing verified).

    Args:
        statement: A parsed statement whose predicate type `is_binding_type`.
        what: Names the bundle in errors.
        limits: Unused (the `PredicateParser` signature).

    Returns:
        The binding, `deprecated` when read from the v1 form.

    Raises:
        MalformedArtifactError: Not exactly one subject with a SHA-256 digest, no SHA-256 model digest in
            the predicate, or (v1) no `sha256:<hex>` `manifestDigest`; another predicate type.
    """
    del limits
    if len(statement.subjects) != 1:
        raise MalformedArtifactError(f"{what}: a binding has exactly one subject")
    subject = _sha256(statement.subjects[0].digest)
    if subject is None:
        raise MalformedArtifactError(f"{what}: binding subject has no SHA-256 digest")
    predicate: Mapping[str, Any] = statement.predicate
    if statement.predicate_type == OCI_BINDING_PREDICATE_TYPE:
        model = predicate.get("model")
        root = _sha256(model.get("digest")) if isinstance(model, Mapping) else None
        if root is None:
            raise MalformedArtifactError(f"{what}: binding predicate.model.digest has no SHA-256 digest")
        return OciBinding(f"sha256:{subject}", root)
    if statement.predicate_type == LEGACY_OCI_BINDING_PREDICATE_TYPE:
        named = predicate.get("manifestDigest")
        if not isinstance(named, str) or not named.startswith("sha256:") or not is_sha256_hex(named[7:]):
            raise MalformedArtifactError(f"{what}: binding predicate.manifestDigest is not sha256:<hex>")
        return OciBinding(named, subject, deprecated=True)
    raise MalformedArtifactError(f"{what}: predicateType {statement.predicate_type!r} is not a binding")
