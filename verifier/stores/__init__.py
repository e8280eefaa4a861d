"""Attestation stores: one protocol, chosen by URI in `open_store` (DESIGN.md decision 14).

A store files bundles by their subject's model root digest and hands them back; it trusts nothing. Whoever
reads a store (`verify_attestations`, the webhook, the loader through a policy's `attestationStore`) verifies
every bundle it gets, and a bundle that is not trusted evidence about the model is ignored, never a veto.

| URI | implementation |
|---|---|
| a plain path, `file:///abs/dir` | `DirectoryStore`: `<dir>/sha256/<digest>/<sha256 of the bundle>.sig` |
| `sqlite:///abs/file.db`, `sqlite://rel.db` | `SqliteAttestationStore` (the service's embedded default) |
| `postgresql://USER@HOST/DB?…` | `PostgresAttestationStore` (replicas share it; the `postgres` extra) |
| `oci://REGISTRY/REPOSITORY` | `OciStore`: referrers of the model's manifests |
| `grpc://HOST:PORT`, `grpcs://HOST:PORT` | `GrpcAttestationStore`: the service's API (an entry point) |

A store of this package is one module beside these with a class implementing `AttestationStore` and one line
in `_OPENERS`. A store that lives above the verifier (the service's gRPC client) or in another distribution
registers an opener `(target, StoreOptions) -> AttestationStore` under the entry-point group
`modelsec.attestation_stores`, named by its URI scheme (`grpc = "modelsec.service.grpc_store:open_plaintext"`
in pyproject.toml): the verifier never imports it, it is loaded when a store of its scheme is opened.
A PostgreSQL store opened here takes its password from libpq (`PGPASSWORD`, `PGPASSFILE`); the service
reads it from a file or a variable of its own (`modelsec.service.config`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from modelsec.errors import PolicyError
from modelsec.limits import Limits

if TYPE_CHECKING:
    from modelsec.policy import Policy

__all__ = [
    "ENTRY_POINT_GROUP",
    "AttestationStore",
    "StoreOptions",
    "StoredBundle",
    "evidence_stores",
    "open_store",
]

ENTRY_POINT_GROUP = "modelsec.attestation_stores"


@dataclass(frozen=True, slots=True)
class StoredBundle:
    """One bundle as a store holds it (nothing in it is trusted yet).

    Attributes:
        id: The store's identity of the bundle (hex; a directory store: SHA-256 of the bytes).
        root_digest: The model root digest it is filed under (from its subject; untrusted).
        data: The bundle bytes (a directory store passes an oversize file on truncated to
            `max_bundle_bytes + 1` bytes, so that the verifier refuses it by size).
        source: Where it came from, for diagnostics (a path, or `<store uri>#<id>`).
        note: Non-empty when the store listed the bundle without reading it (`data` is then empty): why,
            for the verifier's list of ignored bundles.
    """

    id: str
    root_digest: str
    data: bytes = field(repr=False)
    source: str = field(compare=False)
    note: str = field(default="", compare=False)


class AttestationStore(Protocol):
    """Where the bundles about a model root digest are filed and read back (see the module docstring)."""

    @property
    def uri(self) -> str:
        """The store's reference, for diagnostics."""
        ...

    def bundles(self, digest: str) -> list[bytes]:
        """The raw bundles filed for `digest` (hex SHA-256); nothing in them is trusted yet.

        Raises:
            BackendUnavailableError: The store cannot be reached or read.
            MalformedArtifactError: `digest` is not 64 lowercase hex digits, or more bundles are filed for
                it than the store reads.
        """
        ...

    def entries(self, digest: str) -> list[StoredBundle]:
        """`bundles`, with each bundle's id and source (same errors)."""
        ...

    def revision(self, digest: str) -> str | None:
        """A cheap token that differs whenever what `entries(digest)` returns may have changed; or None.

        For readers that keep something computed from `entries` (the webhook's positive cache): equal
        tokens, taken before reading and again later, mean the store still holds what was read, so it need
        not be read again. Every writer changes the token, whichever process or connection it runs in (a
        directory: a stat of the digest's directory and files; SQLite: `PRAGMA data_version` and this
        connection's writes; PostgreSQL: a generation row a trigger bumps). None when the store cannot
        tell cheaply (a registry, the service): the reader reads `entries`.

        Raises:
            BackendUnavailableError: The store cannot be reached or read.
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
        """
        ...

    def get(self, digest: str, bundle_id: str) -> StoredBundle:
        """One bundle filed for `digest`.

        Raises:
            NotFoundError: No such bundle.
            BackendUnavailableError: The store cannot be reached or read.
        """
        ...

    def put(self, data: bytes) -> tuple[StoredBundle, bool]:
        """File a bundle under its subject's root digest; returns it and whether it was new.

        What a store checks before filing differs (a directory or SQLite file: that it parses and names a
        sha256 subject; the service: that its policy trusts it); readers verify again in every case.

        Raises:
            MalformedArtifactError: Too large, not a bundle, or no sha256 subject.
            AttestationError: The store refuses it (the service's policy).
            BackendUnavailableError: The store cannot be reached or written.
        """
        ...

    def delete(self, digest: str, bundle_id: str) -> None:
        """Remove a bundle filed for `digest`: an authorised operation (the file system's permissions).

        Raises:
            NotFoundError: No such bundle.
            PolicyError: A directory store cannot remove the file.
            BackendUnavailableError: The store cannot be reached or written.
        """
        ...

    def supersede(self, digest: str, bundle_id: str) -> None:
        """Withdraw a bundle from what readers get, keeping it where the store keeps history.

        SQLite marks the record; a directory, which keeps no history, removes the file. Same errors as
        `delete`.
        """
        ...

    def check(self) -> None:
        """Raise `BackendUnavailableError` unless the store can be read now (readiness probes)."""
        ...

    def close(self) -> None:
        """Release connections and files."""
        ...


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """How a store is opened (one options object for every implementation; each reads what it needs).

    Attributes:
        limits: `max_bundle_bytes` bounds every bundle read or written.
        max_bundles: Most bundles read for one digest (a directory store reads the newest and lists the
            rest unread; SQLite stores no more than this).
        must_exist: A directory store whose root is missing is an outage (True: the webhook) or holds
            nothing (False: a policy's store next to the model).
        channel: For `grpc(s)://`: a `modelsec.service.client.ChannelOptions` (CA, client certificate,
            token, timeout); None uses the defaults (system roots, no token).
        registry: For `oci://`: a `modelsec.registry.client.RegistryOptions` (CA, credentials, timeout);
            None reads them from the environment (`RegistryOptions.from_env`).
    """

    limits: Limits = field(default_factory=Limits)
    max_bundles: int = 1024
    must_exist: bool = True
    channel: Any = None
    registry: Any = None


