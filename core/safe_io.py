"""The one reader of the operator's small files: policy and configuration files, keys, certificates.

`open()` on a FIFO blocks until a writer appears, and a character device (`/dev/zero`, a terminal) never
ends: a policy path pointing at either would hang every Python process the runtime guard starts. So each
file is opened without blocking (`O_NONBLOCK`), checked to be a regular file on the opened descriptor
(`fstat`, no race with a rename), and only then read, at most `max_bytes + 1` bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from modelsec.errors import Error

__all__ = ["read_regular_file"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO or pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular_file(
    path: Path | str, what: str, *, max_bytes: int, error: type[Error], follow_symlinks: bool = True
) -> bytes:
    """The content of the regular file `path`, never blocking on a FIFO or device.

    Nothing about the content is checked; only that the path names a regular file of at most `max_bytes`.

    Args:
        path: The file.
        what: What the file is, for messages (`policy file`, `key file`).
        max_bytes: Largest accepted size.
        error: The modelsec error class raised (the caller's: `PolicyError`, `KeyMaterialError`, ...).
        follow_symlinks: False refuses a path whose last component is a symlink.

    Returns:
        The file's bytes.

    Raises:
        error: The file is missing or unreadable, a symlink (`follow_symlinks=False`), not a regular file
            (a FIFO, device, socket or directory), or larger than `max_bytes`; the message names `path`.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow_symlinks and e.errno == errno.ELOOP and os.path.islink(path):
            raise error(f"{path}: the {what} is a symlink; refused") from None
        raise error(f"{path}: cannot read the {what}: {e.strerror}") from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise error(f"{path}: the {what} is not a regular file ({kind})")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise error(f"{path}: cannot read the {what}: {e.strerror}") from e
    if len(data) > max_bytes:
        raise error(f"{path}: the {what} is larger than {max_bytes} bytes")
    return data
