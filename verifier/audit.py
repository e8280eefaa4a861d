"""The node-level audit record: one JSON line per model the runtime guard or the loader verified.

Records go to the logger named `modelsec.audit` at level INFO, and nowhere else: as a library, modelsec never
writes to stderr unless the application asks (configure `logging`, or call `enable_stderr_audit`). The runtime
guard asks when it starts from `$MODELSEC_POLICY` (the `.pth` hook, `python -m modelsec.verifier.guard.hook`,
the vLLM plugin), so a node agent collects the bare JSON lines from the container log without set-up there.

A record states what was verified, never a secret: the model path, its root digest, the signers (key name,
keyid, algorithm), the number of files and bytes hashed, the seconds it took, and the process id.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modelsec.verifier.verification import VerifiedBundle

__all__ = ["AUDIT_LOGGER", "enable_stderr_audit", "record_verified_model"]

AUDIT_LOGGER = "modelsec.audit"
_logger = logging.getLogger(AUDIT_LOGGER)
_handler_lock = threading.Lock()


def enable_stderr_audit() -> None:
    """Write the audit lines, bare JSON, to stderr unless the application already handles `modelsec.audit`.

    Called by the runtime guard's start-up; an application that configured logging (a handler on
    `modelsec.audit` or an ancestor) keeps its own routing. Idempotent.
    """
    with _handler_lock:
        if _logger.hasHandlers():
            return
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        _logger.addHandler(handler)
        _logger.setLevel(logging.INFO)


def record_verified_model(
    *,
    event: str,
    model: Path,
    root_digest: str,
    bundles: Sequence[VerifiedBundle],
    files: int,
    bytes_hashed: int,
    seconds: float,
    **extra: str | int | float,
) -> None:
    """Emit one audit line for a verified model.

    Args:
        event: What happened (`snapshot` for the runtime guard, `load` for `load_model`).
        model: The model directory as given.
        root_digest: The verified model root digest (hex, without `sha256:`).
        bundles: The bundles whose signatures verified.
        files: Files whose digests were compared.
        bytes_hashed: Bytes read and hashed, in bytes.
        seconds: Wall time of the verification, in seconds.
        extra: Further scalar fields (e.g. `storage`).
    """
    line = {
        "event": event,
        "model": str(model),
        "rootDigest": f"sha256:{root_digest}",
        "signers": [
            {"name": b.key.name, "keyid": b.key.keyid, "algorithm": b.algorithm.value} for b in bundles
        ],
        "files": files,
        "bytes": bytes_hashed,
        "seconds": round(seconds, 6),
        "pid": os.getpid(),
        **extra,
    }
    _logger.info(json.dumps(line, sort_keys=True, separators=(",", ":")))
