"""`modelsec attest delete`: withdraw a record from an attestation store (an authorised operation).

Registered under the `attest` group of `modelsec._cli`. The command converts its options, calls the store's
`delete` or `supersede` (`modelsec.verifier.stores.AttestationStore`), prints, and maps errors: exit 0 when
the record is gone from what readers get, exit 1 otherwise (diagnostic on stderr, or the JSON envelope).
Who may delete is the store's access control: a directory's file permissions, the SQLite file's.
"""

from __future__ import annotations

import click

from modelsec._cli_common import _fail, _json_option, _reply

__all__ = ["attest_delete"]


@click.command(name="delete")
@click.argument("store")
@click.option(
    "--digest",
    "digest",
    required=True,
    metavar="[sha256:]HEX",
    help="The model root digest the record is filed under.",
)
@click.option(
    "--id", "bundle_id", required=True, metavar="ID", help="The record's id (as `attest list` shows)."
)
@click.option(
    "--supersede",
    is_flag=True,
    help="Keep the record but withdraw it from readers (SQLite keeps it for audit; a directory removes it).",
)
@_json_option
def attest_delete(store: str, digest: str, bundle_id: str, supersede: bool, as_json: bool) -> None:
    """Delete (or supersede) the record ID about DIGEST in STORE (a directory, file:// or sqlite:// URI)."""
    from modelsec.errors import Error
    from modelsec.limits import Limits
    from modelsec.verifier.stores import StoreOptions, open_store

    digest = digest.removeprefix("sha256:")
    try:
        opened = open_store(store, StoreOptions(limits=Limits()))
        try:
            (opened.supersede if supersede else opened.delete)(digest, bundle_id)
        finally:
            opened.close()
    except Error as e:
        _fail(e, as_json)
    verb = "superseded" if supersede else "deleted"
    if as_json:
        _reply({verb: {"rootDigest": digest, "id": bundle_id}})
    else:
        click.echo(f"{verb} {bundle_id} (sha256:{digest}) in {store}")
