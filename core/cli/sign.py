"""`modelsec sign`: hash a model once and write one signature bundle per key (local PEM or a signing service).

Registered on the root group by `modelsec.cli.main`; `modelsec.signer` loads inside the command.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import click

from modelsec.algorithms import HashAlgorithm
from modelsec.cli.common import (
    KEY_PASSWORD_HELP,
    TIMESTAMP_HELP,
    digest_str,
    fail,
    ignore_paths_option,
    json_option,
    key_password_option_with,
    key_password_sources,
    open_signing_key,
    progress_bar,
    quiet_option,
    reply,
    server_client,
    server_options,
    signatures_option,
    signing_keys_option,
    timestamp_option_with,
    timestamper,
)
from modelsec.errors import Error, KeyMaterialError

__all__ = ["sign"]


_TENSOR_DIGESTS = [HashAlgorithm.BLAKE3.value, HashAlgorithm.SHA256.value, HashAlgorithm.SM3.value, "none"]


# What `sign --help` leaves to the man page: the long description (each option's detail below).
_DESCRIPTION = """\
Keys are local PEM files (--signing-key) or key versions held by a modelsec signing service (--server with
--key-version): the manifest is built here and only the statement (digests, no weights) is sent; each
returned bundle is checked to sign exactly that statement with the server's (or the pinned) key.

Without a terminal (CI), unencrypted keys need nothing; each encrypted key takes its password from its
own --key-password source, else from $MODELSEC_KEY_PASSWORD, e.g.
`sign M --signing-key ci-p256.key.pem --signing-key ci-sm2.key.pem
--key-password ci-sm2.key.pem=env:SM2_KEY_PASSWORD`.

With --signing-certificate the bundle is model_signing's certificate-mode bundle (the x509 chain in its
verification material); verify it under a policy authority (x509 roots and identities) or with
`model_signing verify certificate`.

