"""The files of a model directory: walking, name rules, ignore list, and opening without following links.

Invariants (shared by the signer and the verifier, so both see the same file set):

* The walk never follows a symbolic link and refuses any it meets (file or directory links, absolute or
  relative, cycles): symlinks are never part of a model (corpus MAN02/MAN03), so a walk is bounded by the
  real tree and by `Limits.max_files` / `Limits.max_depth`.
* Only regular files and directories may appear; FIFOs, sockets and devices are refused.
* Every relative name is a clean POSIX path (`validate_resource_name`) and no two names are equal after
  Unicode NFC normalisation and case folding (they would be one file on macOS/Windows checkouts).
* The ignore list applies to exact relative paths as signed (by default the top-level `.git`,
  `.gitattributes`, `.github`, `.gitignore` and the signature files); a nested `.git` is an ordinary file.
* `open_beneath` opens each path component with `O_NOFOLLOW` relative to its parent's descriptor, so a
  component swapped for a link after the walk is refused at open time too.
"""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits

__all__ = [
    "DEFAULT_IGNORE_PATHS",
    "ModelFile",
    "ambiguity_key",
    "open_beneath",
    "open_model_root",
    "validate_resource_name",
    "walk_model",
]

DEFAULT_IGNORE_PATHS: tuple[str, ...] = (".git", ".gitattributes", ".github", ".gitignore")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True, slots=True)
class ModelFile:
    """One regular file of a model: its relative POSIX name and size in bytes at walk time."""

    name: str
    size: int


def validate_resource_name(name: object, *, what: str, limits: Limits | None = None) -> str:
    """Check that `name` is a clean relative POSIX path inside the model root.

    A clean name is a non-empty string of at most `limits.max_path_bytes` UTF-8 bytes, `/`-separated, with
    no empty, `.` or `..` segment, no leading `/`, no backslash, NUL or other control character, and no
    percent-escape (`%2e%2e` would be a second spelling of `..` for any URL-decoding consumer). Such a name
    cannot leave the root when joined onto it (corpus MAN01).

    Args:
        name: The candidate (from a manifest or the walk).
        what: Names the source in the error.
        limits: Limits; defaults to `Limits()`.

    Returns:
        `name`, unchanged.

    Raises:
        MalformedArtifactError: The name is not clean; the message quotes it.
    """
    limits = limits or Limits()
    if not isinstance(name, str) or not name:
        raise MalformedArtifactError(f"{what}: empty or non-string file name {name!r}")
    problem = None
    if len(name.encode("utf-8", "surrogatepass")) > limits.max_path_bytes:
        problem = "is too long"
    elif name.startswith("/"):
        problem = "is absolute"
    elif "\\" in name:
        problem = "contains a backslash"
    elif any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        problem = "contains a NUL or control character"
    elif any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        problem = "is not valid UTF-8"
    elif _PERCENT_ESCAPE.search(name):
        problem = "contains a percent-escape"
    elif any(seg in ("", ".", "..") for seg in name.split("/")):
        problem = "has an empty, '.' or '..' segment"
    if problem:
        raise MalformedArtifactError(
            f"{what}: file name {name!r} {problem} (must stay inside the model root)"
        )
    return name


def ambiguity_key(name: str) -> str:
    """The form under which two names denote one file on some file system: NFC, then case folded.

    Two resource names with the same key are refused wherever names are read (the directory walk and the
    signed manifest): macOS and Windows checkouts, and case-insensitive volumes, would hold one file for both.
    """
    return unicodedata.normalize("NFC", name).casefold()


def open_model_root(root: Path) -> int:
    """Open the model directory itself (not a symlink) and return its descriptor.

    Raises:
        MalformedArtifactError: `root` does not exist, is not a directory, or is a symlink.
    """
    try:
        st = os.lstat(root)
    except OSError as e:
        raise MalformedArtifactError(f"{root}: cannot read the model directory: {e.strerror}") from e
    if stat.S_ISLNK(st.st_mode):
        raise PolicyViolationError(f"{root}: the model directory is a symlink; give its real path")
    if not stat.S_ISDIR(st.st_mode):
        raise MalformedArtifactError(f"{root}: not a directory")
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise MalformedArtifactError(f"{root}: cannot open the model directory: {e.strerror}") from e


