"""`runBy`: who performed the run a gate or watermark statement records (server and requester identity).

A modelsec server records `{"runBy": {"server": "<server identity>", "requester": "<caller identity>"}}` in
the gate and watermark predicates of the runs it performed itself (RunGate, EmbedWatermark), and its
SignStatement never signs a gate or watermark statement that carries `runBy`. So a `runBy` under a key that
only a modelsec server holds means the server ran the gate or the embed for that requester. Under any other
key it is the signer's claim like every other field: a policy that requires server-run evidence
(`requireServerRun`) must trust, for that role, only keys held by modelsec servers.

Parsed strictly: an object with exactly the two keys, each a string of 1-1024 printable characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelsec.errors import MalformedArtifactError

__all__ = ["RUN_BY_FIELD", "RunBy", "parse_run_by"]

RUN_BY_FIELD = "runBy"
_MAX_CHARS = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class RunBy:
    """Who ran a gate or an embed: the server's identity and the authenticated identity that asked.

    Attributes:
        server: The server's configured identity (`serverIdentity`).
        requester: The caller's identity (SPIFFE ID, certificate name or token identity).
    """

    server: str
    requester: str

    def __post_init__(self) -> None:
        for name in ("server", "requester"):
            _check_text(getattr(self, name), f"{RUN_BY_FIELD}.{name}", "runBy")

    def to_json(self) -> dict[str, str]:
        """The predicate's `runBy` object."""
        return {"server": self.server, "requester": self.requester}


def _check_text(value: object, path: str, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_CHARS or _CONTROL.search(value):
        raise MalformedArtifactError(
            f"{what}: predicate {path} must be a string of 1-{_MAX_CHARS} printable characters"
        )
    return value


def parse_run_by(predicate: Mapping[str, Any], *, what: str) -> RunBy | None:
    """The predicate's `runBy`, or None when it has none (a run not performed by a modelsec server).

    Args:
        predicate: A gate or watermark predicate.
        what: Names the bundle or request in errors.

    Returns:
        The parsed `runBy` (a claim until the statement's signature is checked), or None.

    Raises:
        MalformedArtifactError: `runBy` is present but not an object of exactly `server` and `requester`,
            each 1-1024 printable characters.
    """
    if RUN_BY_FIELD not in predicate:
        return None
    value = predicate[RUN_BY_FIELD]
    if not isinstance(value, Mapping) or set(value) != {"server", "requester"}:
        raise MalformedArtifactError(
            f"{what}: predicate {RUN_BY_FIELD} must be an object with exactly server and requester"
        )
    return RunBy(
        server=_check_text(value["server"], f"{RUN_BY_FIELD}.server", what),
        requester=_check_text(value["requester"], f"{RUN_BY_FIELD}.requester", what),
    )
