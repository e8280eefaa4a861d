"""`modelsec verify`, `digest` and `inspect`: check a model, print its root digest, show its bundles.

Registered on the root group by `modelsec.cli.main`. The trust decision is `modelsec.verifier.verify_model`'s;
the commands convert options into a `Policy` (options only tighten a policy file) and print the result.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.cli.common import (
    POLICY_ENV,
    digest_str,
    fail,
    ignore_paths_option,
    json_option,
    limits,
    progress_bar,
    quiet_option,
    reply,
    signatures_option,
    signer_json,
    signer_text,
    skipped_note,
    trusted_keys_option,
)
from modelsec.cli.identity import IdentityOptions, identity_options
from modelsec.cli.values import expected_digests_value
from modelsec.errors import Error, SignatureError

__all__ = ["digest", "inspect", "verify"]


def _signature_hint(e: Error, model_path: Path, signatures: tuple[Path, ...]) -> str | None:
    """The CLI's advice for a model without default bundles (the library's message names no option)."""
    from modelsec.signer.layout import find_default_bundles

    if signatures or not isinstance(e, SignatureError):
        return None
    model_dir = model_path if model_path.is_dir() else model_path.parent
    return None if find_default_bundles(model_dir) else "give --signature"


def _policy_from_options(
    model_path: Path,
    keys: tuple[Path, ...],
    policy_file: Path | None,
    required: list[SignatureAlgorithm],
    allow_remote_code: bool,
    identity: IdentityOptions | None = None,
) -> Any:
    """The model's admission from --trusted-key, or from --policy / $MODELSEC_POLICY (options only tighten).

    From a policy file, every policy matching the model must pass (`modelsec.verifier.admission.admit_model`).

    `required` (--require) is applied by `ModelAdmission.requiring`: to every matching policy able to make
    each algorithm's signatures, in any file order.

    Raises:
        click.UsageError: Contradicting options, or no policy source.
        PolicyError: The policy file is invalid, or no matching policy can meet `required`.
        PolicyViolationError: No policy matches the model (`noMatch: deny`).
        KeyMaterialError: A key cannot be read or parsed.
    """
    from modelsec.policy import Policy, PolicySet
    from modelsec.verifier.admission import ModelAdmission, admit_model

    if identity is not None and (
        by_identity := identity.policy(keys, policy_file, required, allow_remote_code)
    ):
        return by_identity
    if keys and policy_file:
        raise click.UsageError("give --trusted-key or --policy, not both")
    if keys:
        policy = Policy.from_key_files(keys, allow_remote_code=allow_remote_code)
        return ModelAdmission.of(policy).requiring(required)
    if not policy_file and not os.environ.get(POLICY_ENV):
        raise click.UsageError(f"give --trusted-key, --policy, or set ${POLICY_ENV}")
    policy_set = PolicySet.from_file(policy_file) if policy_file else PolicySet.from_env()
    admission = admit_model(model_path, policy_set)
    if allow_remote_code and not admission.policy.allow_remote_code:
        raise click.UsageError("--allow-remote-code cannot loosen a policy file; set allowRemoteCode there")
    return admission.requiring(required)


def _expected_digests(model_dir: Path, options: tuple[str, ...]) -> frozenset[str] | None:
    """The root digests the model may have: --expected-digest and $MODELSEC_MODEL_DIGEST, both pinning.

    Raises:
        PolicyError: A digest is malformed, or the two pins have no digest in common.
    """
    from modelsec.policy import model_uri
    from modelsec.verifier.pinning import pinned_root_digests

    return pinned_root_digests(model_uri(model_dir), options or None, option="--expected-digest")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _verify_warnings(result: Any, model_path: Path) -> list[str]:
    """What a passed verification does not cover that a user would assume it does."""
    from modelsec.modelformat.model_files import WEIGHT_SUFFIXES

    manifest = result.manifest
    names = [model_path.name] if manifest.single_file else list(manifest.names)
    if any(n.lower().endswith(WEIGHT_SUFFIXES) for n in names):
        return []
    return [
        f"the verified bundle signs no weights file ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}), only "
        f"{_count(len(names), 'file')}: any weights in {model_path} are unsigned"
    ]


def _parse_require(value: str | None) -> list[SignatureAlgorithm]:
    if not value:
        return []
    try:
        return [SignatureAlgorithm(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        choices = ", ".join(a.value for a in SignatureAlgorithm)
        raise click.BadParameter(f"{value!r}: choose from {choices}", param_hint="--require") from None


@click.command(name="verify")
@click.argument("model_path", type=click.Path(path_type=Path))
@trusted_keys_option(
    "Trusted public key PEM (repeatable). Keys are never taken from the bundle. "
    f"Without --trusted-key, the policy file of --policy or ${POLICY_ENV} decides."
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path),
    help="Policy file (YAML/JSON, kind ModelPolicy); the model is matched as file://<real path>.",
)
@click.option(
    "--shard",
    "shards",
    multiple=True,
    metavar="NAME",
    help="Verify only this signed file of MODEL_PATH (repeatable), e.g. the shard a node holds.",
)
@signatures_option(
    "Bundle to check (repeatable; default: model.sig, model.p384.sig, model.sm2.sig, "
    "model.ml-dsa-{44,65,87}.sig found in the model directory)."
)
@click.option(
    "--require",
    "require",
    metavar="ALG[,ALG]",
    help="Algorithms that must all have signed, e.g. ecdsa-p256,sm2. Each is required of every matching "
    "policy that trusts a key (or authority) able to make its signatures, whatever their order; an "
    "algorithm no matching policy can verify is refused (exit 1).",
)
@click.option(
    "--allow-remote-code",
    is_flag=True,
    help="Accept Python modules (*.py, *.pyc, *.pyo) and auto_map in config files (refused by default).",
)
@ignore_paths_option(
    "Also ignore this unsigned path (repeatable; as model_signing's --ignore-paths: a relative path is taken "
    "from the current directory). Signed files are verified all the same. A path outside the model directory "
    "is refused (usage error); one that does not exist is fine."
)
@click.option(
    "--expected-digest",
    "expected_digests",
    multiple=True,
    metavar="sha256:HEX",
    callback=expected_digests_value,
    help="Model root digest the signed model must have (repeatable: any one). Without a pin (this option "
    "or $MODELSEC_MODEL_DIGEST, which is read as the runtime guard reads it), an older signed release "
    "verifies too.",
)
@identity_options
@json_option
@quiet_option
def verify(
    model_path: Path,
    keys: tuple[Path, ...],
    identity: IdentityOptions,
    policy_file: Path | None,
    shards: tuple[str, ...],
    signatures: tuple[Path, ...],
    require: str | None,
    allow_remote_code: bool,
    ignore_paths: tuple[Path, ...],
    expected_digests: tuple[str, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Verify MODEL_PATH (a model directory, or one file of it) against its signatures.

    Exit 0 when every signed file and tensor matches and a trusted key signed; exit 1 otherwise. Pickle
    checkpoints and remote code are refused even when signed. Every policy of the file that matches
    MODEL_PATH must pass, except that a failing one in `mode: warn` only prints a warning; --require
    tightens each of them that trusts a key able to meet it. An older release signed by the same key
    verifies too, unless the root digest is pinned (--expected-digest).
    """
    from modelsec.signer.layout import relative_ignore_paths
    from modelsec.verifier import verify_model

    required = _parse_require(require)
    try:
        model_dir = model_path if model_path.is_dir() else model_path.parent
        try:
            ignored = relative_ignore_paths(model_dir, ignore_paths, strict=True, missing_ok=True)
        except Error as e:
            raise click.UsageError(f"--ignore-paths: {e.diagnostics()}") from e
        pinned = _expected_digests(model_dir, expected_digests)
        policy = _policy_from_options(model_path, keys, policy_file, required, allow_remote_code, identity)
        with progress_bar(model_path, "verifying", not (quiet or as_json)) as progress:
            result = verify_model(
                model_path,
                policy,
                bundles=list(signatures) or None,
                files=list(shards) or None,
                progress=progress,
                ignore_paths=ignored,
                expected_digests=pinned,
            )
    except Error as e:
        fail(e, as_json, hint=_signature_hint(e, model_path, signatures))
    warnings = [*result.warnings, *_verify_warnings(result, model_path)]
    if as_json:
        reply(
            {
                "rootDigest": digest_str(result.root_digest),
                "files": result.files,
                "tensors": result.tensors,
                "tensorDigests": result.tensor_digests,
                "bytesHashed": result.bytes_hashed,
                "bundles": [
                    {
                        "path": str(b.path),
                        "algorithm": b.algorithm.value,
                        "key": b.key.name,  # deprecated: signer.key (kept for scripts reading it)
                        "keyid": b.key.keyid,
                        "signer": signer_json(b.key),
                    }
                    for b in result.bundles
                ],
                "skipped": [str(p) for p in result.skipped],
                "attestations": result.attestations.to_json() if result.attestations else None,
                "wholeModel": result.whole_model,
                "warnings": warnings,
            }
        )
        return
    algs = ", ".join(f"{b.algorithm.value} ({b.key.name})" for b in result.bundles)
    tensors = _count(result.tensors, "tensor")
    counts = f"{tensors} ({result.tensor_digests} with per-tensor digests); signed by {algs}"
    if result.whole_model:
        click.echo(f"OK sha256:{result.root_digest}: {_count(result.files, 'signed file')}, {counts}")
    else:
        # The other files are not read, so the root digest over all of them is not checked: not printed.
        checked = ", ".join(shards) if shards else model_path.name
        total = len(result.manifest.names)
        click.echo(
            f"OK {checked} ({result.files} of {_count(total, 'signed file')}; the others and the model root "
            f"digest not checked): {counts}"
        )
    for w in warnings:
        click.echo(f"  warning: {w}", err=True)
    for p in result.skipped:
        click.echo(f"  note: {p} not checked (no configured key of its algorithm)", err=True)


