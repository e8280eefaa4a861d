"""The positive-result cache of the admission webhook: what was verified, from which bundles, until when."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable, Sequence

__all__ = ["PositiveCache", "bundles_fingerprint"]


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
