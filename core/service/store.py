"""The service's attestation stores (in `modelsec.verifier.stores`; names kept here)."""

from __future__ import annotations

from modelsec.verifier.stores.records import RecordStore, StoredRecord, StoreFullError
from modelsec.verifier.stores.sqlite import SqliteAttestationStore

__all__ = ["RecordStore", "SqliteAttestationStore", "StoreFullError", "StoredRecord"]
