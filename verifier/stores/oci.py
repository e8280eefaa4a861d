"""The registry store: bundles attached as OCI referrers of a model's manifest (DESIGN.md decisions 14-15).

`oci://REGISTRY/REPOSITORY` finds the manifest of a model root digest by the tag `oms-sha256-<digest>`
that `modelsec push` sets; `oci://REGISTRY/REPOSITORY@sha256:HEX` reads the referrers of that one manifest.
Bundles are the referrers whose `artifactType` is a sigstore bundle, each fetched by digest and kept only if
its own `subject` is the manifest (a listing is untrusted); the signed manifest bindings that `push` also
attaches (sigstore bundles too, in sigstore's OCI bundle layout; see
`modelsec.attestations.predicates.oci_binding`) are not evidence about the model and are left out. Nothing
is trusted here: readers verify every bundle, and a moved tag can hide evidence (as deleting it would) but
never forge it.

Writes (`put`, from `modelsec attest put|push oci://...`) attach a bundle to the manifest tagged for its
subject's root digest (the model must be pushed first); `delete` (and `supersede`, the same here: a
registry keeps no history this store reads) drops a bundle's referrers from the fallback listing and
deletes their manifests, with the registry's credentials as the access control.

Credentials and TLS: `RegistryOptions.from_env` (`$MODELSEC_OCI_USERNAME`, `_PASSWORD`, `_CA`, a Docker
`config.json` under `$DOCKER_CONFIG`). The store reads through the process's shared client for its registry
and options (`modelsec.registry.client.shared_client`): connections and tokens are kept between reads,
and referrer manifests and bundles, fetched by digest, are read once (tags and listings every time).
Inside a decision (`modelsec.registry.referrers.listing_once`), the root tag of the model that a manifest's
tag named last is read while that manifest's referrers are listed (`prefetch_manifest`): both requests are
in flight at once, and the tag's answer serves that decision only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.predicates.oci_binding import is_binding_type
from modelsec.attestations.statement import is_sha256_hex, parse_statement
from modelsec.errors import (
    AttestationError,
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    NotFoundError,
    PolicyError,
)
from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    OciReference,
    RegistryOptions,
    parse_reference,
    root_tag,
    shared_client,
)
from modelsec.registry.referrers import (
    ReferrerBudget,
    attach_bundle,
    manifest_in_block,
    prefetch_manifest,
    read_evidence,
)
from modelsec.verifier.stores import StoredBundle, StoreOptions
from modelsec.verifier.stores.directory import subject_root_digest
from modelsec.verifier.stores.receipts import MAX_DOCUMENT_BYTES, MAX_RECEIPTS, RECEIPT_MEDIA_TYPE

if TYPE_CHECKING:
    from modelsec.attestations.predicates.load_receipt import LoadReceipt
    from modelsec.attestations.predicates.load_snapshot import LoadSnapshot

__all__ = ["OciAttestationStore", "OciReceiptStore", "open_store"]


# Whether a bundle is a binding, by the bundle's SHA-256 (a function of its bytes, so never stale): every
# uncached admission reads the same referrers again, and need not parse them again to sort them.
_BINDING_KIND: dict[str, bool] = {}
_MAX_BINDING_KINDS = 4096
_MAX_GUESSES = 4096  # manifests whose last root tag is remembered, per store


def _is_binding(bundle_id: str, data: bytes) -> bool:
    """Whether `data` (whose SHA-256 is `bundle_id`) is a binding statement's bundle (unverified)."""
    known = _BINDING_KIND.get(bundle_id)
    if known is None:
        try:
            payload = parse_bundle(data, source="referrer").envelope.payload
            known = is_binding_type(parse_statement(payload, what="referrer").predicate_type)
        except Error:
            known = False
        if len(_BINDING_KIND) >= _MAX_BINDING_KINDS:
            _BINDING_KIND.clear()
        _BINDING_KIND[bundle_id] = known
    return known


