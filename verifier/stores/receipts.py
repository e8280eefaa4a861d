"""Where load receipts and snapshots are kept: one protocol, chosen by the policy's `loadReceipt.store`.

- a directory path: `DirectoryReceiptStore`, files `<dir>/<digest[:16]>-<time>-<pid>.receipt.json` and
  `<dir>/snapshot-<time>-<pid>.snapshot.json`;
- `oci://REGISTRY/REPOSITORY`: `modelsec.verifier.stores.oci.OciReceiptStore`, referrers of the model's
  manifest (credentials from the environment, `RegistryOptions.from_env`).

A store trusts nothing it holds: readers (`modelsec.verifier.receipts`) verify every receipt they get. The
receipt and snapshot media types live here, the lowest layer that names them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from modelsec.errors import BackendUnavailableError, Error, MalformedArtifactError
from modelsec.safe_io import read_regular_file

if TYPE_CHECKING:
    from modelsec.attestations.predicates.load_receipt import LoadReceipt
    from modelsec.attestations.predicates.load_snapshot import LoadSnapshot

__all__ = [
    "RECEIPT_MEDIA_TYPE",
    "SNAPSHOT_MEDIA_TYPE",
    "DirectoryReceiptStore",
    "ReceiptStore",
    "open_receipt_store",
]

RECEIPT_MEDIA_TYPE = "application/vnd.modelsec.load-receipt.v1+json"
SNAPSHOT_MEDIA_TYPE = "application/vnd.modelsec.load-snapshot.v1+json"
MAX_DOCUMENT_BYTES = 16 * 2**20
MAX_RECEIPTS = 65_536


class ReceiptStore(Protocol):
    """Keeps receipt and snapshot files and hands receipts back (untrusted)."""

    @property
    def uri(self) -> str:
        """The store's reference, for diagnostics."""
        ...

    def put_receipt(self, document: bytes, receipt: LoadReceipt) -> str:
        """Keep a receipt file about `receipt.root_digest`; returns where it is.

        Raises:
            BackendUnavailableError: The store cannot be written.
        """
        ...

    def put_snapshot(self, document: bytes, snapshot: LoadSnapshot) -> str:
        """Keep a snapshot file; returns where it is (same errors)."""
        ...

    def receipts(self, root_digest: str | None) -> list[tuple[str, bytes]]:
        """`(source, bytes)` of the receipts kept about `root_digest` (hex), or of every receipt (None).

        A store may return receipts about other models too (the reader checks the subject).

        Raises:
            BackendUnavailableError: The store cannot be read.
            MalformedArtifactError: More than `MAX_RECEIPTS` receipts.
        """
        ...


def _stamp(when: datetime) -> str:
    return when.strftime("%Y%m%dT%H%M%S%fZ")


@dataclass(frozen=True, slots=True)
class DirectoryReceiptStore:
    """Receipts as files in one directory (module docstring names)."""

    root: Path

    @property
    def uri(self) -> str:
        """The directory."""
        return str(self.root)

    def _write(self, name: str, document: bytes) -> str:
        path = self.root / name
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(document)
            tmp.replace(path)  # a reader never sees half a receipt
        except OSError as e:
            raise BackendUnavailableError(f"{path}: cannot write the receipt: {e.strerror}") from e
        return str(path)

    def put_receipt(self, document: bytes, receipt: LoadReceipt) -> str:
        """Write `<digest[:16]>-<loadedAt>-<pid>.receipt.json` (see `ReceiptStore.put_receipt`)."""
        stamp = _stamp(receipt.loaded_at)
        return self._write(f"{receipt.root_digest[:16]}-{stamp}-{receipt.pid}.receipt.json", document)

    def put_snapshot(self, document: bytes, snapshot: LoadSnapshot) -> str:
        """Write `snapshot-<takenAt>-<pid>.snapshot.json` (see `ReceiptStore.put_snapshot`)."""
        return self._write(f"snapshot-{_stamp(snapshot.taken_at)}-{os.getpid()}.snapshot.json", document)

    def receipts(self, root_digest: str | None) -> list[tuple[str, bytes]]:
        """The receipt files, by name (a missing directory holds none; see `ReceiptStore.receipts`)."""
        pattern = f"{root_digest[:16]}-*.receipt.json" if root_digest else "*.receipt.json"
        try:
            names = sorted(p.name for p in self.root.glob(pattern)) if self.root.is_dir() else []
        except OSError as e:
            raise BackendUnavailableError(f"{self.root}: cannot list receipts: {e.strerror}") from e
        if len(names) > MAX_RECEIPTS:
            raise MalformedArtifactError(f"{self.root}: more than {MAX_RECEIPTS} receipts")
        out = []
        for name in names:
            path = self.root / name
            try:
                data = read_regular_file(
                    path, "load receipt", max_bytes=MAX_DOCUMENT_BYTES, error=MalformedArtifactError,
                    follow_symlinks=False,
                )  # fmt: skip
            except Error as e:
                # The reader refuses it by its (empty) content and lists why; one bad file is not an outage.
                out.append((f"{path} ({e.diagnostics()})", b""))
                continue
            out.append((str(path), data))
        return out


def open_receipt_store(where: Path | str) -> ReceiptStore:
    """The store a policy's `loadReceipt.store` names: a directory, or `oci://REGISTRY/REPOSITORY`.

    Raises:
        PolicyError: A malformed `oci://` reference.
        BackendUnavailableError: `oci://` and the oci extra (requests) is not installed.
    """
    if isinstance(where, str) and where.startswith("oci://"):
        from modelsec.verifier.stores.oci import OciReceiptStore

        return OciReceiptStore.open(where)
    return DirectoryReceiptStore(Path(where))
