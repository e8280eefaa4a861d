"""Where bundles live in a model directory: reserved names, the signed ignore list, discovery, writing.

The one home of the layout a signer and every verifier must agree on:

* the reserved bundle names: one default weights-signature name per registered signature scheme
  (`SIGNATURE_FILE_NAMES`, in registration order) and the attestation names (`ATTESTATION_FILE_NAMES`:
  `model.watermark.sig`, `model.gate.sig`; DESIGN.md decision 1), and the folder `model.attestations/`
  (`STATEMENTS_DIR_NAME`) holding statements of any other predicate type;
* the ignore list signing records in every manifest (`MODEL_IGNORE_PATHS`: top-level git metadata, then the
  signature names, then the attestation names, then the statements folder). Its order is recorded in signed
  manifests: entries are only ever appended, never reordered;
* finding bundles: the default-named ones present in a directory (`find_default_bundles`,
  `find_attestation_files`) and sigstore bundles under custom names (`find_bundle_files`);
* writing a bundle atomically, never through a symlink (`write_bundle_file`, `write_bundle_at`).

Nothing here reads a bundle's signature or decides trust; `modelsec.verifier` does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelsec.errors import BundleExistsError, Error, MalformedArtifactError, ModelMovedError, PolicyError
from modelsec.limits import Limits
from modelsec.modelformat.model_files import open_beneath, open_model_root

__all__ = [
    "ATTESTATION_FILE_NAMES",
    "BUNDLE_SUFFIXES",
    "DEFAULT_IGNORE_PATHS",
    "GATE_BUNDLE_NAME",
    "MODEL_IGNORE_PATHS",
    "OMS_BUNDLE_NAME",
    "RESERVED_BUNDLE_NAMES",
    "SIGNATURE_FILE_NAMES",
    "STATEMENTS_DIR_NAME",
    "WATERMARK_BUNDLE_NAME",
    "find_attestation_files",
    "find_bundle_files",
    "find_default_bundles",
    "relative_ignore_paths",
    "write_bundle_at",
    "write_bundle_file",
]

# Top-level git metadata: never part of a model (OMS and model_signing leave the same names out).
DEFAULT_IGNORE_PATHS: tuple[str, ...] = (".git", ".gitattributes", ".github", ".gitignore")

# Attestations may live next to the weights under these reserved names (DESIGN.md decision 1).
WATERMARK_BUNDLE_NAME = "model.watermark.sig"
GATE_BUNDLE_NAME = "model.gate.sig"
ATTESTATION_FILE_NAMES: tuple[str, ...] = (WATERMARK_BUNDLE_NAME, GATE_BUNDLE_NAME)
# Statements of any other predicate type (`attest sign`, `attest provenance`) live beside the weights in this
# reserved folder, one bundle per file (`<type slug>.sig`): a name reserved once for every type to come.
STATEMENTS_DIR_NAME = "model.attestations"

if TYPE_CHECKING:
    # The registered schemes' default bundle names (`modelsec.signer.schemes`): a new scheme's name joins the
    # ignore list recorded in every manifest signed from then on.
    SIGNATURE_FILE_NAMES: tuple[str, ...]
    # What signing leaves out and records in `serialization.ignore_paths`: top-level git metadata, the weights
    # signature bundles, the attestation bundles and the statements folder (appended last, issue 29).
    MODEL_IGNORE_PATHS: tuple[str, ...]
    # Every reserved bundle name: never a model file, whichever manifest's ignore list names it.
    RESERVED_BUNDLE_NAMES: tuple[str, ...]


@functools.cache
def _scheme_names() -> dict[str, tuple[str, ...]]:
    """The names that depend on the scheme registry, made at first use (PEP 562 `__getattr__` below).

    Asking the registry imports every scheme's module, which the loader's import need not pay for (issue 32).
    """
    from modelsec.signer.schemes import all_schemes

    signatures = tuple(s.default_bundle_name for s in all_schemes())
    return {
        "SIGNATURE_FILE_NAMES": signatures,
        "MODEL_IGNORE_PATHS": (
            *DEFAULT_IGNORE_PATHS,
            *signatures,
            *ATTESTATION_FILE_NAMES,
            STATEMENTS_DIR_NAME,
        ),
        "RESERVED_BUNDLE_NAMES": (*signatures, *ATTESTATION_FILE_NAMES, STATEMENTS_DIR_NAME),
    }


def __getattr__(name: str) -> Any:
    # Only these names: another one missing (a partly initialised module, an import cycle) imports nothing.
    if name not in ("SIGNATURE_FILE_NAMES", "MODEL_IGNORE_PATHS", "RESERVED_BUNDLE_NAMES"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _scheme_names()[name]
    globals()[name] = value  # later lookups skip this function
    return value


# The one name model_signing writes every bundle to, whatever its key (`check_bundle_name` in
# `modelsec.verifier.trust.bundles` accepts any certified scheme under it).
OMS_BUNDLE_NAME = "model.sig"


def find_default_bundles(model_dir: Path, *, root_fd: int | None = None) -> list[Path]:
    """The default bundle names (`model.sig`, `model.p384.sig`, `model.sm2.sig`, ...) present in `model_dir`.

    Only names are looked at (`lstat`, no link followed); nothing is read or verified.

    Args:
        model_dir: The model directory.
        root_fd: A descriptor of `model_dir` to look through instead of its path; a name that cannot be
            examined there counts as present, so that reading it reports why.

    Returns:
        The paths, in the order of `SIGNATURE_FILE_NAMES`.
    """
    return _present_names(model_dir, _scheme_names()["SIGNATURE_FILE_NAMES"], root_fd)


def find_attestation_files(model_dir: Path, *, root_fd: int | None = None) -> list[Path]:
    """The reserved attestation names (`model.watermark.sig`, `model.gate.sig`) present in `model_dir`.

    Only names are looked at, as `find_default_bundles` does; nothing is read or verified.

    Args:
        model_dir: The model directory.
        root_fd: A descriptor of `model_dir` to look through instead of its path.

    Returns:
        The paths, in the order of `ATTESTATION_FILE_NAMES`.
    """
    return _present_names(model_dir, ATTESTATION_FILE_NAMES, root_fd)


def _present_names(model_dir: Path, names: Sequence[str], root_fd: int | None) -> list[Path]:
    if root_fd is None:
        return [model_dir / n for n in names if os.path.lexists(model_dir / n)]
    return [model_dir / n for n in names if _present_at(root_fd, n)]


def _present_at(root_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=root_fd)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # present but unreadable: reading it reports why
    return True


# The file name endings of a sigstore bundle written under a custom name (`find_bundle_files`).
BUNDLE_SUFFIXES = (".sig", ".sigstore", ".sigstore.json", ".bundle")
_BUNDLE_MEDIA_TYPE_PREFIX = b"application/vnd.dev.sigstore.bundle"


def find_bundle_files(model_dir: Path, names: Sequence[str], limits: Limits | None = None) -> list[str]:
    """The files among `names` that are sigstore bundles (signatures of this or another model).

    A bundle written under a custom name inside the model directory (`sign --signature model/x.sig`,
    model_signing's `--signature`) must not become a signed model file of the next `sign`: names ending
    in `.sig`, `.sigstore`, `.sigstore.json` or `.bundle`, of at most `Limits.max_bundle_bytes`, whose JSON
    `mediaType` starts with `application/vnd.dev.sigstore.bundle` are reported. Nothing in them is
    verified; the caller records them in the signed ignore list.

    Args:
        model_dir: The model directory.
        names: Relative names from `walk_model`.
        limits: Size limit; defaults to `Limits()`.

    Returns:
        The bundle files among `names`, in their order.
    """
    limits = limits or Limits()
    found: list[str] = []
    candidates = [n for n in names if n.endswith(BUNDLE_SUFFIXES)]
    if not candidates:
        return found
    root_fd = open_model_root(model_dir)
    try:
        for name in candidates:
            try:
                fd = open_beneath(root_fd, name, what=str(model_dir))
            except Error:
                continue  # the walk or the hashing pass reports it
            with os.fdopen(fd, "rb") as f:
                data = f.read(limits.max_bundle_bytes + 1)
            if len(data) > limits.max_bundle_bytes or _BUNDLE_MEDIA_TYPE_PREFIX not in data[:4096]:
                continue
            try:
                doc = json.loads(data)
            except ValueError:
                continue
            media = doc.get("mediaType") if isinstance(doc, dict) else None
            if isinstance(media, str) and media.startswith(_BUNDLE_MEDIA_TYPE_PREFIX.decode()):
                found.append(name)
    finally:
        os.close(root_fd)
    return found


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError as e:  # a link exchanged between its lstat and its readlink
        raise ModelMovedError(str(path), f"cannot resolve its real path: {e.strerror}") from e


def relative_ignore_paths(
    model_path: Path, paths: Sequence[Path | str], *, strict: bool = False, missing_ok: bool = False
) -> list[str]:
    """Ignore paths as OMS records them: relative to the model root.

    Resolved as model_signing's CLI resolves `--ignore-paths` (`_resolve_ignore_paths`), so that one command
    line ignores the same files with either tool: a relative path is taken relative to the current
    directory (not the model directory), an absolute one as given; both are resolved (links followed) and
    kept as a POSIX path relative to the model root. `foo/` and `./foo` become `foo`. model_signing drops
    a path that lands outside the model without a word; with `strict` (what `modelsec sign` and `digest`
    use) such a path, or one that does not exist, is refused instead, since it ignores nothing the user
    meant. `verify` passes `missing_ok` too: an ignored file may rightly be absent from the copy verified.

    Args:
        model_path: The model directory.
        paths: The paths as given on the command line.
        strict: Refuse paths outside the model or that do not exist (default: drop outside paths silently,
            keep missing ones, as model_signing does).
        missing_ok: With `strict`, keep a path that does not exist (only outside paths are refused).

    Returns:
        The relative names, each once, in the order given.

    Raises:
        MalformedArtifactError: A path names the model root itself.
        ModelMovedError: A path changed while it was resolved (a link exchanged meanwhile).
        PolicyError: With `strict`: a path lands outside the model directory or (without `missing_ok`) does
            not exist (the message names the path as given and where it resolved).
    """
    if not paths:
        return []
    root = _resolved(model_path)
    result: list[str] = []
    for p in paths:
        candidate = Path(p)
        full = _resolved(candidate if candidate.is_absolute() else Path.cwd() / candidate)
        try:
            rel = full.relative_to(root)
        except ValueError:
            if strict:
                hint = (
                    ""
                    if candidate.is_absolute()
                    else " (a relative ignore path is taken from the current directory, as model_signing's "
                    f"--ignore-paths takes it: write {str(model_path / candidate)!r} for a file of the model)"
                )
                where = f"resolves to {full}, outside the model directory {model_path}"
                raise PolicyError(f"ignore path {str(p)!r} {where}{hint}") from None
            continue
        if not rel.parts:
            raise MalformedArtifactError(f"{model_path}: an ignore path names the model itself: {p}")
        if strict and not missing_ok and not full.exists():
            raise PolicyError(f"ignore path {str(p)!r} does not exist ({full}): it would ignore nothing")
        name = rel.as_posix()
        if name not in result:
            result.append(name)
    return result


def write_bundle_file(path: Path, data: bytes, *, what: str = "bundle", replace: bool = True) -> Path:
    """Write a bundle (or attestation) file atomically: a temporary file in the same directory, fsync, rename.

    Never writes through a symlink; the file ends up mode 0644. With `replace` false an existing `path` is
    never replaced, not even one created after the caller looked: the finished file is linked onto `path`
    (`link(2)` fails on an existing name) instead of renamed over it. Returns `path`.

    Raises:
        BundleExistsError: `replace` is false and `path` exists (nothing is written).
        PolicyError: `path` is a symlink, or cannot be written (missing directory, permissions, disk full;
            the message names the file and the reason): the output option must change.
    """
    if path.is_symlink():
        raise PolicyError(f"{path}: refusing to write the {what} through a symlink")
    import tempfile  # writers only: the verifier imports this module for its names

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            if replace:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path, follow_symlinks=False)
                except FileExistsError:
                    raise BundleExistsError(
                        str(path), f"a {what} exists already and would be replaced"
                    ) from None
                finally:
                    os.unlink(tmp)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise PolicyError(f"{path}: cannot write the {what}: {e.strerror}") from e
    return path


def write_bundle_at(directory: Path, name: str, data: bytes, *, what: str) -> None:
    """Write `directory/name` atomically through a descriptor of `directory` (opened without following it).

    The bytes go to a fresh temporary name created with `O_EXCL | O_NOFOLLOW` in that directory, are
    synced, and are renamed onto `name` within the same descriptor, so neither step can be redirected by a
    link planted meanwhile.

    Raises:
        PolicyError: `directory` is a link or cannot be opened, or the file cannot be written.
    """
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise PolicyError(f"{directory}: cannot open the directory for the {what}: {e.strerror}") from e
    import secrets

    tmp = f".{name}.{secrets.token_hex(8)}"
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    except OSError as e:
        raise PolicyError(f"{directory}/{name}: cannot write the {what}: {e.strerror}") from e
    finally:
        os.close(dir_fd)
