"""Open a path beneath a directory descriptor without following any link: `openat2(2)`, or a component walk.

Python has no wrapper for `openat2` (Linux 5.6+), so it is called through `ctypes` with
`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the kernel resolves the whole path in one
call, refuses any symbolic link on the way (`ELOOP`) and any escape from the directory (`EXDEV`). Where the
kernel lacks it (`ENOSYS`), a seccomp filter refuses it (`EPERM`), or the platform is not Linux, the same
rules are applied by opening one component at a time with `O_NOFOLLOW` relative to its parent's descriptor
(a `..` component is refused with `EXDEV`). Both give the same answer for the clean relative names
callers pass; `FORCE_FALLBACK` (or the environment
variable `MODELSEC_NO_OPENAT2=1`) selects the walk, so tests run both.

Errors are raw `OSError`s here; callers translate them into `modelsec.errors` naming their path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys

__all__ = ["FORCE_FALLBACK", "open_beneath_fd", "openat2_available"]

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_SYSCALL_NUMBERS = {"x86_64": 437, "aarch64": 437, "arm64": 437}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

FORCE_FALLBACK = os.environ.get("MODELSEC_NO_OPENAT2", "") == "1"
"""Use the component walk even where `openat2` works (tests set it to cover both ways)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_syscall() -> tuple[object, int] | None:
    # What platform.machine() returns on POSIX, without importing platform (loader start-up cost).
    machine = os.uname().machine if hasattr(os, "uname") else ""
    number = _SYSCALL_NUMBERS.get(machine)
    if not sys.platform.startswith("linux") or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn, number


_SYSCALL = _load_syscall()
_unavailable = _SYSCALL is None


def openat2_available() -> bool:
    """Whether `openat2` is used (the kernel has it, nothing filters it, and the walk is not forced)."""
    return not FORCE_FALLBACK and not _unavailable


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int | None:
    """The descriptor, or None when the kernel cannot do `openat2` (then never tried again)."""
    global _unavailable
    if _SYSCALL is None:
        return None
    fn, number = _SYSCALL
    # RESOLVE_NO_SYMLINKS covers the last component too; O_NOFOLLOW with O_DIRECTORY would report a
    # trailing link as ENOTDIR instead of ELOOP.
    how = _OpenHow((flags | os.O_CLOEXEC) & ~os.O_NOFOLLOW, mode, _RESOLVE)
    raw = os.fsencode(path)
    fd = fn(  # type: ignore[operator]
        ctypes.c_long(number),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(raw),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM):
        _unavailable = True
        return None
    if err == errno.EAGAIN:
        # RESOLVE_CACHED is not requested, but a racing rename may still make the kernel ask for a retry.
        return _walk(dir_fd, path, flags, mode)
    raise OSError(err, os.strerror(err), path)


def _walk(dir_fd: int, path: str, flags: int, mode: int) -> int:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or ".." in parts:
        raise OSError(errno.EXDEV, "path leaves the directory", path)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    opened: list[int] = []
    try:
        current = dir_fd
        for part in parts[:-1]:
            current = _open_component(current, part, _DIR_FLAGS, 0)
            opened.append(current)
        return _open_component(current, parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    finally:
        for fd in opened:
            os.close(fd)


def _open_component(dir_fd: int, name: str, flags: int, mode: int) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        # With O_DIRECTORY, a link is reported as ENOTDIR; report it as openat2 does.
        if e.errno == errno.ENOTDIR:
            try:
                is_link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
            except OSError:
                is_link = False
            if is_link:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from e
        raise


def open_beneath_fd(dir_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """Open `path` relative to `dir_fd`, staying beneath it and following no link (the last one included).

    Args:
        dir_fd: The directory every component is resolved from.
        path: A relative path (`""` and `.` name `dir_fd` itself); `..` may not leave `dir_fd`.
        flags: `os.open` flags (`O_CLOEXEC` is always added).
        mode: Mode for a created file.

    Returns:
        The new descriptor; the caller closes it.

    Raises:
        OSError: `ELOOP` for a symbolic link, `EXDEV`
            for a path that would leave `dir_fd`, and whatever else the open reports (`ENOENT`, ...).
    """
    if openat2_available():
        fd = _openat2(dir_fd, path or ".", flags, mode)
        if fd is not None:
            return fd
    return _walk(dir_fd, path, flags, mode)
