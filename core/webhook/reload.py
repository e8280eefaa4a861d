"""The policy file follows the disk: a changed file (a ConfigMap update) is loaded without a restart.

A mounted ConfigMap is updated by the kubelet swapping a symlink to a new directory, so the file's inode,
size or modification time changes; `PolicyReloader.maybe_reload` compares them (following the link) and
loads the new file. A file that does not load (half-written, invalid, a key that cannot be read) is
reported and the previous policy stays in use: an invalid update never opens the gate, nor closes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelsec.errors import PolicyError
from modelsec.policy import PolicySet
from modelsec.webhook.review import Reviewer

__all__ = ["PolicyReloader"]


def _stamp(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError as e:
        raise PolicyError(f"{path}: cannot stat the policy file: {e.strerror}") from e
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class PolicyReloader:
    """Reloads a reviewer's policy file when it changes on disk."""

    def __init__(self, path: Path, reviewer: Reviewer) -> None:
        """Watch `path` (the file `reviewer.policies` was loaded from).

        Raises:
            PolicyError: The file cannot be stat'ed.
        """
        self.path, self.reviewer = path, reviewer
        self._stamp = _stamp(path)
        self.reloads = 0

    def maybe_reload(self) -> bool:
        """Load the policy file again if it changed since the last attempt.

        Returns:
            True when a new policy is in use.

        Raises:
            PolicyError: The file changed but does not load, or cannot be stat'ed (the previous policy stays
                in use; the same change is not retried, the next one is).
            KeyMaterialError: A key the new file lists cannot be read (as above).
        """
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        self.reviewer.replace_policies(PolicySet.from_file(self.path))
        self.reloads += 1
        return True
