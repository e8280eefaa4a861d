"""When an X.509 signing certificate's chain is checked: at trusted RFC 3161 times, else now.

A bundle signed under a certificate may carry RFC 3161 timestamps over its signature. Their times are
believed only through a TSA the *policy* configures (DESIGN.md decision 12): `trusted_times` verifies each
timestamp (the TSA's CMS signature, its chain to a configured TSA root, the timeStamping EKU, and the
imprint of exactly this signature, `modelsec.verifier.trust.timestamps.check_timestamps`, shared with the
bundle's time check so each is verified once) before its time is used, drops the ones no configured TSA
vouches for, and refuses the bundle for a trusted one dated in the future. `verify_chain` then builds the
path from the leaf to a configured root (pyca/cryptography's `PolicyBuilder`) at *each* believed time
(stricter than any one of them: every timestamp must fall inside every chain certificate's validity), or,
with none believed, at the verification time. A time the bundle merely claims is never used.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from cryptography import x509

from modelsec.attestations.bundle import Bundle
from modelsec.errors import SignatureError
from modelsec.policy import TimestampAuthority
from modelsec.verifier.trust.timestamp_backend import check_bundle_timestamps

__all__ = ["trusted_times", "verify_chain"]


def trusted_times(bundle: Bundle, authorities: Sequence[TimestampAuthority]) -> tuple[datetime.datetime, ...]:
    """The times of the bundle's RFC 3161 timestamps that a configured TSA vouches for, in bundle order.

    A timestamp that is malformed, over other bytes, or from a TSA not in `authorities` is not believed and
    left out (here only: `modelsec.verifier.trust.bundles.check_signature_time` refuses the bundle for it).
    One a configured TSA vouches for that is dated after now plus
    `modelsec.verifier.trust.timestamps.CLOCK_SKEW` refuses the bundle: the chain is never checked at a time
    still to come.

    Args:
        bundle: The bundle; its timestamps must cover `bundle.signature.sig`.
        authorities: The policy's TSAs (none: no timestamp is believed).

    Returns:
        The verified `genTime`s (timezone-aware UTC); empty when none is believed.

    Raises:
        SignatureError: A trusted timestamp is dated in the future (the message names its time and the
            bundle).
        BackendUnavailableError: There are timestamps and TSAs, but `rfc3161-client` is not installed.
    """
    if not authorities or not bundle.timestamps:
        return ()
    return check_bundle_timestamps(bundle, authorities).times


def verify_chain(
    leaf: x509.Certificate,
    intermediates: Sequence[x509.Certificate],
    roots: Sequence[x509.Certificate],
    times: Sequence[datetime.datetime],
    *,
    allow_ca_leaf: bool = False,
) -> None:
    """Build a path from `leaf` to one of `roots` at each of `times` (empty: at the current time).

    The bundle's other certificates are only untrusted intermediates. Every certificate of the path must be
    valid at the time (RFC 5280 / CA/B Forum profile; any extended key usage is accepted here, the caller
    checks code signing). With `allow_ca_leaf`, the leaf's basicConstraints and keyUsage are not held to the
    end-entity profile (`CA:TRUE`, keyCertSign); the caller then checks its key usage itself.

    Raises:
        SignatureError: No path verifies at one of the times; the message names the time (a timestamp's or
            the verification time) and the certificates whose validity window excludes it.
    """
    from cryptography.x509.verification import (
        Criticality,
        ExtensionPolicy,
        PolicyBuilder,
        Store,
        VerificationError,
    )

    # Client verifiers require the client-auth EKU; a signing certificate has code signing, checked after.
    eku_any = (x509.ExtendedKeyUsage, Criticality.AGNOSTIC, None)
    ee_policy = ExtensionPolicy.webpki_defaults_ee().may_be_present(*eku_any)
    if allow_ca_leaf:
        ee_policy = ee_policy.may_be_present(x509.BasicConstraints, Criticality.AGNOSTIC, None)
        ee_policy = ee_policy.may_be_present(x509.KeyUsage, Criticality.AGNOSTIC, None)
    builder = PolicyBuilder().extension_policies(
        ca_policy=ExtensionPolicy.webpki_defaults_ca().may_be_present(*eku_any), ee_policy=ee_policy
    )
    store = Store(list(roots))
    checks = [(t, f"the RFC 3161 timestamp's time {t.isoformat()}") for t in times]
    if not checks:
        now = datetime.datetime.now(datetime.UTC)
        checks = [(now, f"the verification time {now.isoformat()} (no trusted timestamp)")]
    for time, what in checks:
        try:
            builder.store(store).time(time).build_client_verifier().verify(leaf, list(intermediates))
        except (VerificationError, x509.UnsupportedGeneralNameType, ValueError) as e:
            outside = _outside(time, [leaf, *intermediates, *roots])
            raise SignatureError(
                f"certificate chain does not verify to a configured root at {what}: {e}{outside}"
            ) from e


def _outside(time: datetime.datetime, certs: Sequence[x509.Certificate]) -> str:
    """`; not valid then: <certificate> (valid <from> to <until>)` for each certificate excluding `time`."""
    named = [
        f"{'the signing certificate ' if i == 0 else ''}{c.subject.rfc4514_string()} "
        f"(valid {c.not_valid_before_utc.isoformat()} to {c.not_valid_after_utc.isoformat()})"
        for i, c in enumerate(certs)
        if not c.not_valid_before_utc <= time <= c.not_valid_after_utc
    ]
    return f"; not valid then: {', '.join(named)}" if named else ""