@click.command(name="digest")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--hash-type",
    type=click.Choice([HashAlgorithm.SHA256.value, HashAlgorithm.BLAKE3.value, HashAlgorithm.SM3.value]),
    default=HashAlgorithm.SHA256.value,
    show_default=True,
    help="File digest of the manifest whose root to print: the OMS root is SHA-256 over these digests "
    "(blake3: model_signing's blake3 bundles; sm3: equals sha256, as SM2 bundles carry the SHA-256 root).",
)
@ignore_paths_option(
    "Leave this path out, as `sign --ignore-paths` does (repeatable; a path outside MODEL_DIR, or one that "
    "does not exist, is refused)."
)
@json_option
@quiet_option
def digest(
    model_dir: Path, hash_type: str, ignore_paths: tuple[Path, ...], as_json: bool, quiet: bool
) -> None:
    """Print the model root digest of MODEL_DIR (OMS SHA-256 subject digest; nothing is verified).

    It equals the root digest `verify` reports for a bundle of that hash type signed over the same files
    with the same ignore paths (OMS path order).
    """
    from modelsec.signer import compute_manifests
    from modelsec.signer.layout import MODEL_IGNORE_PATHS, relative_ignore_paths

    algorithm = HashAlgorithm(hash_type)
    try:
        try:
            extra = relative_ignore_paths(model_dir, ignore_paths, strict=True)
        except Error as e:
            raise click.UsageError(f"--ignore-paths: {e.diagnostics()}") from e
        with progress_bar(model_dir, "hashing", not (quiet or as_json)) as progress:
            manifests = compute_manifests(
                model_dir,
                [algorithm],
                ignore_paths=[*MODEL_IGNORE_PATHS, *(p for p in extra if p not in MODEL_IGNORE_PATHS)],
                tensor_hash=None,
                progress=progress,
            )
    except Error as e:
        fail(e, as_json)
    m = manifests[algorithm]
    if as_json:
        reply(
            {
                "rootDigest": digest_str(m.subject_digest["sha256"]),
                "hashType": hash_type,
                "files": len(m.resources),
            }
        )
    else:
        click.echo(digest_str(m.subject_digest["sha256"]))


