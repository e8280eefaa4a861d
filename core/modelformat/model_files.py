"""The files of a model directory: walking, name rules, ignore list, and opening without following links.

Invariants (shared by the signer and the verifier, so both see the same file set):

* The walk never follows a symbolic link and refuses any it meets (file or directory links, absolute or
  relative, cycles): symlinks are never part of a model (corpus MAN02/MAN03), so a walk is bounded by the
  real tree and by `Limits.max_files` / `Limits.max_depth`. The one exception is the Hugging Face hub
  cache layout (`<cache>/models--org--name/snapshots/<rev>/` whose entries are relative links into
  `<cache>/models--org--name/blobs/`): when the model root is such a snapshot, a link to a file is followed
  if its target, read with `readlink` and resolved lexically relative to the link's directory (no further
  link is followed), is one plain name directly inside that cache entry's `blobs/`, and that blob is a
  regular file, opened with `O_NOFOLLOW` relative to a descriptor of `blobs/`.
* Only regular files and directories may appear; FIFOs, sockets and devices are refused.
* Every relative name is a clean POSIX path (`validate_resource_name`) and no two names are equal after
  Unicode NFC normalisation and case folding (they would be one file on macOS/Windows checkouts).
* The ignore list applies with OMS semantics to relative paths as signed (a path and everything below it;
  by default the top-level `.git`, `.gitattributes`, `.github`, `.gitignore` and the signature files); a
  nested `.git` is an ordinary file unless listed; a signed resource is never ignored.
* The walk and every open go through one descriptor of the model root: directories are listed and files
  opened relative to it (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or one `O_NOFOLLOW` open
  per component where the kernel lacks it; `modelsec.modelformat.openat2`), so the directory walked is the
  directory hashed even if its path is renamed or exchanged meanwhile, and a component swapped for a link
  after the walk is refused at open time.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.openat2 import open_beneath_fd

__all__ = [
    "CODE_SUFFIXES",
    "PICKLE_SUFFIXES",
    "WEIGHT_SUFFIXES",
    "ModelFile",
    "ambiguity_key",
    "beneath_error",
    "hub_blob_name",
    "oms_order",
    "open_beneath",
    "open_dir_beneath",
    "open_model_root",
    "validate_resource_name",
    "walk_model",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".dill")
"""File name endings of pickle formats: unpickling runs code, so the loader refuses them even when signed."""
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".onnx")
"""File name endings of weights files that are not pickles (OCI weight layers; `verify` warns when none is
signed)."""
CODE_SUFFIXES = (".py", ".pyc", ".pyo")
"""File name endings of Python modules (source, and sourceless bytecode that imports as well): remote code,
refused unless a policy allows it. Like `PICKLE_SUFFIXES`, compared with the lower-cased name (`modeling.PY`
imports on a case-insensitive file system)."""
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
# One scan each in C (names are checked per manifest entry and per index target).
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# A name every rule below accepts, in one scan: printable ASCII segments without `%`, `\\` or `/`, none of
# them `.` or `..`, joined by single slashes. Anything else takes the rule-by-rule path that says why.
_CLEAN_ASCII = re.compile(
    r"(?:(?!\.\.?/)[\x20-\x24\x26-\x2e\x30-\x5b\x5d-\x7e]+/)*(?!\.\.?\Z)[\x20-\x24\x26-\x2e\x30-\x5b\x5d-\x7e]+"
)
_DEFAULT_LIMITS = Limits()
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


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
    limits = limits or _DEFAULT_LIMITS
    if not isinstance(name, str) or not name:
        raise MalformedArtifactError(f"{what}: empty or non-string file name {name!r}")
    if len(name) <= limits.max_path_bytes and _CLEAN_ASCII.fullmatch(name):
        return name  # ASCII: as many UTF-8 bytes as characters
    problem, escapes = None, True  # escapes: the name could leave the root (the message says so)
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > limits.max_path_bytes:
        problem, escapes = f"is too long ({size} bytes, limit {limits.max_path_bytes})", False
    elif name.startswith("/"):
        problem = "is absolute"
    elif "\\" in name:
        problem = "contains a backslash"
    elif _CONTROL.search(name):
        problem, escapes = "contains a NUL or control character (names must be printable text)", False
    elif _SURROGATE.search(name):
        problem, escapes = "is not valid UTF-8 (manifest names are UTF-8 text)", False
    elif _PERCENT_ESCAPE.search(name):
        problem = "contains a percent-escape"
    elif any(seg in ("", ".", "..") for seg in name.split("/")):
        problem = "has an empty, '.' or '..' segment"
    if problem:
        inside = " (must stay inside the model root)" if escapes else ""
        raise MalformedArtifactError(f"{what}: file name {_shown_name(name)} {problem}{inside}")
    return name


def _shown_name(name: str) -> str:
    r"""`name` quoted for a message; a name that is not UTF-8 shows its bytes (`b'model\xff.json'`).

    `os.listdir` decodes a byte that is not UTF-8 as a lone surrogate (`\udcff`, PEP 383), which is
    neither the byte on disk nor anything a user can type; its bytes are what `ls -b` shows.
    """
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return repr(name)
    try:
        return repr(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a surrogate that no byte decodes to (from a JSON `\ud800` escape)
        return repr(name.encode("utf-8", "surrogatepass"))


def oms_order(name: str) -> tuple[str, ...]:
    """The sort key of OMS resource order: path components, compared as `PurePosixPath` compares them.

    model_signing sorts its manifest items by `PurePosixPath`, i.e. by the tuple of path components, so
    `tokenizer.json` sorts before `tokenizer/vocab.txt` although `.` (0x2E) sorts before `/` (0x2F) byte
    by byte. Components compare by code point, which for clean names equals UTF-8 byte order.
    """
    return tuple(name.split("/"))


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


def open_dir_beneath(dir_fd: int, rel: str, *, what: str) -> int:
    """Open the directory `rel` below `dir_fd` without following any link and without leaving `dir_fd`.

    Args:
        dir_fd: The directory `rel` is resolved from (a model root, or a server's read or write root).
        rel: A relative path; `""` opens `dir_fd` itself again.
        what: Names `dir_fd` in errors.

    Returns:
        A read-only directory descriptor; the caller closes it.

    Raises:
        PolicyViolationError: A component is a symlink, or `rel` leaves `dir_fd`.
        MalformedArtifactError: A component is missing or not a directory, or cannot be opened.
    """
    try:
        return open_beneath_fd(dir_fd, rel, _DIR_FLAGS | os.O_NOFOLLOW)
    except OSError as e:
        raise beneath_error(e, rel, what) from e


def beneath_error(e: OSError, rel: str, what: str) -> PolicyViolationError | MalformedArtifactError:
    """The modelsec error for an `OSError` of `modelsec.modelformat.openat2.open_beneath_fd` on `rel`."""
    if e.errno == errno.ELOOP:
        return PolicyViolationError(f"{what}: {rel!r} is (or passes through) a symlink; refused")
    if e.errno == errno.EXDEV:
        return PolicyViolationError(f"{what}: {rel!r} leaves the directory; refused")
    if e.errno == errno.ENOTDIR:
        return MalformedArtifactError(f"{what}: {rel!r} is not a directory (or passes through a file)")
    return MalformedArtifactError(f"{what}: cannot open {rel!r}: {e.strerror}")


def open_beneath(root_fd: int, name: str, *, what: str) -> int:
    """Open the regular file `name` below `root_fd` without following any link on the way.

    Args:
        root_fd: Descriptor of the model root (`open_model_root`).
        name: A clean relative name (`validate_resource_name`).
        what: Names the model in errors.

    Returns:
        A read-only descriptor of a regular file; the caller closes it.

    A symlink is refused, except a Hugging Face hub cache snapshot's link to a blob of its own cache
    entry (see the module docstring): the blob is opened instead.

    Raises:
        PolicyViolationError: A path component is a symlink (other than a hub snapshot's blob link), or the
            blob a hub link names is itself a symlink.
        MalformedArtifactError: The file is missing, not regular, or cannot be opened.
    """
    try:
        fd = open_beneath_fd(root_fd, name, _OPEN_FLAGS)
    except OSError:
        # A link (perhaps a hub blob link), a missing file...: the component walk below names the cause.
        fd = _open_beneath_walk(root_fd, name, what)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise MalformedArtifactError(f"{what}: {name!r} is not a regular file")
    return fd


def _open_beneath_walk(root_fd: int, name: str, what: str) -> int:
    parts = name.split("/")
    fds: list[int] = []
    try:
        current = root_fd
        for part in parts[:-1]:
            current = _open_component(part, current, name, what, os.O_DIRECTORY)
            fds.append(current)
        try:
            fd = _open_component(parts[-1], current, name, what, 0)
        except PolicyViolationError:
            blob = _open_hub_blob(root_fd, current, parts[-1], len(parts) - 1, name, what)
            if blob is None:
                raise
            fd = blob
    finally:
        for d in fds:
            os.close(d)
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


def hub_blob_name(target: str, depth: int) -> str | None:
    """The blob a hub snapshot link's target names, or None when the target is anything else.

    The link sits in a directory `depth` levels below the snapshot root (`<entry>/snapshots/<rev>/`). Its
    target (as `readlink` returns it; never followed) is resolved lexically; it qualifies only if it lands
    on one plain name directly inside `<entry>/blobs/`, as the relative links `huggingface_hub` writes do
    (`../../blobs/<hash>`, `../../../blobs/<hash>` one level down). Absolute targets never qualify.

    Args:
        target: The link's target.
        depth: How many directories below the snapshot root the link's directory is.

    Returns:
        The blob's file name, or None.
    """
    if not target or target.startswith("/") or "\0" in target:
        return None
    # The link directory's path relative to the cache entry is snapshots/<rev>/<depth dirs>; placeholders
    # stand for it, so only names taken from the link text can make up the result.
    position: list[str | None] = [None] * (2 + depth)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not position:
                return None  # above the cache entry
            position.pop()
        else:
            position.append(part)
    if len(position) == 2 and position[0] == "blobs" and position[1] is not None:
        return position[1]
    return None


def _hub_blobs_fd(root_fd: int) -> int | None:
    """A descriptor of `<entry>/blobs/` when `root_fd` is `<cache>/models--*/snapshots/<rev>/`, else None.

    Parents are reached with `..` from the open root (the real parents, whatever path opened it), and each
    name is checked by inode: the root's parent is the entry's `snapshots` directory, and the entry is a
    `models--*` directory of its parent.
    """
    opened: list[int] = []
    try:
        snapshots = os.open("..", _DIR_FLAGS, dir_fd=root_fd)
        opened.append(snapshots)
        entry = os.open("..", _DIR_FLAGS, dir_fd=snapshots)
        opened.append(entry)
        cache = os.open("..", _DIR_FLAGS, dir_fd=entry)
        opened.append(cache)
        snap_st, entry_st = os.fstat(snapshots), os.fstat(entry)
        named = os.lstat("snapshots", dir_fd=entry)
        if not stat.S_ISDIR(named.st_mode) or (named.st_dev, named.st_ino) != (
            snap_st.st_dev,
            snap_st.st_ino,
        ):
            return None
        with os.scandir(cache) as it:
            names = [e.name for e in it if e.name.startswith("models--") and e.inode() == entry_st.st_ino]
        if not any(_same_dir(cache, n, entry_st) for n in names):
            return None
        return os.open("blobs", _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=entry)
    except OSError:
        return None
    finally:
        for fd in opened:
            os.close(fd)


def _same_dir(parent_fd: int, name: str, st: os.stat_result) -> bool:
    got = os.lstat(name, dir_fd=parent_fd)
    return stat.S_ISDIR(got.st_mode) and (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino)


def _open_hub_blob(root_fd: int, dir_fd: int, entry: str, depth: int, name: str, what: str) -> int | None:
    """Open the blob a hub snapshot link names (a regular file, no link followed), or None if not one."""
    try:
        blob = hub_blob_name(os.readlink(entry, dir_fd=dir_fd), depth)
    except OSError:
        return None
    if blob is None:
        return None
    blobs_fd = _hub_blobs_fd(root_fd)
    if blobs_fd is None:
        return None
    try:
        return _open_component(blob, blobs_fd, f"{name} -> blobs/{blob}", what, 0)
    finally:
        os.close(blobs_fd)


def walk_model(
    root: Path,
    *,
    ignore_paths: Collection[str],
    limits: Limits | None = None,
    ignore_lists: Sequence[Collection[str]] = (),
    keep: Collection[str] = (),
    root_fd: int | None = None,
) -> list[ModelFile]:
    """List the regular files of a model directory, in OMS order.

    The directory is opened once (or `root_fd` is used) and walked through that descriptor only: every
    subdirectory is opened beneath it without following links, so the tree listed is the one a caller
    hashing through the same descriptor reads, whatever happens to the path `root` meanwhile.

    Ignoring follows OMS (`model_signing._serialization.serialization.should_ignore`): a listed path
    excludes itself and everything below it (`path.is_relative_to(ignored)`); a nested `.git` is an
    ordinary file unless the list names it. A name in `keep` (the signed resources) is never ignored: the
    walk descends into an ignored directory only to find kept names.

    Symlinks are refused, except a hub cache snapshot's links to blobs of its own cache entry (module
    docstring), which are listed under the link's name with the blob's size.

    Args:
        root: The model directory.
        ignore_paths: Relative paths always skipped (files or whole directories), e.g. the ignore list
            being signed, or the bundle files a verifier reads.
        limits: Walk limits; defaults to `Limits()`.
        ignore_lists: Further ignore lists (the signed lists of several bundles): a path is also skipped
            when every one of them ignores it.
        keep: Names never skipped (the signed resources).
        root_fd: An open descriptor of `root` to walk (not closed here); `root` then only names the
            model in messages. Default: `root` is opened with `open_model_root`.

    Returns:
        Every regular file not ignored, with clean names, in OMS order (`oms_order`).

    Raises:
        PolicyViolationError: A symlink (other than a hub blob link), FIFO, socket or device is present.
        MalformedArtifactError: The root is not a directory, a name is not clean or ambiguous, the
            tree exceeds `limits.max_files` / `limits.max_depth`, or an entry vanished or changed type
            while it was walked.
    """
    limits = limits or Limits()
    always = frozenset(ignore_paths)
    lists = [frozenset(x) for x in ignore_lists]
    kept = frozenset(keep)
    kept_dirs = {n.rsplit("/", 1)[0] for n in kept if "/" in n}
    for d in list(kept_dirs):
        while "/" in d:
            d = d.rsplit("/", 1)[0]
            kept_dirs.add(d)

    def ignored(rel: str) -> bool:
        return rel in always or (bool(lists) and all(rel in x for x in lists))

    files: list[ModelFile] = []
    seen: dict[str, str] = {}
    own_fd = root_fd is None
    if root_fd is None:
        root_fd = open_model_root(root)
    blobs: list[int] = []  # the hub cache entry's blobs/ descriptor, opened at its first link
    dir_fd = -1
    try:
        # (directory prefix, depth, whether an ancestor is ignored: then only kept names are listed)
        stack: list[tuple[str, int, bool]] = [("", 0, False)]
        while stack:
            prefix, depth, under_ignored = stack.pop()
            dir_fd = root_fd if not prefix else _open_walk_dir(root_fd, prefix, root)
            try:
                entries = sorted(os.listdir(dir_fd))
            except OSError as e:
                raise MalformedArtifactError(f"{root}: cannot list {prefix or '.'!r}: {e.strerror}") from e
            for entry in entries:
                rel = f"{prefix}/{entry}" if prefix else entry
                skip = under_ignored or ignored(rel)
                if skip and rel not in kept and rel not in kept_dirs:
                    continue
                validate_resource_name(rel, what=str(root), limits=limits)
                key = ambiguity_key(rel)
                if key in seen:
                    raise MalformedArtifactError(
                        f"{root}: file names {seen[key]!r} and {rel!r} are ambiguous (equal after Unicode "
                        "normalisation or case folding)"
                    )
                seen[key] = rel
                st = _entry_stat(dir_fd, entry, rel, depth, root, root_fd, blobs)
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 > limits.max_depth:
                        raise MalformedArtifactError(
                            f"{root}: {rel!r} is nested deeper than {limits.max_depth}"
                        )
                    stack.append((rel, depth + 1, skip))
                elif skip and rel not in kept:
                    continue  # an ignored file whose name is a kept directory's
                elif stat.S_ISREG(st.st_mode):
                    files.append(ModelFile(rel, st.st_size))
                    if len(files) > limits.max_files:
                        raise MalformedArtifactError(f"{root}: more than {limits.max_files} files")
                else:
                    raise PolicyViolationError(f"{root}: {rel!r} is not a regular file or directory; refused")
            if dir_fd != root_fd:
                os.close(dir_fd)
            dir_fd = -1
    finally:
        if dir_fd not in (-1, root_fd):
            os.close(dir_fd)
        if own_fd:
            os.close(root_fd)
        for fd in blobs:
            os.close(fd)
    files.sort(key=lambda f: oms_order(f.name))
    return files


def _entry_stat(
    dir_fd: int, entry: str, rel: str, depth: int, root: Path, root_fd: int, blobs: list[int]
) -> os.stat_result:
    """The entry's own status, or its blob's for a hub snapshot's blob link (any other link is refused)."""
    try:
        st = os.lstat(entry, dir_fd=dir_fd)
        target = os.readlink(entry, dir_fd=dir_fd) if stat.S_ISLNK(st.st_mode) else ""
    except OSError as e:
        # Listed, then gone or replaced: the tree changed under the walk.
        raise MalformedArtifactError(
            f"{root}: {rel!r} vanished or changed type during the walk: {e.strerror}"
        ) from e
    if not stat.S_ISLNK(st.st_mode):
        return st
    blob = hub_blob_name(target, depth)
    if blob is not None and not blobs:
        blobs_fd = _hub_blobs_fd(root_fd)
        if blobs_fd is not None:
            blobs.append(blobs_fd)
    if blob is None or not blobs:
        raise PolicyViolationError(
            f"{root}: {rel!r} is a symlink (-> {target!r}); symlinks are refused (only a "
            "Hugging Face cache snapshot's links into its own blobs/ are followed)"
        )
    return _hub_blob_stat(blobs[0], blob, rel, root)


def _open_walk_dir(root_fd: int, prefix: str, root: Path) -> int:
    try:
        return open_beneath_fd(root_fd, prefix, _DIR_FLAGS | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EXDEV):
            raise beneath_error(e, prefix, str(root)) from e
        # Listed as a directory, then gone or replaced: the tree changed under the walk.
        raise MalformedArtifactError(
            f"{root}: {prefix!r} vanished or changed type during the walk: {e.strerror}"
        ) from e


def _hub_blob_stat(blobs_fd: int, blob: str, rel: str, root: Path) -> os.stat_result:
    try:
        st = os.lstat(blob, dir_fd=blobs_fd)
    except OSError as e:
        raise MalformedArtifactError(
            f"{root}: {rel!r} links to blobs/{blob}, which is unreadable: {e.strerror}"
        ) from e
    if not stat.S_ISREG(st.st_mode):
        raise PolicyViolationError(
            f"{root}: {rel!r} links to blobs/{blob}, which is not a regular file (a link or directory); "
            "refused"
        )
    return st
