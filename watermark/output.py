"""Writing a watermarked copy: staging beside the output, no link followed, one rename into place.

Used by `modelsec.watermark.embed` and `modelsec.watermark.budget`, and by
`modelsec.release` for its output check.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from modelsec.errors import PolicyError
from modelsec.modelformat.openat2 import open_beneath_fd

COPY_CHUNK = 8 * 2**20  # bytes per read when copying a file unchanged


def check_out_dir(model_dir: Path, out_dir: Path) -> None:
    """Refuse an output directory the final rename could not take, before any work is done.

    Raises:
        PolicyError: `out_dir` is the model directory or inside it, a symlink, a file, a non-empty
            directory, or its parent does not exist.
    """
    src = model_dir.resolve()
    dst = out_dir.resolve()
    if dst == src or src in dst.parents:
        raise PolicyError(f"{out_dir}: the output directory must not be the model directory or inside it")
    if out_dir.is_symlink():
        raise PolicyError(f"{out_dir}: the output directory is a symlink")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise PolicyError(f"{out_dir}: exists and is not a directory")
        if any(out_dir.iterdir()):
            raise PolicyError(f"{out_dir}: the output directory exists and is not empty")
    if not dst.parent.is_dir():
        raise PolicyError(f"{out_dir}: the parent directory does not exist")


def chunks(f: Any) -> Iterator[bytes]:
    """The bytes of the open binary file `f`, `COPY_CHUNK` at a time (a file copied unchanged)."""
    while chunk := f.read(COPY_CHUNK):
        yield chunk


def make_staging(parent_fd: int, out_dir: Path) -> str:
    """Create a fresh staging directory beneath `parent_fd` (0755, never an existing name); its name."""
    for _ in range(16):
        name = f".{out_dir.name}.tmp-{secrets.token_hex(6)}"
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            continue
        except OSError as e:
            raise PolicyError(f"{out_dir}: cannot create the output directory: {e.strerror}") from None
        return name
    raise PolicyError(f"{out_dir}: cannot create a staging directory beside it")


def move_into_place(parent_fd: int, staging: str, out_dir: Path) -> None:
    """Rename the staging directory onto `out_dir` beneath `parent_fd`, replacing an empty `out_dir`.

    Raises:
        PolicyError: The rename failed (`out_dir` not empty, permissions): nothing was moved.
    """
    try:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(out_dir.name, dir_fd=parent_fd)  # an empty output directory given by the caller
        os.rename(staging, out_dir.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except OSError as e:
        raise PolicyError(f"{out_dir}: cannot move the watermarked model into place: {e.strerror}") from None


def move_dir_into_place(directory: Path, out_dir: Path) -> None:
    """Rename a finished candidate directory (a sibling of `out_dir`) onto `out_dir`, replacing an empty one.

    Raises:
        PolicyError: The rename failed (`out_dir` not empty, permissions): nothing was moved.
    """
    try:
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(directory, out_dir)
    except OSError as e:
        raise PolicyError(f"{out_dir}: cannot move the watermarked model into place: {e.strerror}") from None


def write_new(staging_fd: int, name: str, chunks: Iterable[Any], out_dir: Path) -> None:
    """Create `name` beneath `staging_fd` (no link followed, never over an existing file); write it.

    Raises:
        PolicyError: The output cannot be written (permissions, disk full): a setup problem.
    """
    try:
        parts = name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            with contextlib.suppress(FileExistsError):
                os.mkdir("/".join(parts[:depth]), 0o755, dir_fd=staging_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = open_beneath_fd(staging_fd, name, flags, 0o644)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    except OSError as e:
        raise PolicyError(f"{out_dir}: cannot write the watermarked model: {e.strerror}") from None
