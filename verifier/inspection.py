"""Reading a bundle for display (`modelsec inspect`, `attest list`), verified as the verifier would."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.attestations.predicates import predicate_kind
from modelsec.attestations.statement import Statement, parse_statement
from modelsec.errors import MalformedArtifactError, SignatureError
from modelsec.limits import Limits
from modelsec.signer.keys import TrustedKey
from modelsec.verifier.stores import StoredBundle
from modelsec.verifier.trust.bundles import has_key_for_bundle, read_bundle, verify_bundle_signature

__all__ = ["SKIPPED_NOTE", "InspectedBundle", "inspect_bundle", "require_one_checked"]

SKIPPED_NOTE = "not checked (no configured key of its algorithm)"
"""What `inspect` and `attest list` say of a skipped bundle (the words of `verify`'s note)."""


@dataclass(frozen=True, slots=True)
class InspectedBundle:
    """A bundle read for display (`modelsec inspect`, `attest list`), and who signed it if keys were given.

    Attributes:
        source: Where it was read (a path, or a store's `<uri>#<id>`).
        bundle: The parsed bundle.
        statement: Its statement, parsed from the payload bytes.
        signer: The trusted key that verified it under the role for its predicate type; None when no keys
            were given or it was skipped (the contents are then claims, not verified).
        skipped: Keys were given but none of the default-named bundle's algorithm (`verify` skips it
            too, with a note); its contents are claims.
    """

    source: str
    bundle: Bundle
    statement: Statement
    signer: TrustedKey | None
    skipped: bool = False


def inspect_bundle(
    item: Path | StoredBundle,
    keys: Sequence[TrustedKey],
    *,
    limits: Limits | None = None,
    skip_unverifiable: bool = False,
) -> InspectedBundle:
    """Read a bundle for display; with `keys`, verify it exactly as the verifier would choose its key.

    With keys, the predicate type must be known (an unknown type is refused, as `verify_attestations`
    refuses it) and the signature must verify under a key holding the role for that type. The subject is
    not compared with any model and no predicate is checked against a policy (use `verify_attestations`).
    With `skip_unverifiable`, a bundle file under a default name no key can verify (an SM2 bundle with only
    ECDSA keys, `model.p384.sig` with only a P-256 key: `has_key_for_bundle`) is returned `skipped` instead
    of refused, as `verify` skips it; so is a bundle read from a store that no key verifies (a store's
    bundles never veto: `verify` ignores them).

    Args:
        item: A bundle file, or a bundle read from a store.
        keys: Trusted keys; empty to read without verifying.
        limits: Size limits (default `Limits()`).
        skip_unverifiable: Skip, rather than refuse, a default-named bundle no key's scheme can verify, or a
            store's bundle no key verifies (for bundles found, not named; a named bundle is always checked).

    Returns:
        The parsed bundle, statement and verifying key (None without keys).

    Raises:
        MalformedArtifactError: The bundle or statement cannot be parsed, or is too large.
        SignatureError: No key holding the role verifies the signature (or the file is missing), and the
            bundle is not skipped.
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
        role = predicate_kind(statement.predicate_type, what=what).role
        try:
            signer = verify_bundle_signature(bundle, keys, role=role)
        except SignatureError:
            # A store's bundles never veto (verify ignores one no trusted key verifies): skipped here too.
            if skip_unverifiable and (
                not isinstance(item, Path) or not has_key_for_bundle(item, bundle, keys)
            ):
                return InspectedBundle(what, bundle, statement, None, skipped=True)
            raise
    return InspectedBundle(what, bundle, statement, signer)


def require_one_checked(seen: Sequence[InspectedBundle], keys: Sequence[TrustedKey], what: str) -> None:
    """With keys, refuse a listing where every bundle was skipped (nothing was verified at all).

    Raises:
        SignatureError: Keys were given, and no bundle of `what` could be checked with any of them.
    """
    if keys and seen and all(b.skipped for b in seen):
        skipped = ", ".join(b.source for b in seen)
        raise SignatureError(f"{what}: no bundle can be checked with the given keys (skipped: {skipped})")