@dataclass(slots=True)
class OciAttestationStore:
    """Bundles as referrers in one registry repository (see the module docstring).

    Attributes:
        reference: The repository, optionally pinned to one manifest digest.
        max_bundle_bytes: Bytes read per bundle at most.
        max_bundles: Most bundle referrers read for one manifest (more are listed unread, with a note).
    """

    reference: OciReference
    max_bundle_bytes: int = 16 * 2**20
    max_bundles: int = 256
    options: RegistryOptions = field(default_factory=RegistryOptions)
    _client: Any = field(default=None, repr=False)
    # Manifest digest -> the model root digest whose root tag named it last: which root tag to read early
    # (`prefetch_manifest`) in a decision about that manifest. Never an answer, only a choice of what to read.
    _bound_last: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def open(
        cls,
        target: str,
        *,
        max_bundle_bytes: int,
        max_bundles: int,
        options: RegistryOptions | None = None,
    ) -> OciAttestationStore:
        """The store `oci://<target>` names (no request is made yet).

        `options` (CA, credentials, timeout) default to `RegistryOptions.from_env()`.

        Raises:
            MalformedArtifactError: Not `REGISTRY/REPOSITORY[@sha256:HEX]` (a tag is refused).
            BackendUnavailableError: The oci extra (requests) is not installed.
        """
        reference = parse_reference(target)
        if reference.tag:
            raise MalformedArtifactError(
                f"oci://{target}: an attestation store names a repository, not a tag"
            )
        options = options or RegistryOptions.from_env()
        return cls(
            reference, max_bundle_bytes, max_bundles, options, shared_client(reference.registry, options)
        )

    @property
    def uri(self) -> str:
        """`oci://REGISTRY/REPOSITORY[@sha256:HEX]`."""
        return str(self.reference)

    def check(self) -> None:
        """Raise `BackendUnavailableError` unless the registry answers `/v2/` with these credentials."""
        self._client.check()

    def close(self) -> None:
        """Nothing to release: the client is the process's shared one (`shared_client`)."""

    def _manifest(self, digest: str) -> dict[str, Any] | None:
        """The descriptor of the manifest whose referrers hold `digest`'s bundles (None: no such model)."""
        repository = self.reference.repository
        if self.reference.digest is None and self._client.known_manifest(repository, f"sha256:{digest}"):
            # An OCI manifest's digest (a model image named by digest, before its binding is read) is not a
            # model root digest, so no root tag names it: the lookup is skipped, its answer known. The
            # model it was last bound to will most likely be asked for next in this decision, once its
            # binding is read: its root tag is read meanwhile (a guess that only chooses what to read).
            guess = self._bound_last.get(digest)
            if guess is not None:
                prefetch_manifest(self._client, repository, root_tag(guess))
            return None
        try:
            data, media_type, manifest_digest = manifest_in_block(
                self._client, repository, self.reference.digest or root_tag(digest)
            )
        except NotFoundError:
            return None
        if self.reference.digest is None:
            if len(self._bound_last) >= _MAX_GUESSES:
                self._bound_last.clear()
            self._bound_last[manifest_digest.removeprefix("sha256:")] = digest
        return {"mediaType": media_type, "digest": manifest_digest, "size": len(data)}

    def revision(self, digest: str) -> None:
        """None: a registry offers no cheap change token for a listing.

        Readers that need one keep the answer for a bounded time instead (the webhook's `EvidenceCache`).
        """
        return None

    def bundles(self, digest: str) -> list[bytes]:
        """The bundles attached to the model's manifest (untrusted; see `entries` for the errors)."""
        return [e.data for e in self.entries(digest) if not e.note]

    def entries(self, digest: str) -> list[StoredBundle]:
        """Every sigstore-bundle referrer of the model's manifest, with its referrer digest as source.

        Raises:
            MalformedArtifactError: `digest` is not hex SHA-256, or the listing is malformed (more than
                `max_bundles` bundles is no error: the rest are listed unread, with a note).
            BackendUnavailableError: The registry cannot be reached or refuses the credentials.
        """
        return [entry for _, entry in self._referrers(digest)[1]]

    def _referrers(self, digest: str) -> tuple[str, list[tuple[str, StoredBundle]]]:
        """The model's manifest digest ("" when none) and its bundles with their referrer digests.

        Read by `modelsec.registry.referrers.read_evidence`: referrers that are not sigstore bundles are
        skipped before counting, and those past the budget (`max_bundles` referrers, 64 MiB, 20 s) are
        returned unread with a note, never as an error: a writer of the repository cannot veto a model.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        manifest = self._manifest(digest)
        if manifest is None:
            return "", []
        budget = ReferrerBudget(max_referrers=self.max_bundles, max_bundle_bytes=self.max_bundle_bytes)
        reads, _ = read_evidence(
            self._client,
            self.reference.repository,
            manifest["digest"],
            budget,
            artifact_types=(BUNDLE_ARTIFACT_TYPE,),
        )
        out = []
        for read in reads:
            source = f"{self.reference.repository_uri}@{read.digest}"
            if read.note:
                if read.note.startswith("not read:"):  # over the budget: listed, for the verifier's record
                    entry = StoredBundle(read.digest.removeprefix("sha256:"), digest, b"", source, read.note)
                    out.append((read.digest, entry))
                continue  # a listing entry that is not a bundle about this manifest is not evidence
            bundle_id = hashlib.sha256(read.data).hexdigest()
            if not _is_binding(bundle_id, read.data):
                out.append((read.digest, StoredBundle(bundle_id, digest, read.data, source)))
        return str(manifest["digest"]), out

    def get(self, digest: str, bundle_id: str) -> StoredBundle:
        """One bundle by its SHA-256 (hex).

        Raises:
            NotFoundError: No such bundle.
            BackendUnavailableError: The registry cannot be read.
        """
        for entry in self.entries(digest) if is_sha256_hex(digest) else []:
            if entry.id == bundle_id:
                return entry
        raise NotFoundError(f"{self.uri}: no bundle {bundle_id!r} for {digest!r}")

    def put(self, data: bytes) -> tuple[StoredBundle, bool]:
        """Attach a bundle to the manifest of its subject's model as a referrer.

        Raises:
            MalformedArtifactError: Too large, not a bundle, or no sha256 subject.
            AttestationError: No manifest of that model in the repository (push the model first).
            BackendUnavailableError: The registry cannot be reached or refuses the write.
        """
        digest = subject_root_digest(data, self.max_bundle_bytes)
        manifest = self._manifest(digest)
        if manifest is None:
            raise AttestationError(f"{self.uri}: no model with root digest {digest} (push the model first)")
        referrer, created = attach_bundle(
            self._client, self.reference.repository, manifest, data, BUNDLE_ARTIFACT_TYPE
        )
        source = f"{self.reference.repository_uri}@{referrer}"
        return StoredBundle(hashlib.sha256(data).hexdigest(), digest, data, source), created

    def delete(self, digest: str, bundle_id: str) -> None:
        """Withdraw every referrer of the model's manifest that carries bundle `bundle_id`.

        Each is dropped from the fallback listing and its manifest deleted (an authorised operation: the
        registry's credentials). The binding `push` attached is never a candidate (it is not listed as a
        bundle). Done only when a fresh listing no longer holds the bundle.

        Raises:
            NotFoundError: No such bundle about `digest`.
            BackendUnavailableError: The registry cannot be reached, refuses the write, or still lists the
                bundle afterwards (deletion disabled on a registry with the referrers API).
        """
        manifest, listed = self._referrers(digest) if is_sha256_hex(digest) else ("", [])
        matching = [referrer for referrer, entry in listed if entry.id == bundle_id]
        if not matching:
            raise NotFoundError(f"{self.uri}: no bundle {bundle_id!r} for {digest!r}")
        for referrer in matching:
            self._client.delete_referrer(self.reference.repository, referrer, manifest)
        if any(entry.id == bundle_id for entry in self.entries(digest)):
            raise BackendUnavailableError(
                f"{self.uri}: the registry still lists bundle {bundle_id} after its deletion"
            )

    def supersede(self, digest: str, bundle_id: str) -> None:
        """`delete`: a registry keeps no history this store reads (same errors)."""
        self.delete(digest, bundle_id)


def open_store(target: str, options: StoreOptions) -> OciAttestationStore:
    """`open_store`'s opener for `oci://` (see `OciAttestationStore.open` for the errors)."""
    return OciAttestationStore.open(
        target,
        max_bundle_bytes=options.limits.max_bundle_bytes,
        max_bundles=options.max_bundles,
        options=options.registry,
    )