def _open_directory(target: str, options: StoreOptions) -> AttestationStore:
    from modelsec.verifier.stores.directory import DirectoryStore

    return DirectoryStore(
        Path(target),
        max_bundle_bytes=options.limits.max_bundle_bytes,
        max_bundles=options.max_bundles,
        must_exist=options.must_exist,
    )


def _open_sqlite(target: str, options: StoreOptions) -> AttestationStore:
    from modelsec.verifier.stores.sqlite import SqliteAttestationStore

    return SqliteAttestationStore(
        Path(target),
        max_bundles_per_digest=options.max_bundles,
        max_bundle_bytes=options.limits.max_bundle_bytes,
    )


def _open_postgres(target: str, options: StoreOptions) -> AttestationStore:
    from modelsec.verifier.stores.records import open_record_store

    return open_record_store(
        f"postgresql://{target}",
        max_bundles_per_digest=options.max_bundles,
        max_bundle_bytes=options.limits.max_bundle_bytes,
    )


def _open_oci(target: str, options: StoreOptions) -> AttestationStore:
    from modelsec.verifier.stores.oci import open_store as open_oci_store

    return open_oci_store(target, options)


_OPENERS: dict[str, Callable[[str, StoreOptions], AttestationStore]] = {
    "": _open_directory,
    "file": _open_directory,
    "sqlite": _open_sqlite,
    "postgresql": _open_postgres,
    "postgres": _open_postgres,
    "oci": _open_oci,
}