def open_beneath(root_fd: int, name: str, *, what: str) -> int:
    """Open the regular file `name` below `root_fd` without following any link on the way.

    Args:
        root_fd: Descriptor of the model root (`open_model_root`).
        name: A clean relative name (`validate_resource_name`).
        what: Names the model in errors.

    Returns:
        A read-only descriptor of a regular file; the caller closes it.

    Raises:
        PolicyViolationError: A path component is a symlink.
        MalformedArtifactError: The file is missing, not regular, or cannot be opened.
    """
    parts = name.split("/")
    fds: list[int] = []
    try:
        current = root_fd
        for part in parts[:-1]:
            current = _open_component(part, current, name, what, os.O_DIRECTORY)
            fds.append(current)
        fd = _open_component(parts[-1], current, name, what, 0)
    finally:
        for d in fds:
            os.close(d)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise MalformedArtifactError(f"{what}: {name!r} is not a regular file")
    return fd


def _open_component(part: str, dir_fd: int, name: str, what: str, extra: int) -> int:
    try:
        return os.open(part, _OPEN_FLAGS | extra, dir_fd=dir_fd)
    except OSError as e:
        try:
            st = os.lstat(part, dir_fd=dir_fd)
        except OSError:
            raise MalformedArtifactError(f"{what}: cannot open {name!r}: {e.strerror}") from e
        if stat.S_ISLNK(st.st_mode):
            raise PolicyViolationError(f"{what}: {name!r} is (or passes through) a symlink; refused") from e
        raise MalformedArtifactError(f"{what}: cannot open {name!r}: {e.strerror}") from e


def walk_model(root: Path, *, ignore_paths: Collection[str], limits: Limits | None = None) -> list[ModelFile]:
    """List the regular files of a model directory, sorted by name.

    Args:
        root: The model directory.
        ignore_paths: Exact relative paths to skip (files or whole directories), e.g. the signed
            `serialization.ignore_paths`.
        limits: Walk limits; defaults to `Limits()`.

    Returns:
        Every regular file not ignored, with clean names, sorted by name (POSIX byte order of UTF-8).

    Raises:
        PolicyViolationError: A symlink, FIFO, socket or device is present.
        MalformedArtifactError: The root is not a directory, a name is not clean or ambiguous, or the
            tree exceeds `limits.max_files` / `limits.max_depth`.
    """
    limits = limits or Limits()
    ignored = set(ignore_paths)
    files: list[ModelFile] = []
    seen: dict[str, str] = {}
    root_fd = open_model_root(root)
    os.close(root_fd)
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        prefix, depth = stack.pop()
        directory = os.path.join(root, prefix) if prefix else str(root)
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise MalformedArtifactError(f"{root}: cannot list {prefix or '.'!r}: {e.strerror}") from e
        for entry in entries:
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            if rel in ignored:
                continue
            validate_resource_name(rel, what=str(root), limits=limits)
            key = ambiguity_key(rel)
            if key in seen:
                raise MalformedArtifactError(
                    f"{root}: file names {seen[key]!r} and {rel!r} are ambiguous (equal after Unicode "
                    "normalisation or case folding)"
                )
            seen[key] = rel
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(entry.path)
                raise PolicyViolationError(
                    f"{root}: {rel!r} is a symlink (-> {target!r}); symlinks are refused"
                )
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > limits.max_depth:
                    raise MalformedArtifactError(f"{root}: {rel!r} is nested deeper than {limits.max_depth}")
                stack.append((rel, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                files.append(ModelFile(rel, st.st_size))
                if len(files) > limits.max_files:
                    raise MalformedArtifactError(f"{root}: more than {limits.max_files} files")
            else:
                raise PolicyViolationError(f"{root}: {rel!r} is not a regular file or directory; refused")
    files.sort(key=lambda f: f.name.encode("utf-8"))
    return files