@dataclass(slots=True)
class OciReceiptStore:
    """Load receipts as referrers of the model's manifest (`loadReceipt.store: oci://REGISTRY/REPOSITORY`).

    A receipt is attached to the manifest tagged `oms-sha256-<root digest>` (`modelsec push`), with
    `artifactType` and layer media type `application/vnd.modelsec.load-receipt.v1+json`: readers of
    sigstore-bundle evidence (`OciAttestationStore`) never see it, and `receipts list` reads only these. The
    registry's credentials are the access control; nothing read is trusted (`modelsec.verifier.receipts`
    verifies every receipt). A snapshot is about no model, so this store keeps none (use a directory).
    """

    models: OciAttestationStore

    @classmethod
    def open(cls, target: str, options: RegistryOptions | None = None) -> OciReceiptStore:
        """The store `target` (`oci://REGISTRY/REPOSITORY`) names; credentials from the environment.

        Raises:
            PolicyError: Not `oci://REGISTRY/REPOSITORY` (a tag or digest is refused).
        """
        try:
            reference = parse_reference(target.removeprefix("oci://"))
        except MalformedArtifactError as e:
            raise PolicyError(f"loadReceipt.store: {e.diagnostics()}") from e
        if reference.tag or reference.digest:
            raise PolicyError(f"loadReceipt.store: {target} must name a repository, not a tag or digest")
        return cls(
            OciAttestationStore.open(
                target.removeprefix("oci://"),
                max_bundle_bytes=MAX_DOCUMENT_BYTES,
                max_bundles=MAX_RECEIPTS,
                options=options,
            )
        )

    @property
    def uri(self) -> str:
        """`oci://REGISTRY/REPOSITORY`."""
        return self.models.uri

    def put_receipt(self, document: bytes, receipt: LoadReceipt) -> str:
        """Attach the receipt to the model's manifest; returns `oci://...@<referrer digest>`.

        Raises:
            BackendUnavailableError: No manifest of that model in the repository (push the model first), or
                the registry cannot be reached or refuses the write.
        """
        manifest = self.models._manifest(receipt.root_digest)
        if manifest is None:
            raise BackendUnavailableError(
                f"{self.uri}: no model with root digest {receipt.root_digest} to attach the load receipt to "
                "(push the model first, or keep receipts in a directory)"
            )
        referrer, _ = attach_bundle(
            self.models._client,
            self.models.reference.repository,
            manifest,
            document,
            RECEIPT_MEDIA_TYPE,
            layer_media_type=RECEIPT_MEDIA_TYPE,
        )
        return f"{self.models.reference.repository_uri}@{referrer}"

    def put_snapshot(self, document: bytes, snapshot: LoadSnapshot) -> str:
        """Refused: a snapshot is about no model (see the class docstring).

        Raises:
            PolicyError: Always.
        """
        del document, snapshot
        raise PolicyError(
            f"{self.uri}: a registry keeps receipts as referrers of a model; a snapshot needs a "
            "directory store (loadReceipt.store)"
        )

    def receipts(self, root_digest: str | None) -> list[tuple[str, bytes]]:
        """The receipt referrers of the model's manifest (`ReceiptStore.receipts`; untrusted).

        Those past the read budget, or not readable as a referrer of this manifest, come back with empty
        bytes and the reason in their source, for the reader to list as refused.

        Raises:
            PolicyError: `root_digest` is None (a registry is listed per model).
            BackendUnavailableError: The registry cannot be read.
        """
        if root_digest is None:
            raise PolicyError(f"{self.uri}: a registry lists receipts per model; name the model")
        if not is_sha256_hex(root_digest):
            raise MalformedArtifactError(f"{root_digest!r} is not a hex SHA-256 digest")
        manifest = self.models._manifest(root_digest)
        if manifest is None:
            return []
        budget = ReferrerBudget(max_referrers=MAX_RECEIPTS, max_bundle_bytes=MAX_DOCUMENT_BYTES)
        reads, _ = read_evidence(
            self.models._client,
            self.models.reference.repository,
            manifest["digest"],
            budget,
            artifact_types=(RECEIPT_MEDIA_TYPE,),
        )
        repository = self.models.reference.repository_uri
        return [
            (f"{repository}@{r.digest} ({r.note})" if r.note else f"{repository}@{r.digest}", r.data)
            for r in reads
        ]