def _registered_opener(scheme: str) -> Callable[[str, StoreOptions], AttestationStore] | None:
    """The opener a distribution registered for `scheme` (entry-point group `modelsec.attestation_stores`).

    Loading it imports its module: a missing extra surfaces as that module's `ModuleNotFoundError`.
    """
    from importlib.metadata import entry_points  # only for schemes modelsec does not know (start-up cost)

    for entry_point in entry_points(group=ENTRY_POINT_GROUP, name=scheme):
        opener: Callable[[str, StoreOptions], AttestationStore] = entry_point.load()
        return opener
    return None


def _known_schemes() -> list[str]:
    from importlib.metadata import entry_points

    return sorted({s for s in _OPENERS if s} | {e.name for e in entry_points(group=ENTRY_POINT_GROUP)})


def _split(reference: str) -> tuple[str, str]:
    scheme, sep, target = reference.partition("://")
    if not sep:
        return "", reference
    return scheme.lower(), target


def open_store(reference: str, options: StoreOptions | None = None) -> AttestationStore:
    """Open the attestation store a reference names (see the module docstring for the URI forms).

    Args:
        reference: A plain directory path or a store URI (`file://`, `sqlite://`, `postgresql://`, `oci://`,
            `grpc://`, `grpcs://`).
        options: Limits and connection options (default: `StoreOptions()`).

    Returns:
        The store. Nothing is read yet, except that SQLite opens (or creates) its file and PostgreSQL
        connects and creates its schema.

    Raises:
        PolicyError: An unknown scheme or an empty target.
        BackendUnavailableError: The store cannot be opened (SQLite, PostgreSQL), or the grpc extra is
            missing.
        ModuleNotFoundError: `psycopg`, for a PostgreSQL store without the `postgres` extra.
    """
    scheme, target = _split(reference)
    opener = _OPENERS.get(scheme) or _registered_opener(scheme)
    if opener is None:
        known = ", ".join(f"{s}://" for s in _known_schemes())
        raise PolicyError(f"attestation store {reference!r}: unknown scheme {scheme!r} (use a path, {known})")
    if not target:
        raise PolicyError(f"attestation store {reference!r} names no directory, file or server")
    return opener(target, options or StoreOptions())


def evidence_stores(reference: str, policy: Policy) -> tuple[str, ...]:
    """Which attestation stores hold the evidence about `reference` under `policy` (DESIGN.md decision 18).

    The one resolution every front door uses (the webhook, `verify`, `pull`, the loader and the guard), so
    that a policy means the same stores wherever a model is checked, in this order:

    1. the policy's `attestationStore`, when it names one (a directory, `sqlite://`, `grpc(s)://`, `oci://`);
    2. for an `oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]` reference (a pushed model, a model image as
       `oci://<image>`, or the same as a `modelsec+oci://` storage URI), the artifact's own registry,
       `oci://REGISTRY/REPOSITORY`: its store reads the referrers of the model's manifest (OCI 1.1
       referrers API, tag-schema fallback);
    3. nothing else: a local directory has its bundles beside it.

    Evidence is selected, never voted (decision 13), so reading both stores can only add evidence. A store
    the caller was configured with (the webhook's `--store`) is read besides these. Nothing is opened or
    read here, and nothing in a store is trusted: readers verify every bundle.

    Args:
        reference: The model's URI as policies match it (`file://…`, `oci://…`), with or without a digest;
            empty for a model known only by its directory.
        policy: The policy the model is checked under.

    Returns:
        The stores' references for `open_store`, without repetition (possibly none).

    Raises:
        InvalidReferenceError: An `oci://` reference that is not a valid image reference.
    """
    out: list[str] = []
    if policy.attestation_store is not None:
        out.append(policy.attestation_store)
    from modelsec.registry.reference import oci_scheme, parse_reference

    if oci_scheme(reference):
        own = parse_reference(reference).repository_uri
        if own not in out:
            out.append(own)
    return tuple(out)