An existing bundle is never replaced without --force (exit 1, nothing written), and neither is a
default-named bundle of another key left signing other files beside the new one.
"""

# The long explanations of the options: the man page and the CLI reference (after `\f`), not `--help`.
_DETAILS = {
    "--signing-key": "Private key PEM (repeatable: one bundle per key). An encrypted key's password: see "
    "--key-password.",
    "--key-password": KEY_PASSWORD_HELP,
    "--key-version": "A key version held by the --server (repeatable): hash here, sign there; the key never "
    "leaves it.",
    "--pin-key": "Expected public key PEM of each --key-version, in the same order (refuse any other key).",
    "--signing-certificate": "Certificate mode (model_signing's `sign certificate`): the PEM signing "
    "certificate of the one --signing-key (PEM or pkcs11:); the bundle carries it and --certificate-chain "
    "as x509CertificateChain instead of a public-key hint.",
    "--certificate-chain": "PEM file(s) with the rest of the signing certificate's chain, intermediates "
    "first (repeatable).",
    "--signature": "Bundle output path, one per key (local --signing-key first, then --key-version, in "
    "order; default: model.sig, model.p384.sig, model.sm2.sig, model.ml-dsa-{44,65,87}.sig in MODEL_DIR, by "
    "the key's algorithm). Required when MODEL_DIR is a single file (e.g. FILE.sig): the default names in "
    "its folder are the folder's own signature.",
    "--force": "Replace existing bundles at the output paths, and delete the default-named bundles in "
    "MODEL_DIR that sign other files (a stale model.sm2.sig beside a new model.sig). Without it both are "
    "refused and nothing is written; co-signatures of the same files are always kept.",
    "--tensor-digest": "Per-tensor digest algorithm recorded in the modelsec extension ('none': plain OMS).",
    "--hash-type": "File digests of the manifest ECDSA/ML-DSA keys sign (OMS hash_type; 'blake3' as "
    "model_signing's hashing_algorithm='blake3': faster, no SHA-256 pass; SM2 keys refuse it).",
    "--allow-unverifiable": "Sign even when MODEL_DIR holds what verification under the default policy "
    "always refuses (refused here by default): pickle files, by name (pytorch_model.bin, *.pt, ...) or by "
    "content (a torch zip, a gzip/xz/bz2/zstd or tar-wrapped pickle, an archive too large to inspect); *.py "
    "code; and *.json files (config, tokenizer, at any depth) that name code (auto_map, custom_pipelines), "
    "are not strict JSON (syntax errors, duplicate keys, NaN/Infinity) or exceed the JSON side-file size "
    "limit; and a weight index at any depth (*.index.json, *.index.<variant>.json) whose weight_map names a "
    "file outside its folder, a pickle shard, a file that is not a shard of the model, or a tensor its "
    "shard does not hold.",
    "--ignore-paths": "Leave this path (a file, or a directory with everything below it) out of the "
    "signature and record it in the signed ignore list (repeatable). As model_signing's --ignore-paths: a "
    "relative path is taken from the current directory, not from MODEL_DIR (e.g. MODEL_DIR/README.md). A "
    "path outside MODEL_DIR, or one that does not exist, is refused (usage error).",
    "--timestamp-url": TIMESTAMP_HELP,
}


@click.command(name="sign")
@click.argument("model_dir", type=click.Path(path_type=Path))
@signing_keys_option("Private key PEM, one bundle per key (repeatable).")
@key_password_option_with("Password source of one encrypted key (repeatable).")
@click.option(
    "--key-version",
    "key_versions",
    multiple=True,
    metavar="NAME/VERSION",
    help="A key version of the --server (repeatable).",
)
@click.option(
    "--pin-key",
    "pins",
    type=click.Path(path_type=Path, dir_okay=False),
    multiple=True,
    help="Public key PEM each --key-version must have.",
)
@click.option(
    "--signing-certificate",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Certificate mode: the key's certificate.",
)
@click.option(
    "--certificate-chain",
    "certificate_chains",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The rest of its chain, intermediates first.",
)
@server_options(required=False)
@signatures_option("Bundle output path, one per key.")
@click.option("--force", is_flag=True, help="Replace existing or stale bundles.")
@click.option(
    "--tensor-digest",
    type=click.Choice(_TENSOR_DIGESTS),
    default="blake3",
    show_default=True,
    help="Per-tensor digests ('none': plain OMS).",
)
@click.option(
    "--hash-type",
    type=click.Choice([HashAlgorithm.SHA256.value, HashAlgorithm.BLAKE3.value]),
    default="sha256",
    show_default=True,
    help="File digests of ECDSA/ML-DSA manifests.",
)
@click.option(
    "--allow-unverifiable",
    is_flag=True,
    help="Sign pickles, code, what verify refuses.",
)
@ignore_paths_option("Leave PATH unsigned (repeatable).")
@timestamp_option_with("RFC 3161 timestamp authority.")
@json_option
@quiet_option
def sign(
    model_dir: Path,
    keys: tuple[Path, ...],
    key_passwords: tuple[str, ...],
    key_versions: tuple[str, ...],
    pins: tuple[Path, ...],
    signing_certificate: Path | None,
    certificate_chains: tuple[Path, ...],
    server: str | None,
    server_ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token_env: str,
    plaintext: bool,
    signatures: tuple[Path, ...],
    force: bool,
    tensor_digest: str,
    hash_type: str,
    allow_unverifiable: bool,
    ignore_paths: tuple[Path, ...],
    timestamp_url: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Hash every file of MODEL_DIR once and write one signature bundle per key.

    Keys: local PEM files (--signing-key) or key versions of a signing service (--server, --key-version).
    An existing bundle is never replaced without --force. Each option in detail: `man modelsec-sign`.
    """
    from modelsec.signer import sign_model
    from modelsec.signer.layout import relative_ignore_paths

    if not keys and not key_versions:
        raise click.UsageError("give --signing-key, or --server with --key-version")
    if key_versions and not server:
        raise click.UsageError("--key-version needs --server")
    if certificate_chains and signing_certificate is None:
        raise click.UsageError("--certificate-chain needs --signing-certificate")
    if signing_certificate is not None and (len(keys) != 1 or key_versions):
        raise click.UsageError("--signing-certificate certifies exactly one --signing-key (no --key-version)")
    if pins and len(pins) != len(key_versions):
        raise click.UsageError("give one --pin-key per --key-version, or none")
    if signatures and len(signatures) != len(keys) + len(key_versions):
        raise click.UsageError("give one --signature per key, or none")
    try:
        ignored = relative_ignore_paths(model_dir, ignore_paths, strict=True)
    except Error as e:
        raise click.UsageError(f"--ignore-paths: {e.diagnostics()}") from e
    sources = key_password_sources(key_passwords, list(keys))
    client = None
    try:
        pinned = [_read_pinned_key(p) for p in pins]
        signers: list[Any] = [open_signing_key(k, sources) for k in keys]
        if signing_certificate is not None:
            from modelsec.signer.certificates import load_certificate_signer

            signers = [load_certificate_signer(signers[0], signing_certificate, certificate_chains)]
        if key_versions:
            from modelsec.service.client import RemoteSigner

            client = server_client(str(server), server_ca, client_cert, client_key, token_env, plaintext)
            signers += [
                RemoteSigner(client, v, expected_public_key_pem=pinned[i] if pinned else None)
                for i, v in enumerate(key_versions)
            ]
        if not signatures and len({s.algorithm for s in signers}) < len(signers):
            raise click.UsageError(
                "two keys of one algorithm would write the same bundle; give --signature for each key"
            )
        with progress_bar(model_dir, "hashing", not (quiet or as_json)) as progress:
            result = sign_model(
                model_dir,
                signers,
                signature_paths=dict(enumerate(signatures)) or None,
                tensor_hash=None if tensor_digest == "none" else HashAlgorithm(tensor_digest),
                progress=progress,
                refuse_unverifiable=not allow_unverifiable,
                ignore_paths=ignored,
                timestamper=timestamper(timestamp_url),
                hash_type=HashAlgorithm(hash_type),
                force=force,
            )
    except Error as e:
        fail(e, as_json)
    except OSError as e:
        raise click.UsageError(f"cannot read {e.filename}: {e.strerror}") from e
    finally:
        if client is not None:
            client.close()
    if as_json:
        reply(
            {
                "rootDigest": digest_str(result.root_digest),
                "files": result.files,
                "tensors": result.tensors,
                "bundles": [
                    {"path": str(b.path), "algorithm": b.algorithm.value, "keyid": b.keyid}
                    for b in result.bundles
                ],
                "removed": [str(p) for p in result.removed],
            }
        )
        return
    click.echo(
        f"signed {result.files} files, {result.tensors} tensors; "
        f"model root digest sha256:{result.root_digest}"
    )
    for b in result.bundles:
        click.echo(f"  {b.algorithm.value:<10} -> {b.path}")
    for p in result.removed:
        click.echo(f"  removed {p} (it signed other files)")


# `--help` stops at the form feed (click); the man page and the CLI reference show what follows it.
sign.help = (
    f"{inspect.cleandoc(sign.help or '')}\n\n\f\n{_DESCRIPTION}\n\nEach option in detail:\n\n"
    + "\n\n".join(f"{option}: {text}" for option, text in _DETAILS.items())
)


def _read_pinned_key(path: Path) -> bytes:
    """A `--pin-key` file's PEM, checked to be a public key before any hashing or server call.

    Raises:
        KeyMaterialError: Missing, unreadable, not a regular file (a FIFO never blocks), larger than 64 KiB,
            or not a public key.
    """
    from modelsec.safe_io import read_regular_file
    from modelsec.signer.keys import load_trusted_key

    pem = read_regular_file(path, "pinned public key file", max_bytes=2**16, error=KeyMaterialError)
    load_trusted_key(pem, name=str(path))
    return pem
