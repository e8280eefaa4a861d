"""Reading a bundle for display (`modelsec inspect`, `attest list`), verified as the verifier would."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.statement import Statement, parse_statement
from modelsec.errors import AttestationError, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.signer.keys import TrustedKey
from modelsec.verifier.attestations import role_for_predicate
from modelsec.verifier.bundles import read_bundle, verify_bundle_signature
from modelsec.verifier.stores import StoredBundle

__all__ = ["InspectedBundle", "inspect_bundle"]


@dataclass(frozen=True, slots=True)
class InspectedBundle:
    """A bundle read for display (`modelsec inspect`, `attest list`), and who signed it if keys were given.

    Attributes:
        source: Where it was read (a path, or a store's `<uri>#<id>`).
        bundle: The parsed bundle.
        statement: Its statement, parsed from the payload bytes.
        signer: The trusted key that verified it under the role for its predicate type; None when no keys
            were given (the contents are then claims, not verified).
    """

    source: str
    bundle: Bundle
    statement: Statement
    signer: TrustedKey | None


def inspect_bundle(
    item: Path | StoredBundle, keys: Sequence[TrustedKey], *, limits: Limits | None = None
) -> InspectedBundle:
    """Read a bundle for display; with `keys`, verify it exactly as the verifier would choose its key.

    With keys, the predicate type must be known (an unknown type is refused, as `verify_attestations`
    refuses it) and the signature must verify under a key holding the role for that type. The subject is
    not compared with any model and no predicate is checked against a policy (use `verify_attestations`).

    Args:
        item: A bundle file, or a bundle read from a store.
        keys: Trusted keys; empty to read without verifying.
        limits: Size limits (default `Limits()`).

    Returns:
        The parsed bundle, statement and verifying key (None without keys).

    Raises:
        MalformedArtifactError: The bundle or statement cannot be parsed, or is too large.
        SignatureError: No key holding the role verifies the signature (or the file is missing).
        AttestationError: With keys: the predicate type is not one modelsec knows.
    """
    limits = limits or Limits()
    if isinstance(item, Path):
        what, bundle = str(item), read_bundle(item, limits)
    else:
        if len(item.data) > limits.max_bundle_bytes:
            raise MalformedArtifactError(f"{item.source}: larger than {limits.max_bundle_bytes} bytes")
        what, bundle = item.source, parse_bundle(item.data, source=item.source)
    statement = parse_statement(bundle.envelope.payload, what=what)
    signer = None
    if keys:
        role = role_for_predicate(statement.predicate_type)
        if role is None:
            raise AttestationError(f"{what}: unknown predicateType {statement.predicate_type!r}")
        signer = verify_bundle_signature(bundle, keys, role=role)
    return InspectedBundle(what, bundle, statement, signer)
