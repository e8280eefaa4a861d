"""The gRPC store (`grpc://` / `grpcs://HOST:PORT`): the service's AttestationService as a store.

Reads stream `GetAttestations`; `put` is `PutAttestation`, which the server verifies against its own policy
before storing (a refusal raises); `delete` and `supersede` are `DeleteAttestation` and
`SupersedeAttestation`, which the server grants per identity (`deleteAttestation`, `supersedeAttestation`).
Needs the `grpc` extra; the client is imported only when such a store is opened, so `modelsec.verifier`
still imports without grpc (DESIGN.md decision 9).
"""

from __future__ import annotations

from typing import Any

from modelsec.attestations.statement import is_sha256_hex
from modelsec.errors import MalformedArtifactError, NotFoundError
from modelsec.verifier.stores import StoredBundle, StoreOptions

__all__ = ["GrpcAttestationStore", "open_plaintext", "open_tls"]


def open_plaintext(target: str, options: StoreOptions) -> GrpcAttestationStore:
    """The `grpc://HOST:PORT` opener (entry point `modelsec.attestation_stores: grpc`).

    Raises:
        ModuleNotFoundError: The grpc extra is not installed.
    """
    return GrpcAttestationStore.connect(target, options.channel, plaintext=True)


def open_tls(target: str, options: StoreOptions) -> GrpcAttestationStore:
    """The `grpcs://HOST:PORT` opener (entry point `modelsec.attestation_stores: grpcs`); errors as above."""
    return GrpcAttestationStore.connect(target, options.channel, plaintext=False)


class GrpcAttestationStore:
    """An `AttestationStore` over a `modelsec.service.client.ModelsecClient`."""

    def __init__(self, client: Any, uri: str) -> None:
        """Wrap a connected client (`connect` builds one from a target and channel options)."""
        self.client = client
        self._uri = uri

    @classmethod
    def connect(cls, target: str, channel: Any, *, plaintext: bool) -> GrpcAttestationStore:
        """Open a channel to `target` (`HOST:PORT`) with `channel` options (`ChannelOptions`, or None).

        Raises:
            ModuleNotFoundError: The grpc extra is not installed.
        """
        import dataclasses

        from modelsec.service.client import ChannelOptions, ModelsecClient

        options = channel or ChannelOptions()
        if plaintext != options.plaintext:
            options = dataclasses.replace(options, plaintext=plaintext)
        return cls(ModelsecClient(target, options), f"{'grpc' if plaintext else 'grpcs'}://{target}")

    @property
    def uri(self) -> str:
        """The server URI."""
        return self._uri

    def bundles(self, digest: str) -> list[bytes]:
        """The stored bundles about `digest` (see `AttestationStore.bundles`)."""
        return [e.data for e in self.entries(digest)]

    def revision(self, digest: str) -> None:
        """None: the service offers no cheap change token, so readers read `entries` every time."""
        return None

    def entries(self, digest: str) -> list[StoredBundle]:
        """`bundles` with each record's id and source (`<uri>#<id>`).

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
            BackendUnavailableError: The server cannot be reached.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        return [
            StoredBundle(r.attestation.id, digest, r.bundle, f"{self._uri}#{r.attestation.id}")
            for r in self.client.get_attestations(digest)
        ]

    def get(self, digest: str, bundle_id: str) -> StoredBundle:
        """One stored bundle by record id (raises `NotFoundError` when the server has none)."""
        for entry in self.entries(digest):
            if entry.id == bundle_id:
                return entry
        raise NotFoundError(f"{self._uri}: no bundle {bundle_id!r} about {digest}")

    def put(self, data: bytes) -> tuple[StoredBundle, bool]:
        """Store a bundle; the server verifies it against its policy first (a refusal raises)."""
        response = self.client.put_attestation(data)
        a = response.attestation
        return StoredBundle(a.id, a.root_digest, data, f"{self._uri}#{a.id}"), bool(response.created)

    def delete(self, digest: str, bundle_id: str) -> None:
        """Remove a stored record for good (`DeleteAttestation`).

        Raises:
            MalformedArtifactError: `digest` or `bundle_id` is not 64 lowercase hex digits.
            NotFoundError: The server holds no such record about `digest`.
            PermissionDeniedError: This identity may not delete (`deleteAttestation`).
            BackendUnavailableError: The server cannot be reached.
        """
        self._check(digest, bundle_id)
        self.client.delete_attestation(digest, bundle_id)

    def supersede(self, digest: str, bundle_id: str) -> None:
        """Withdraw a current record from readers, kept on the server (`SupersedeAttestation`).

        Raises:
            MalformedArtifactError: `digest` or `bundle_id` is not 64 lowercase hex digits.
            NotFoundError: The server holds no such current record about `digest`.
            PermissionDeniedError: This identity may not supersede (`supersedeAttestation`).
            BackendUnavailableError: The server cannot be reached.
        """
        self._check(digest, bundle_id)
        self.client.supersede_attestation(digest, bundle_id)

    @staticmethod
    def _check(digest: str, bundle_id: str) -> None:
        for value, what in ((digest, "digest"), (bundle_id, "bundle id")):
            if not is_sha256_hex(value):
                raise MalformedArtifactError(f"{what} {value[:80]!r} is not a hex SHA-256 digest")

    def check(self) -> None:
        """Nothing is probed: the server's own health endpoint answers for it."""

    def close(self) -> None:
        """Close the channel."""
        self.client.close()

    def __enter__(self) -> GrpcAttestationStore:
        """Use as a context manager (closes the channel)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the channel."""
        self.close()
