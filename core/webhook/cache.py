"""The caches of the admission webhook: positive results, and what registries answered.

`PositiveCache`: what was verified, from which bundles, until when. `EvidenceCache`: what a registry (or a
policy's store) answered, until when.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable, Sequence
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

    Each entry keeps the fingerprint of the bundles it was computed from (`bundles_fingerprint`).
    """

    def __init__(self, ttl_seconds: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl, self._max, self._clock = ttl_seconds, max_entries, clock
        self._entries: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> str | None:
        """The bundles fingerprint of `key`'s positive result if it is younger than the TTL, else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= self._clock():
                del self._entries[key]
                return None
            return entry[1]

    def hit(self, key: tuple[str, str, str], fingerprint: str) -> bool:
        """Whether `key` was verified positively, from bundles with `fingerprint`, less than the TTL ago."""
        cached = self.get(key)
        return cached is not None and hmac.compare_digest(cached, fingerprint)

    def put(self, key: tuple[str, str, str], fingerprint: str) -> None:
        """Remember a positive result (expired entries, then the oldest, make room)."""
        if self._ttl <= 0:
            return
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self._max:
                for k in [k for k, v in self._entries.items() if v[0] <= now]:
                    del self._entries[k]
                while len(self._entries) >= self._max:
                    del self._entries[next(iter(self._entries))]
            self._entries[key] = (now + self._ttl, fingerprint)

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
    asks again). At most `max_entries` answers are kept: expired ones, then the oldest, make room.
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
        self._entries: dict[tuple[str, ...], tuple[float, object]] = {}
        self._lock = threading.Lock()

    def get_or_load(self, key: tuple[str, ...], load: Callable[[], T]) -> tuple[T, bool]:
        """The unexpired answer for `key`, or `load()`'s (remembered); and whether it came from the cache.

        Raises:
            Whatever `load` raises (nothing is remembered then).
        """
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] > now:
                return cast(T, entry[1]), True
        value = load()
        ttl = self._ttl if value else self._negative
        if ttl > 0 and self._max > 0:
            now = self._clock()
            with self._lock:
                self._entries.pop(key, None)
                if len(self._entries) >= self._max:
                    for k in [k for k, v in self._entries.items() if v[0] <= now]:
                        del self._entries[k]
                    while len(self._entries) >= self._max:
                        del self._entries[next(iter(self._entries))]
                self._entries[key] = (now + ttl, value)
        return value, False

    def clear(self) -> None:
        """Forget every answer (the policy changed)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
