"""A KServe storage initializer: `modelsec+oci://` models pulled, verified, and only then placed (issue 28.3).

KServe runs the container of the `ClusterStorageContainer` whose `supportedUriFormats` match a predictor's
`storageUri` as the init container `storage-initializer`, appending the arguments `SRC DEST` (KServe 0.15+:
`SRC DEST [SRC DEST]...`, one pair per `storageUris[]` entry) to its `command`; `DEST` is `/mnt/models` (or a
`storageUris[].mountPath`) on an `emptyDir` that the predictor then mounts read-only. KServe claims `oci://`
for its modelcars, so the initializer claims a scheme of its own, `modelsec+oci://`: the rest of the URI is
the `oci://` reference that `modelsec pull` takes (`modelsec.distribution.push_pull.pull_model`, which states
the order of checks).

Placement, the invariant: the destination receives the model only after everything verified, and never
receives part of a refused model.

* A destination that does not exist is created by `pull_model` itself (one `rename` of its verified
  staging directory, made in the destination's parent).
* An empty directory (KServe's `emptyDir` mount point, which cannot be replaced by a rename) is filled from
  a staging directory made inside it (so on its file system): the model is pulled and verified there, then
  each top-level entry is renamed into the destination. If a rename fails, the entries already moved are
  removed again. Staging directories a killed earlier run left behind (`.modelsec-pull-*` directories,
  never links or files) are removed first.
* A destination that holds anything else is refused (`PolicyError`), and nothing in it is touched: the
  initializer never merges a model into, or overwrites, files it did not verify. KServe gives every Pod a
  fresh `emptyDir`; it holds files only if the init container runs again in a Pod whose volume is already
  filled, and the remedy is to delete the Pod.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from pathlib import Path

from modelsec.distribution.push_pull import PullResult, pull_model
from modelsec.errors import InvalidReferenceError, PolicyError
from modelsec.policy import Policy
from modelsec.registry.client import RegistryOptions, parse_reference
from modelsec.registry.reference import INITIALIZER_SCHEME
from modelsec.verifier.admission import ModelAdmission

__all__ = ["SCHEME", "STAGING_PREFIX", "initialize_model", "oci_reference"]

SCHEME = INITIALIZER_SCHEME  # parsed as an OCI reference everywhere (`modelsec.registry.reference`)
STAGING_PREFIX = ".modelsec-pull-"  # pull_model's own staging prefix, so one clean-up finds both


def oci_reference(uri: str) -> str:
    """The `oci://` reference that a `modelsec+oci://` storage URI names.

    Args:
        uri: `modelsec+oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]`.

    Returns:
        `oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]` (syntax checked, not resolved).

    Raises:
        InvalidReferenceError: `uri` does not start with `modelsec+oci://` (an `oci://` URI is KServe's
            modelcar format, never routed here), or the rest is not a valid reference.
    """
    if not uri.startswith(SCHEME):
        raise InvalidReferenceError(uri, f"the storage initializer serves {SCHEME} URIs only")
    reference = "oci://" + uri[len(SCHEME) :]
    parse_reference(reference)
    return reference


def _remove_stale_staging(destination: Path) -> None:
    """Remove the staging directories an interrupted run left in `destination` (directories only)."""
    with os.scandir(destination) as entries:
        stale = [
            e.path for e in entries if e.name.startswith(STAGING_PREFIX) and e.is_dir(follow_symlinks=False)
        ]
    for path in stale:
        shutil.rmtree(path)


def initialize_model(
    uri: str,
    destination: str | os.PathLike[str],
    policy: Policy | ModelAdmission,
    *,
    options: RegistryOptions | None = None,
) -> PullResult:
    """Pull the model `uri` names, verify it and its evidence, and only then place it at `destination`.

    Everything `pull_model` verifies is verified (the manifest by digest, a trusted binding of the manifest
    to the model root digest, every layer against its digest, `verify_model` over the staged directory and
    the policy's attestation requirements) before any file reaches `destination`; see the module docstring
    for how an existing destination is treated. A tag is resolved to its manifest digest (as `pull` does);
    the result names the digest that was verified.

    Args:
        uri: `modelsec+oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]`.
        destination: A directory to create, or an empty directory to fill (KServe's `/mnt/models`).
        policy: As for `pull_model` (an admission of every policy matching the reference).
        options: Registry connection and credentials (default: from the environment).

    Returns:
        The pull result, its `path` being `destination`.

    Raises:
        InvalidReferenceError: `uri` is not a `modelsec+oci://` reference.
        PolicyError: `destination` holds files, is not a directory, or cannot hold a staging directory.
        MalformedArtifactError, DigestMismatchError, SignatureError, FileSetMismatchError,
            PolicyViolationError, AttestationError: From `pull_model`: the model must not be trusted.
        NotFoundError, BackendUnavailableError: The artifact or the registry is missing.
    """
    destination = Path(destination)
    reference = oci_reference(uri)
    destination = Path(destination)
    if not os.path.lexists(destination):
        return pull_model(reference, destination, policy, options=options)
    if destination.is_symlink() or not destination.is_dir():
        raise PolicyError(f"{destination}: not a directory; the initializer fills an empty directory")
    try:
        _remove_stale_staging(destination)
        held = sorted(os.listdir(destination))
    except OSError as e:
        raise PolicyError(f"{destination}: cannot be read: {e.strerror}") from e
    if held:
        shown = ", ".join(held[:5]) + (", …" if len(held) > 5 else "")
        raise PolicyError(
            f"{destination}: holds {len(held)} entries ({shown}); the initializer fills an empty directory "
            "and never merges a model into files it did not verify"
        )
    inner = destination / f"{STAGING_PREFIX}{secrets.token_hex(8)}"
    result = pull_model(reference, inner, policy, options=options)
    moved: list[Path] = []
    try:
        for name in sorted(os.listdir(inner)):
            os.rename(inner / name, destination / name)
            moved.append(destination / name)
        os.rmdir(inner)
    except BaseException as e:
        for path in moved:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        shutil.rmtree(inner, ignore_errors=True)
        if isinstance(e, OSError):
            raise PolicyError(f"{destination}: the verified model could not be placed: {e.strerror}") from e
        raise
    return dataclasses.replace(result, path=destination)
