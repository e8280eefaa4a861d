"""The service's embedded attestation store (moved to `modelsec.verifier.stores.sqlite`; names kept here)."""

from __future__ import annotations

from modelsec.verifier.stores.sqlite import SqliteAttestationStore, StoredRecord, StoreFullError

__all__ = ["SqliteAttestationStore", "StoreFullError", "StoredRecord"]