@click.command(name="inspect")
@click.argument("model_dir", type=click.Path(path_type=Path))
@signatures_option("Bundle to show (repeatable; default: the default names in MODEL_DIR).")
@trusted_keys_option(
    "Trusted public key PEM (repeatable): check each bundle's signature and name the key that verifies."
)
@json_option
def inspect(model_dir: Path, signatures: tuple[Path, ...], keys: tuple[Path, ...], as_json: bool) -> None:
    """Show what MODEL_DIR's bundles sign: files, tensors, hashes, root digest, and by which key.

    Without --trusted-key nothing is verified and the output says UNVERIFIED: a bundle's contents are
    claims until a trusted key checks them. With it, a default-named bundle signed by a key of another
    scheme than its name says (an SM2 `model.sig`, a P-256 `model.p384.sig`) is refused, as `verify`
    refuses it. File contents are never hashed here (use `modelsec verify`).
    """
    from modelsec.attestations.predicates.oms import parse_manifest
    from modelsec.signer.keys import load_trusted_key_file
    from modelsec.signer.layout import SIGNATURE_FILE_NAMES, find_default_bundles
    from modelsec.verifier.inspection import inspect_bundle, require_one_checked
    from modelsec.verifier.trust.bundles import check_bundle_name

    rows: list[dict[str, Any]] = []
    try:
        trusted = [load_trusted_key_file(k) for k in keys]
        paths = list(signatures) or find_default_bundles(model_dir)
        if not paths:
            looked_for = ", ".join(SIGNATURE_FILE_NAMES)
            raise SignatureError(f"{model_dir}: no signature bundle found (looked for {looked_for})")
        checked = [
            inspect_bundle(p, trusted, limits=limits(), skip_unverifiable=not signatures) for p in paths
        ]
        require_one_checked(checked, trusted, str(model_dir))
        for path, seen in zip(paths, checked, strict=True):
            if seen.signer is not None:
                check_bundle_name(path, seen.signer)  # verify's rule: refused here as verify refuses it
            manifest = parse_manifest(seen.statement, what=str(path))
            hash_type = manifest.hash_type.value
            root = manifest.subject_digest.get("sha256")
            rows.append(
                {
                    "path": str(path),
                    "signer": signer_json(seen.signer),
                    "skipped": seen.skipped,
                    "hint": seen.bundle.hint,
                    "hashType": hash_type,
                    "rootDigest": None if root is None else digest_str(root),
                    "subjectDigests": [digest_str(v, a) for a, v in manifest.subject_digest.items()],
                    "files": [
                        {"name": r.name, "digest": digest_str(r.digest.hex(), hash_type)}
                        for r in manifest.resources
                    ],
                    "ignorePaths": list(manifest.ignore_paths),
                    "tensorHash": manifest.tensor_hash.value if manifest.tensor_hash else None,
                    "tensors": sum(len(t) for t in manifest.tensors.values()),
                }
            )
    except Error as e:
        fail(e, as_json, hint=_signature_hint(e, model_dir, signatures))
    if as_json:
        reply({"bundles": rows})
        return
    for row in rows:
        skipped_note(row)
        click.echo(f"{row['path']}: signed by {signer_text(row['signer'], keyid=True)}")
        click.echo(f"  model root digest {row['rootDigest']}  ({row['hashType']} manifest)")
        click.echo(
            f"  {len(row['files'])} files, {row['tensors']} tensors with {row['tensorHash'] or 'no'} "
            "per-tensor digests"
        )
        for f in row["files"]:
            click.echo(f"    {f['digest'].partition(':')[2][:16]}  {f['name']}")
        click.echo(f"  ignored: {', '.join(row['ignorePaths'])}")
