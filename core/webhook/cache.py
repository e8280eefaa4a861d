"""The caches of the admission webhook: positive results, and what registries answered.

`PositiveCache`: what was verified, from which bundles (and at which store revision), until when.
`EvidenceCache`: what a registry (or a policy's store) answered, until when, each answer with a serial
number that a positive result can name as its revision.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar, cast

__all__ = ["EvidenceCache", "PositiveCache", "bundles_fingerprint"]

T = TypeVar("T")


def bundles_fingerprint(bundles: Sequence[bytes]) -> str:
    """A digest of a set of bundles (order-independent): what a cached result was computed from."""
    h = hashlib.sha256()
    for digest in sorted(hashlib.sha256(b).digest() for b in bundles):
        h.update(digest)
    return h.hexdigest()


class PositiveCache:
    """Positive results only, keyed by (policy generation, policy name, digest), with a TTL. Thread-safe.

    Each entry keeps the fingerprint of the bundles it was computed from (`bundles_fingerprint`) and,
    when the stores could tell, their revision: a value taken before those bundles were read that changes
    whenever they may have (`AttestationStore.revision`, `EvidenceCache` serials). A decision whose stores
    still give the same revision (`revision`) may reuse the result without reading the bundles.
    """

    def __init__(self, ttl_seconds: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl, self._max, self._clock = ttl_seconds, max_entries, clock
        self._entries: dict[tuple[str, str, str], tuple[float, str, Hashable]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> str | None:
        """The bundles fingerprint of `key`'s positive result if it is younger than the TTL, else None."""
        with self._lock:
            entry = self._live(key)
            return None if entry is None else entry[1]

    def hit(self, key: tuple[str, str, str], fingerprint: str, revision: Hashable = None) -> bool:
        """Whether `key` was verified positively, from bundles with `fingerprint`, less than the TTL ago.

        On a hit, a `revision` (taken before those bundles were read) replaces the entry's, so that the next
        decision can reuse the result by revision (`revision`); None leaves the entry as it is (a dry
        run, which writes nothing).
        """
        with self._lock:
            entry = self._live(key)
            if entry is None or not hmac.compare_digest(entry[1], fingerprint):
                return False
            if revision is not None:
                self._entries[key] = (entry[0], entry[1], revision)
            return True

    def revision(self, key: tuple[str, str, str]) -> Hashable:
        """The revision `key`'s unexpired positive result was last confirmed at (None: none, or unknown)."""
        with self._lock:
            entry = self._live(key)
            return None if entry is None else entry[2]

    def put(self, key: tuple[str, str, str], fingerprint: str, revision: Hashable = None) -> None:
        """Remember a positive result and the revision its bundles were read at.

        Expired entries, then the oldest, make room.
        """
        if self._ttl <= 0:
            return
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self._max:
                for k in [k for k, v in self._entries.items() if v[0] <= now]:
                    del self._entries[k]
                while len(self._entries) >= self._max:
                    del self._entries[next(iter(self._entries))]
            self._entries[key] = (now + self._ttl, fingerprint, revision)

    def _live(self, key: tuple[str, str, str]) -> tuple[float, str, Hashable] | None:
        """`key`'s entry unless it expired (dropped then); the caller holds the lock."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] <= self._clock():
            del self._entries[key]
            return None
        return entry

    def discard(self, key: tuple[str, str, str]) -> None:
        """Forget `key` (its bundles changed and no longer verify)."""
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget every entry (the policy changed)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class EvidenceCache:
    """What a registry answered for a lookup, reused for a TTL; a miss for a shorter one. Thread-safe.

    The registry-evidence cache of the webhook: keyed by what was looked up (a store and a digest, or a
    manifest's bindings under a policy), it holds the untrusted answer (bundles, root digests), never a
    verdict: every decision verifies what it gets from here. An answer is reused for `ttl_seconds`, so that
    is the bound on how long an attestation withdrawn from the registry can still be served; an empty answer
    (a miss: no manifest, no referrers, no binding) for `negative_ttl_seconds`, so that a model pushed or
    signed just after a refusal is seen that soon. An outage is never cached (it raises, and the next decision
    asks again). At most `max_entries` answers are kept: expired ones, then the oldest, make room. Each kept
    answer has a serial number, unique in this cache, that names it while it lives (`serial`): a result
    computed from an answer stays valid while its key still has that serial, and no longer than the TTL.
    """

    def __init__(
        self, ttl_seconds: float, negative_ttl_seconds: float, max_entries: int, clock: Callable[[], float]
    ) -> None:
        self._ttl, self._negative, self._max, self._clock = (
            ttl_seconds,
            negative_ttl_seconds,
            max_entries,
            clock,
        )
        self._entries: dict[tuple[str, ...], tuple[float, object, int]] = {}
        self._serials = itertools.count(1)
        self._lock = threading.Lock()

    def get_or_load(self, key: tuple[str, ...], load: Callable[[], T]) -> tuple[T, int | None]:
        """The unexpired answer for `key`, or `load()`'s (remembered); and the serial of the answer returned.

        The serial is None when the answer is not kept (a TTL of 0, or no room): a result computed from it
        cannot be reused by serial.

        Raises:
            Whatever `load` raises (nothing is remembered then).
        """
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] > now:
                return cast(T, entry[1]), entry[2]
        value = load()
        ttl = self._ttl if value else self._negative
        if ttl <= 0 or self._max <= 0:
            return value, None
        now = self._clock()
        with self._lock:
            self._entries.pop(key, None)
            if len(self._entries) >= self._max:
                for k in [k for k, v in self._entries.items() if v[0] <= now]:
                    del self._entries[k]
                while len(self._entries) >= self._max:
                    del self._entries[next(iter(self._entries))]
            serial = next(self._serials)
            self._entries[key] = (now + ttl, value, serial)
        return value, serial

    def serial(self, key: tuple[str, ...]) -> int | None:
        """The serial of `key`'s unexpired answer, or None (none kept, or expired): reads nothing."""
        with self._lock:
            entry = self._entries.get(key)
            return entry[2] if entry is not None and entry[0] > self._clock() else None

    def clear(self) -> None:
        """Forget every answer (the policy changed)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
