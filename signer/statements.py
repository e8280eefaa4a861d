"""Sign a statement of any predicate type about a model (`modelsec attest sign`, `attest provenance`).

The model root digest is computed here from the files (the same walk and SHA-256 pass as `sign`, with the
default ignore list and every bundle in the directory left out), never read from an unverified bundle. The
statement is signed by a local key backend (PEM or `pkcs11:`) or handed whole to a `BundleSigner` (the gRPC
`SigningService`, whose key's configuration says which predicate types it signs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.bundle import parse_bundle, sign_statement
from modelsec.attestations.predicates.provenance import BaseModel, Source
from modelsec.attestations.statement import Statement
from modelsec.errors import MalformedArtifactError, PolicyError
from modelsec.limits import Limits
from modelsec.signer.keys import KeyBackend
from modelsec.signer.layout import MODEL_IGNORE_PATHS
from modelsec.signer.signing import BundleSigner, compute_manifests

__all__ = [
    "SignedStatement",
    "base_model_of",
    "model_root_digest",
    "sign_statement_with",
    "source_from_checkout",
]


@dataclass(frozen=True, slots=True)
class SignedStatement:
    """A signed statement: the bundle JSON and the statement it carries."""

    statement: Statement
    bundle: bytes


def model_root_digest(
    model_dir: Path, *, ignore_paths: Sequence[str] = (), limits: Limits | None = None
) -> str:
    """The model root digest of `model_dir` (hex SHA-256 over the files' SHA-256 digests, OMS order).

    Files are walked and hashed as `sign` does: the default ignore list (`MODEL_IGNORE_PATHS`) plus
    `ignore_paths`, and every sigstore bundle in the directory, are left out. A model signed with other
    ignore paths has another digest: give the same ones.

    Raises:
        MalformedArtifactError: The directory is empty or a file is malformed.
        PolicyViolationError: A symlink or special file is present.
    """
    ignore = [*MODEL_IGNORE_PATHS, *(p for p in ignore_paths if p not in MODEL_IGNORE_PATHS)]
    manifests = compute_manifests(
        model_dir, [HashAlgorithm.SHA256], ignore_paths=ignore, tensor_hash=None, limits=limits
    )
    return manifests[HashAlgorithm.SHA256].subject_digest["sha256"]


def sign_statement_with(
    statement: Statement, signer: KeyBackend | BundleSigner, *, limits: Limits | None = None
) -> SignedStatement:
    """Sign `statement` as a DSSE bundle with a local key, or by a remote `BundleSigner`.

    Args:
        statement: The unsigned statement (e.g. `modelsec.attestations.predicates.generic.model_statement`).
        signer: A key backend (PEM, `pkcs11:`), or a `BundleSigner` that checks the returned bundle signs
            exactly this statement (`modelsec.service.client.RemoteSigner`).
        limits: `max_bundle_bytes` bounds the bundle (what verifiers accept).

    Returns:
        The statement and its bundle JSON.

    Raises:
        MalformedArtifactError: The bundle would be larger than `limits.max_bundle_bytes`.
        KeyMaterialError, BackendUnavailableError: From the key backend (a removed token).
        PermissionDeniedError, SignatureError: From a remote signer (the key may not sign this type; the
            returned bundle does not sign the statement).
    """
    bundle = (
        signer.sign_bundle(statement)
        if isinstance(signer, BundleSigner)
        else sign_statement(statement, signer)
    )
    limit = (limits or Limits()).max_bundle_bytes
    if len(bundle) > limit:
        raise MalformedArtifactError(
            f"the {statement.predicate_type} bundle would be {len(bundle)} bytes, over the {limit} bytes "
            "verifiers accept by default (limits.maxBundleBytes)"
        )
    parse_bundle(bundle, source=statement.predicate_type)
    return SignedStatement(statement, bundle)


def source_from_checkout(checkout: Path) -> Source:
    """The training code a git checkout holds: its `origin` URL (or the directory) at `HEAD`.

    Runs `git -C CHECKOUT rev-parse HEAD` and `git config --get remote.origin.url` (10 s each); nothing is
    fetched.

    Raises:
        PolicyError: `git` is missing, or `checkout` is not a git work tree with a commit.
    """
    import subprocess

    def git(*args: str) -> str:
        try:
            r = subprocess.run(
                ["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PolicyError(f"{checkout}: cannot run git: {e}") from e
        return r.stdout.strip() if r.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        raise PolicyError(f"{checkout}: not a git checkout with a commit (git rev-parse HEAD failed)")
    url = git("config", "--get", "remote.origin.url") or checkout.resolve().as_uri()
    return Source(url, commit, git("symbolic-ref", "-q", "HEAD"))


def base_model_of(base_dir: Path, *, limits: Limits | None = None) -> BaseModel:
    """A base model's root digest (computed from its files) and the SHA-256 of its signature bundle.

    The bundle is the first default-named signature in `base_dir` (`model.sig`, `model.p384.sig`, ...); its
    statement's subject must be the computed root digest (a stale signature is refused). Its signature is not
    verified here: a verifier follows the lineage under its own policy.

    Raises:
        MalformedArtifactError: No signature bundle, or it cannot be read, or it signs another model.
        PolicyViolationError: A symlink or special file in `base_dir`.
    """
    from modelsec.attestations.statement import parse_statement
    from modelsec.safe_io import read_regular_file
    from modelsec.signer.layout import find_default_bundles

    limits = limits or Limits()
    bundles = find_default_bundles(base_dir)
    if not bundles:
        raise MalformedArtifactError(f"{base_dir}: the base model has no signature bundle (sign it first)")
    data = read_regular_file(
        bundles[0], "signature bundle", max_bytes=limits.max_bundle_bytes, error=MalformedArtifactError
    )
    statement = parse_statement(
        parse_bundle(data, source=str(bundles[0])).envelope.payload, what=str(bundles[0])
    )
    root = model_root_digest(base_dir, limits=limits)
    if root not in {s.digest.get("sha256") for s in statement.subjects}:
        raise MalformedArtifactError(
            f"{bundles[0]}: signs another model than {base_dir} (root sha256:{root})"
        )
    return BaseModel(base_dir.resolve().name, root, hashlib.sha256(data).hexdigest())
