"""`modelsec keygen`: generate a signing key pair (PKCS#8 private key, SubjectPublicKeyInfo public key).

Registered on the root group by `modelsec.cli.main`; only click is imported at module level.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from modelsec.algorithms import SignatureAlgorithm
from modelsec.cli.common import (
    PASSWORD_ENV,
    fail,
    json_option,
    read_password_source,
    reply,
    write_key_file,
)
from modelsec.errors import Error

__all__ = ["keygen"]


@click.command(name="keygen")
@click.option(
    "--algorithm",
    "-a",
    # The enum is the registry's name list (tests/unit/signer/test_schemes.py); importing the registry here
    # would load `modelsec.signer` and `cryptography` for every CLI start.
    type=click.Choice([a.value for a in SignatureAlgorithm]),
    default=SignatureAlgorithm.ECDSA_P256.value,
    show_default=True,
    help="ecdsa-p256 (OMS/model_signing interop), ecdsa-p384, sm2 (SM2 with SM3, GB/T 32918), or "
    "ml-dsa-44/65/87 (FIPS 204).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="Output prefix: writes PREFIX.key.pem (mode 0600) and PREFIX.pub.pem.",
)
@click.option(
    "--encrypt",
    is_flag=True,
    help=f"Encrypt the private key; the password comes from --key-password, else ${PASSWORD_ENV}, else a "
    "prompt on a terminal.",
)
@click.option(
    "--key-password",
    "key_password",
    metavar="env:VAR|file:PATH",
    help="With --encrypt: read the password from $VAR or from a file (one trailing newline dropped).",
)
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@json_option
def keygen(
    algorithm: str, out: Path, encrypt: bool, key_password: str | None, force: bool, as_json: bool
) -> None:
    """Generate a signing key pair (PKCS#8 private key, SubjectPublicKeyInfo public key)."""
    from modelsec.errors import KeyMaterialError
    from modelsec.signer.keys import generate_private_key_pem

    if key_password is not None and not encrypt:
        raise click.UsageError("--key-password needs --encrypt")
    if key_password is not None and (
        key_password.partition(":")[0] not in ("env", "file") or not key_password.partition(":")[2]
    ):
        raise click.UsageError("--key-password: expected env:VAR or file:PATH")
    private_path = Path(f"{out}.key.pem")
    public_path = Path(f"{out}.pub.pem")
    try:
        password = None
        if key_password is not None:
            password = read_password_source(key_password, f"{private_path} (--key-password)")
        elif encrypt and os.environ.get(PASSWORD_ENV):
            password = os.environ[PASSWORD_ENV].encode("utf-8")
        elif encrypt and sys.stdin.isatty():
            password = click.prompt("Password", hide_input=True, confirmation_prompt=True).encode("utf-8")
        elif encrypt:
            raise KeyMaterialError(
                f"keygen --encrypt: no terminal to ask for the password: set ${PASSWORD_ENV}, or give "
                "--key-password env:VAR or --key-password file:PATH"
            )
        private, public = generate_private_key_pem(SignatureAlgorithm(algorithm), password=password)
        for path, data, mode in ((private_path, private, 0o600), (public_path, public, 0o644)):
            write_key_file(path, data, mode, force=force)
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply({"algorithm": algorithm, "privateKey": str(private_path), "publicKey": str(public_path)})
    else:
        click.echo(f"wrote {private_path} and {public_path} ({algorithm})")
