"""Pinning a model to the identity admission approved: `$MODELSEC_MODEL_DIGEST` and the annotation value.

A pod can hand its loader the digests its admission checked through the downward API (an environment
variable from the `modelsec.dev/models` annotation). Both spellings are accepted:

* a bare root digest, `sha256:<64 lowercase hex>`;
* the whole annotation value, `uri@sha256:<hex>[,uri@sha256:<hex>...]` (DESIGN.md, "Admission").

A model is pinned to the digests of the entries whose URI names it (`file://<real path>`); when no entry
names it by URI (e.g. the annotation names the OCI reference the volume came from), to all of them.
"""

from __future__ import annotations

import re

from modelsec.errors import PolicyError

__all__ = ["DIGEST_ENV", "DigestPin", "digests_for_model", "parse_digest_pins"]

DIGEST_ENV = "MODELSEC_MODEL_DIGEST"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

DigestPin = tuple[str | None, str]
"""(model URI or None for a bare digest, hex root digest)."""


def parse_digest_pins(value: str, *, what: str = f"${DIGEST_ENV}") -> tuple[DigestPin, ...]:
    """Parse a bare `sha256:<hex>` or an annotation value `uri@sha256:<hex>[,...]`, strictly.

    Args:
        value: The text (surrounding whitespace of each entry is ignored).
        what: Names the source in errors.

    Returns:
        One (uri | None, hex digest) pair per entry, in order.

    Raises:
        PolicyError: Empty, or an entry that is not `sha256:<64 lowercase hex>` / `uri@sha256:<hex>`.
    """
    pins: list[DigestPin] = []
    for raw in value.split(","):
        entry = raw.strip()
        uri, at, digest = entry.rpartition("@")
        if not at:
            uri, digest = "", entry
        if not _DIGEST.fullmatch(digest) or (at and not uri) or any(c.isspace() for c in uri):
            raise PolicyError(
                f"{what}: {entry!r} is not 'sha256:<64 lowercase hex>' or '<uri>@sha256:<64 lowercase hex>'"
            )
        pins.append((uri or None, digest.removeprefix("sha256:")))
    return tuple(pins)


def digests_for_model(pins: tuple[DigestPin, ...], uri: str) -> frozenset[str]:
    """The root digests a model referenced as `uri` (e.g. `file:///models/llm`) is pinned to."""
    named = frozenset(d for u, d in pins if u is not None and u.rstrip("/") == uri.rstrip("/"))
    return named or frozenset(d for _, d in pins)
