"""Private, read-only copies of verified bytes that a framework can open by path.

The runtime guard hands frameworks a directory in place of the model directory. Each file in it holds
bytes that modelsec hashed and compared with the signed manifest; nothing in it is ever re-read from the
original path. Two storages, chosen once per process:

* `memfd` (preferred, Linux): each file's bytes live in an anonymous memory file (`memfd_create`) sealed
  against writes, growth and shrinking (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`); the
  directory holds only links to `/proc/<pid>/fd/<n>`. No filesystem holds the bytes, so this works in a pod
  with a read-only root filesystem; the small link directory goes to `$MODELSEC_SNAPSHOT_DIR`, else
  `/dev/shm`, else the temporary directory.
* `directory` (fallback where memfd is missing or sealing fails, or `MODELSEC_SNAPSHOT_STORAGE=directory`):
  the bytes are written as mode-0400 files into a fresh mode-0700 directory under `$MODELSEC_SNAPSHOT_DIR`
  (an operator-named, preferably memory-backed, writable volume), else the temporary directory.

The directory is created by this process with `mkdtemp` (mode 0700, unpredictable name) and removed at exit
by the process that made it (a forked child never removes its parent's copy). `private_directory` gives other
per-process copies (the guard's remote-code module directory, `modelsec-modules-*`) the same place, mode and
removal at exit.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import threading
from pathlib import Path

from modelsec.errors import BackendUnavailableError

__all__ = ["PrivateTree", "private_directory", "snapshot_base_dir"]

_SEALS = (
    getattr(fcntl, "F_SEAL_SEAL", 0)
    | getattr(fcntl, "F_SEAL_SHRINK", 0)
    | getattr(fcntl, "F_SEAL_GROW", 0)
    | getattr(fcntl, "F_SEAL_WRITE", 0)
)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_trees: list[PrivateTree] = []
_directories: list[tuple[Path, int]] = []  # (directory, pid of the process that made it)
_trees_lock = threading.Lock()


def snapshot_base_dir() -> Path:
    """Where private trees are created: `$MODELSEC_SNAPSHOT_DIR`, else `/dev/shm`, else the temp directory.

    Raises:
        BackendUnavailableError: `$MODELSEC_SNAPSHOT_DIR` is set but is not a writable directory.
    """
    named = os.environ.get("MODELSEC_SNAPSHOT_DIR")
    if named:
        if not (os.path.isdir(named) and os.access(named, os.W_OK | os.X_OK)):
            raise BackendUnavailableError(f"MODELSEC_SNAPSHOT_DIR={named}: not a writable directory")
        return Path(named)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):  # noqa: S108 - a tmpfs
        return Path("/dev/shm")  # noqa: S108
    return Path(tempfile.gettempdir())


def _make_directory(prefix: str) -> Path:
    base = snapshot_base_dir()
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    except OSError as e:
        raise BackendUnavailableError(
            f"{base}: cannot create the runtime guard's private copy ({e.strerror}); "
            "set MODELSEC_SNAPSHOT_DIR to a writable directory"
        ) from e


def private_directory(prefix: str) -> Path:
    """A fresh mode-0700 directory under `snapshot_base_dir()`, removed at exit by this process.

    For private copies a framework writes itself (transformers copies remote code into the guard's
    module directory). A forked child that exits does not remove it.

    Args:
        prefix: The start of the directory's name (`modelsec-modules-`); the rest is unpredictable.

    Raises:
        BackendUnavailableError: No writable place for it.
    """
    path = _make_directory(prefix)
    with _trees_lock:
        _directories.append((path, os.getpid()))
    return path


def _memfd_usable() -> bool:
    if os.environ.get("MODELSEC_SNAPSHOT_STORAGE", "memfd") == "directory":
        return False
    if not hasattr(os, "memfd_create") or not _SEALS or not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        return False
    try:
        fd = os.memfd_create("modelsec-probe", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


class PrivateTree:
    """A private directory of read-only files holding given bytes (see the module docstring).

    Attributes:
        path: The directory a framework is given (`<mkdtemp>/<name>`).
        storage: `"memfd"` or `"directory"`.
    """

    def __init__(self, name: str) -> None:
        """Create an empty tree whose top directory is called `name` (e.g. the model directory's name).

        Raises:
            BackendUnavailableError: No writable place for the tree.
        """
        self._top = _make_directory("modelsec-")
        self.path = self._top / (name or "model")
        self.path.mkdir(mode=0o700)
        self.storage = "memfd" if _memfd_usable() else "directory"
        self._fds: list[int] = []
        self._pid = os.getpid()
        with _trees_lock:
            _trees.append(self)

    def _parent_of(self, rel: str) -> Path:
        target = self.path / rel
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return target

    def add_file(self, rel: str, data: bytes | memoryview) -> None:
        """Add the file `rel` (a clean relative POSIX name) holding exactly `data`, read-only.

        Raises:
            BackendUnavailableError: The bytes cannot be stored (memory or disk full).
        """
        target = self._parent_of(rel)
        try:
            if self.storage == "memfd":
                fd = os.memfd_create(f"modelsec:{rel}"[:240], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                self._fds.append(fd)
                view = memoryview(data)
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
                os.symlink(f"/proc/{self._pid}/fd/{fd}", target)
            else:
                fd = os.open(target, _CREATE, 0o400)
                try:
                    view = memoryview(data)
                    done = 0
                    while done < len(view):
                        done += os.write(fd, view[done:])
                finally:
                    os.close(fd)
        except OSError as e:
            raise BackendUnavailableError(f"{target}: cannot store the verified copy: {e.strerror}") from e

    def add_placeholder(self, rel: str) -> None:
        """Add `rel` as an empty read-only file: a name frameworks find, with no bytes to misuse.

        Tensor files are served by the verified loader (the hooked `safe_open` / `load_file` map the
        placeholder's path back to the signed model); a reader that bypasses the hooks finds no data.
        """
        target = self._parent_of(rel)
        try:
            os.close(os.open(target, _CREATE, 0o400))
        except OSError as e:
            raise BackendUnavailableError(f"{target}: cannot create the placeholder: {e.strerror}") from e

    def close(self) -> None:
        """Remove the tree and free its memory (only in the process that created it)."""
        if os.getpid() != self._pid:
            return
        shutil.rmtree(self._top, ignore_errors=True)
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


@atexit.register
def _remove_trees() -> None:
    with _trees_lock:
        for tree in _trees:
            tree.close()
        _trees.clear()
        for path, pid in _directories:
            if pid == os.getpid():
                shutil.rmtree(path, ignore_errors=True)
        _directories.clear()
