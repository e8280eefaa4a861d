"""The directory store: `<root>/sha256/<model root digest>/<sha256 of the bundle>.sig`.

The one implementation of this layout (written by `modelsec attest put` / `attest pull --out`, read by the
verifier through a policy's store and by the webhook). Reading lists the digest's directory without
following a symlinked one, reads only regular files (`read_bundle_bytes`: no symlink, no FIFO can hang the
reader), newest first, and at most `max_bundles` of them (more is not an error: the rest are listed
unread, so a flood of files cannot make the store unreadable); `delete` removes a file; writing parses
the bundle only to learn where it goes (its subject's sha256 digest) and names the file by the SHA-256
of its bytes, so storing twice is idempotent and concurrent writers never clobber each other; `revision`
is a stat of the digest's directory and files, which any writer changes (the webhook's cache checks it
instead of reading the bundles again). Nothing is trusted here: readers verify what they read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.statement import is_sha256_hex, parse_statement
from modelsec.errors import (
    BackendUnavailableError,
    MalformedArtifactError,
    NotFoundError,
    PolicyError,
    PolicyViolationError,
    SignatureError,
)
from modelsec.signer.layout import write_bundle_file
from modelsec.verifier.stores import StoredBundle
from modelsec.verifier.trust.bundles import read_bundle_bytes

__all__ = ["DirectoryStore", "subject_root_digest"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# How old every timestamp of a listing must be for `revision` to vouch for it: well above any local file
# system's clock tick (the kernel's coarse clock: at most 10 ms).
_SETTLE_NS = 1_000_000_000


def subject_root_digest(data: bytes, max_bytes: int) -> str:
    """The sha256 model root digest a bundle's (first) subject names: where a store files it. Not trusted.

    Raises:
        MalformedArtifactError: Larger than `max_bytes`, not a bundle or statement, or no sha256 subject.
    """
    if len(data) > max_bytes:
        raise MalformedArtifactError(f"bundle larger than {max_bytes} bytes")
    bundle = parse_bundle(data, source="bundle")
    statement = parse_statement(bundle.envelope.payload, what="bundle")
    digest = statement.subjects[0].digest.get("sha256", "")
    if not is_sha256_hex(digest):
        raise MalformedArtifactError("bundle subject has no sha256 model root digest")
    return digest


@dataclass(frozen=True, slots=True)
class DirectoryStore:
    """A directory of bundles filed by model root digest (see the module docstring).

    Attributes:
        root: The store directory.
        max_bundle_bytes: Bytes read per bundle at most; a larger file is passed on truncated so that the
            verifier refuses it by size, and a larger bundle is not written.
        max_bundles: Most bundles read for one digest (the newest; the others are listed unread).
        must_exist: A missing or non-directory root is an outage (`BackendUnavailableError`) rather than
            an empty store.
        max_total_bytes: Most bytes read for one digest, all bundles together.
    """

    root: Path
    max_bundle_bytes: int = 16 * 2**20
    max_bundles: int = 1024
    must_exist: bool = True
    max_total_bytes: int = 64 * 2**20

    @property
    def uri(self) -> str:
        """The root directory."""
        return str(self.root)

    def check(self) -> None:
        """Raise unless the root is a readable directory.

        Raises:
            BackendUnavailableError: Missing, not a directory, or not readable.
        """
        try:
            if not stat.S_ISDIR(os.stat(self.root).st_mode) or not os.access(self.root, os.R_OK | os.X_OK):
                raise BackendUnavailableError(f"attestation store {self.root} is not a readable directory")
        except OSError as e:
            raise BackendUnavailableError(
                f"attestation store {self.root} unavailable: {e.strerror or type(e).__name__}"
            ) from e

    def close(self) -> None:
        """Nothing to release."""

    def bundles(self, digest: str) -> list[bytes]:
        """Read every `*.sig` filed for `digest` (symlinks and other non-regular entries are skipped).

        Raises:
            BackendUnavailableError: The root is missing or not a directory (when `must_exist`), or it is
                unreadable.
            MalformedArtifactError: `digest` is not 64 lowercase hex digits, or more than `max_bundles`
                bundles are filed for it.
        """
        return [e.data for e in self.entries(digest) if not e.note]

    def entries(self, digest: str) -> list[StoredBundle]:
        """`bundles` with each bundle's id (the file's stem) and path (same errors, and no overflow error).

        The newest files (modification time) are read first, up to `max_bundles` of them and
        `max_total_bytes` in all; each one left unread is returned without data and with a `note` saying
        why, so that the verifier lists it as ignored. A directory store holds more than that only when
        someone floods it: newest first keeps the evidence that decides (the newest gate) in reach.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        try:
            out: list[StoredBundle] = []
            budget, count = self.max_total_bytes, 0
            for name, size in self._listing(digest):
                path = self.root / "sha256" / digest / name
                bundle_id = name.removesuffix(".sig")
                if count >= self.max_bundles or size > budget:
                    note = (
                        f"not read: the store holds more bundles for {digest} than it reads "
                        f"({self.max_bundles} bundles, {self.max_total_bytes} bytes; newest first)"
                    )
                    out.append(StoredBundle(bundle_id, digest, b"", str(path), note=note))
                    continue
                try:
                    data = read_bundle_bytes(path, self.max_bundle_bytes)
                except (MalformedArtifactError, PolicyViolationError, SignatureError):
                    continue  # symlinks, FIFOs and other non-regular or vanished entries are not bundles
                budget -= len(data)
                count += 1
                out.append(StoredBundle(bundle_id, digest, data, str(path)))
            return out
        except OSError as e:
            raise BackendUnavailableError(
                f"attestation store {self.root} is unreadable: {e.strerror or type(e).__name__}"
            ) from e

    def revision(self, digest: str) -> str | None:
        """A stat of the digest's directory and of every file in it: changes with any write or withdrawal.

        The token covers the digest directory (device, inode, modification and change times) and each
        `*.sig` entry in it (name, inode, size, modification and change times, in nanoseconds). Filing,
        removing or renaming a bundle changes the directory's times and the list, and rewriting one changes
        its size or times, whichever process or tool does it; no bundle is opened (one open of the
        directory, its listing, one `lstat` per entry). A file system's timestamps are only as fine as its
        clock tick, so a listing in which any time is less than a second old, or in the future, gives None
        (read `entries`): a same-size rewrite within one tick cannot then go unseen (git's "racily clean"
        index entries). A store on a network file system whose server clock runs more than that behind
        this host's is outside this guarantee.

        Raises:
            MalformedArtifactError: `digest` is not 64 lowercase hex digits.
            BackendUnavailableError: The root is missing or not a directory (when `must_exist`), or
                unreadable.
        """
        if not is_sha256_hex(digest):
            raise MalformedArtifactError(f"{digest!r} is not a hex SHA-256 digest")
        try:
            scanned = self._scan(digest)
        except OSError as e:
            raise BackendUnavailableError(
                f"attestation store {self.root} is unreadable: {e.strerror or type(e).__name__}"
            ) from e
        if scanned is None:
            return "none"
        directory, files = scanned
        settled = time.time_ns() - _SETTLE_NS
        stats = [directory, *(st for _, st in files)]
        if any(st.st_mtime_ns >= settled or st.st_ctime_ns >= settled for st in stats):
            return None
        parts: list[tuple[object, ...]] = [
            (directory.st_dev, directory.st_ino, directory.st_mtime_ns, directory.st_ctime_ns)
        ]
        parts += sorted((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in files)
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def _scan(self, digest: str) -> tuple[os.stat_result, list[tuple[str, os.stat_result]]] | None:
        """The digest directory's stat and its regular `*.sig` files' (None: no such directory here).

        Raises:
            BackendUnavailableError: The root is not a directory and `must_exist`.
            OSError: The directory cannot be read.
        """
        try:
            fd = os.open(os.path.join(self.root, "sha256", digest), _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            # Whether the store itself is there is asked only now: the common case costs one call.
            try:
                root_mode = os.stat(self.root).st_mode
            except FileNotFoundError:
                root_mode = 0
            if not stat.S_ISDIR(root_mode) and self.must_exist:
                raise BackendUnavailableError(f"attestation store {self.root} is not a directory") from None
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None  # a symlinked digest directory is not this store's
            raise
        found: list[tuple[str, os.stat_result]] = []
        try:
            directory = os.fstat(fd)
            with os.scandir(fd) as it:
                for entry in it:
                    if not entry.name.endswith(".sig"):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while listed
                    if stat.S_ISREG(st.st_mode):
                        found.append((entry.name, st))
        finally:
            os.close(fd)
        return directory, found

    def _listing(self, digest: str) -> list[tuple[str, int]]:
        """The `*.sig` names filed for `digest` with their sizes, newest first (then by name)."""
        scanned = self._scan(digest)
        if scanned is None:
            return []
        found = sorted(scanned[1], key=lambda f: (-f[1].st_mtime_ns, f[0]))
        return [(name, min(st.st_size, self.max_bundle_bytes + 1)) for name, st in found]

    def get(self, digest: str, bundle_id: str) -> StoredBundle:
        """The bundle `<root>/sha256/<digest>/<bundle_id>.sig`.

        Raises:
            NotFoundError: No such bundle, or `bundle_id` is not a hex SHA-256.
            BackendUnavailableError: The store cannot be read.
        """
        if not is_sha256_hex(digest) or not is_sha256_hex(bundle_id):
            raise NotFoundError(f"attestation store {self.root}: no bundle {bundle_id!r} for {digest!r}")
        for entry in self.entries(digest):
            if entry.id == bundle_id:
                return entry
        raise NotFoundError(f"attestation store {self.root}: no bundle {bundle_id} for {digest}")

    def put(self, data: bytes) -> tuple[StoredBundle, bool]:
        """File a bundle under its subject's root digest (`<root>/sha256/<digest>/<sha256>.sig`).

        Nothing is trusted here: the subject digest only decides where the file goes.

        Raises:
            MalformedArtifactError: The bundle is too large, cannot be parsed, or has no sha256 subject.
            PolicyError: The store directory or the file cannot be written.
        """
        digest = subject_root_digest(data, self.max_bundle_bytes)
        directory = self.root / "sha256" / digest
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PolicyError(f"{directory}: cannot create the store directory: {e.strerror}") from e
        bundle_id = hashlib.sha256(data).hexdigest()
        path = directory / f"{bundle_id}.sig"
        created = not os.path.lexists(path)
        write_bundle_file(path, data)
        return StoredBundle(bundle_id, digest, data, str(path)), created

    def delete(self, digest: str, bundle_id: str) -> None:
        """Remove the bundle `<root>/sha256/<digest>/<bundle_id>.sig` (the file; no link is followed).

        Whoever may write the directory may do this: the store's access control is the file system's.

        Raises:
            NotFoundError: No such bundle, or `digest` or `bundle_id` is not a hex SHA-256.
            PolicyError: The file cannot be removed.
        """
        if not is_sha256_hex(digest) or not is_sha256_hex(bundle_id):
            raise NotFoundError(f"attestation store {self.root}: no bundle {bundle_id!r} for {digest!r}")
        directory = self.root / "sha256" / digest
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError as e:
            raise NotFoundError(f"attestation store {self.root}: no bundle {bundle_id} for {digest}") from e
        try:
            os.unlink(f"{bundle_id}.sig", dir_fd=fd)
        except FileNotFoundError:
            raise NotFoundError(
                f"attestation store {self.root}: no bundle {bundle_id} for {digest}"
            ) from None
        except OSError as e:
            raise PolicyError(f"{directory / bundle_id}.sig: cannot remove the bundle: {e.strerror}") from e
        finally:
            os.close(fd)

    def supersede(self, digest: str, bundle_id: str) -> None:
        """Withdraw a bundle readers should no longer see; a directory keeps no history, so it is `delete`.

        Raises:
            NotFoundError: No such bundle.
            PolicyError: The file cannot be removed.
        """
        self.delete(digest, bundle_id)
