"""RFC 3161 trusted timestamps over a bundle's signature: obtaining one, and verifying it against TSAs.

A timestamp is stored as sigstore stores it (`verificationMaterial.timestampVerificationData
.rfc3161Timestamps[].signedTimestamp`, the DER `TimeStampResp`) and covers the DSSE signature bytes, as
model_signing's and sigstore's timestamps do. Verification (through `rfc3161-client`) checks the TSA's CMS
signature, its certificate chain up to a root the *operator* configured (DESIGN.md decision 12: certificates
embedded in the response are believed only through that root), the timeStamping extended key usage, and that
the message imprint is the hash of exactly this signature. It does not check revocation of the TSA
certificate. A trusted time later than the verification time plus `CLOCK_SKEW` refuses the bundle (a TSA
vouching for the future has a wrong clock or a misused key; its time would otherwise stretch every validity
window up to it). The trusted time then places the signature inside its key's validity window
(`check_validity_window`); without a timestamp the caller passes the verification time.

Each timestamp is verified once: its outcome (trusted time, or why it is refused) depends only on the token,
the signature, the TSAs and the bundle's name (rfc3161-client checks the TSA chain at `genTime`, not now),
so `check_timestamps` memoizes it in a small bounded table keyed by the token's SHA-256. The X.509 chain
check (`modelsec.verifier.trust.x509_chain.trusted_times`) and the time check of the same bundle
(`modelsec.verifier.trust.bundles.check_signature_time`) share it; the clock is read on every call.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import rfc3161_client
from cryptography import x509

from modelsec.errors import (
    BackendUnavailableError,
    KeyMaterialError,
    MalformedArtifactError,
    SignatureError,
    VerificationError,
)
from modelsec.policy import TimestampAuthority, check_validity_window
from modelsec.safe_io import read_regular_file

__all__ = [
    "CLOCK_SKEW",
    "CheckedTimestamps",
    "TimestampAuthority",
    "check_timestamp_url",
    "check_timestamps",
    "check_validity_window",
    "load_timestamp_authority",
    "request_timestamp",
    "verify_timestamp",
    "verify_timestamps",
]

_MAX_RESPONSE_BYTES = 64 * 1024
_MAX_CERT_FILE_BYTES = 256 * 1024
_GRANTED = (0, 1)  # PKIStatus granted, grantedWithMods (RFC 3161 section 2.4.2)
_MEMO_ENTRIES = 1024  # each: a token digest, the signature (not the token) and the outcome; a few KiB at most

CLOCK_SKEW = timedelta(minutes=5)
"""How far a trusted timestamp may lie after the verifier's clock (the TSA's and the verifier's clocks
differ): the common five-minute allowance (Kerberos, RFC 4120 section 1.6; OAuth/JWT libraries).
Beyond it the timestamp refuses the bundle."""


def load_timestamp_authority(path: Path, *, name: str | None = None) -> TimestampAuthority:
    """Load a PEM file of TSA certificates: self-issued ones are roots, the others intermediates.

    Raises:
        KeyMaterialError: The file cannot be read, is not a regular file or too large, holds no
            certificate, or no self-issued root.
    """
    data = read_regular_file(
        path, "TSA certificate file", max_bytes=_MAX_CERT_FILE_BYTES, error=KeyMaterialError
    )
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise KeyMaterialError(f"{path}: not a PEM certificate file ({e})") from e
    roots = tuple(c for c in certs if c.subject == c.issuer)
    if not roots:
        raise KeyMaterialError(f"{path}: no self-issued root certificate among the TSA certificates")
    return TimestampAuthority(name or path.name, roots, tuple(c for c in certs if c.subject != c.issuer))


def _next_step(e: OSError) -> str:
    """What to do about a TSA that could not be spoken to (`e`: urllib's error, its `reason` the cause)."""
    if isinstance(e, urllib.error.HTTPError):
        return f"it answered HTTP {e.code}: check the URL"
    reason = getattr(e, "reason", e)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return "its TLS certificate is not trusted by this machine's roots (or $SSL_CERT_FILE)"
    if isinstance(reason, ssl.SSLError):
        return "the TLS handshake failed: for a plain-HTTP TSA, give an http:// URL"
    if isinstance(reason, TimeoutError):
        return "no answer in time: check the URL and the network, then retry"
    return "cannot connect: check the URL and that the TSA is running, then retry"


def check_timestamp_url(url: str) -> None:
    """Refuse a TSA URL that is not `http://` or `https://` (urllib would open `file:` and others).

    Raises:
        KeyMaterialError: Another scheme.
    """
    if not url.lower().startswith(("http://", "https://")):
        raise KeyMaterialError(f"{url}: the timestamp URL must be http:// or https://")


def request_timestamp(signature: bytes, url: str, *, timeout: float = 30.0) -> bytes:
    """Obtain an RFC 3161 timestamp over `signature` from the TSA at `url` (HTTP POST, RFC 3161 section 3.4).

    The request carries a SHA-256 imprint, a random nonce and asks for the TSA's certificate; the response
    must be granted, carry the same imprint (hash algorithm and digest) and nonce, and be dated no more than
    `CLOCK_SKEW` after this machine's clock when the answer arrived (a verifier refuses a timestamp from the
    future) nor more than `CLOCK_SKEW` before it when the request left (the signature did not exist yet: a
    backdated time would stretch the key's validity window). Whether the TSA is trusted (its CMS signature and
    certificate chain) is decided at verification, not here.

    Args:
        signature: The DSSE signature bytes to timestamp.
        url: An `http://` or `https://` URL of the TSA.
        timeout: Seconds for the whole exchange.

    Returns:
        The DER `TimeStampResp`, for `modelsec.attestations.bundle.add_timestamps`.

    Raises:
        BackendUnavailableError: The TSA cannot be reached or answers with an HTTP error (retryable).
        MalformedArtifactError: The TSA's answer is not a granted timestamp over this request.
        SignatureError: The TSA dates its timestamp more than `CLOCK_SKEW` away from this machine's clock;
            the message names the URL, the timestamp's time and the local time.
    """
    check_timestamp_url(url)
    request = rfc3161_client.TimestampRequestBuilder(
        data=signature, hash_algorithm=rfc3161_client.HashAlgorithm.SHA256, nonce=True, cert_req=True
    ).build()
    http = urllib.request.Request(  # noqa: S310 (scheme checked above)
        url,
        data=request.as_bytes(),
        headers={"Content-Type": "application/timestamp-query", "Accept": "application/timestamp-reply"},
        method="POST",
    )
    sent = datetime.now(UTC)
    try:
        with urllib.request.urlopen(http, timeout=timeout) as reply:  # noqa: S310
            body = reply.read(_MAX_RESPONSE_BYTES + 1)
    except (urllib.error.URLError, OSError) as e:
        raise BackendUnavailableError(
            f"{url}: timestamp authority unavailable: {_next_step(e)}"
        ).with_details(str(e)) from e
    if len(body) > _MAX_RESPONSE_BYTES:
        raise MalformedArtifactError(f"{url}: timestamp response exceeds {_MAX_RESPONSE_BYTES} bytes")
    response = _decode(body, what=f"{url}: timestamp response")
    if response.tst_info.nonce != request.nonce:
        raise MalformedArtifactError(f"{url}: timestamp response does not answer this request (nonce)")
    imprint, asked = response.tst_info.message_imprint, request.message_imprint
    if imprint.hash_algorithm != asked.hash_algorithm or imprint.message != asked.message:
        raise MalformedArtifactError(
            f"{url}: timestamp response is over other bytes than the signature (imprint "
            f"{imprint.hash_algorithm.dotted_string}, asked {asked.hash_algorithm.dotted_string})"
        )
    _check_gen_time(response.tst_info.gen_time, url, sent=sent, received=datetime.now(UTC))
    return response.as_bytes()


def _check_gen_time(gen_time: datetime, url: str, *, sent: datetime, received: datetime) -> None:
    """Refuse a fresh timestamp dated more than `CLOCK_SKEW` outside the exchange that obtained it."""
    if gen_time > received + CLOCK_SKEW:
        raise SignatureError(
            f"{url}: the TSA dated the timestamp {gen_time.isoformat()}, more than the {CLOCK_SKEW} "
            f"clock-skew allowance after this machine's clock ({received.isoformat()}); verifiers refuse a "
            "timestamp from the future: check the TSA's clock and this one"
        )
    if gen_time < sent - CLOCK_SKEW:
        raise SignatureError(
            f"{url}: the TSA dated the timestamp {gen_time.isoformat()}, more than the {CLOCK_SKEW} "
            f"clock-skew allowance before this machine's clock when it was asked ({sent.isoformat()}), "
            "before the signature existed; check the TSA's clock and this one"
        )


def _decode(data: bytes, *, what: str) -> rfc3161_client.TimeStampResponse:
    try:
        response = rfc3161_client.decode_timestamp_response(data)
    except ValueError as e:
        raise MalformedArtifactError(f"{what} is not a DER TimeStampResp ({e})") from e
    if response.status not in _GRANTED:
        raise MalformedArtifactError(f"{what}: timestamp not granted (PKIStatus {response.status})")
    return response


@dataclass(frozen=True, slots=True)
class CheckedTimestamps:
    """A bundle's RFC 3161 timestamps, each verified once against the configured TSAs.

    Attributes:
        times: The `genTime`s (timezone-aware UTC) of the timestamps a TSA vouches for, in bundle order;
            none lies after the verification time plus `CLOCK_SKEW`.
    """

    times: tuple[datetime, ...]
    _refusals: tuple[tuple[type[VerificationError], str], ...]

    def all_trusted(self) -> tuple[datetime, ...]:
        """`times`, provided every timestamp was trusted.

        Raises:
            MalformedArtifactError: The first refused timestamp is not a granted DER response.
            SignatureError: The first refused timestamp is not trusted or not over this signature.
        """
        if self._refusals:
            kind, message = self._refusals[0]
            raise kind(message)
        return self.times


def check_timestamps(
    tokens: Sequence[bytes],
    signature: bytes,
    authorities: Sequence[TimestampAuthority],
    *,
    source: str,
    now: datetime | None = None,
) -> CheckedTimestamps:
    """Verify each RFC 3161 timestamp over `signature` once; refuse any trusted one dated in the future.

    A timestamp is trusted when a configured TSA's chain verifies its CMS signature (TSA certificate valid at
    its `genTime`, timeStamping EKU) and its imprint is the hash of `signature`. Untrusted or malformed
    timestamps are kept as refusals (`CheckedTimestamps.all_trusted` raises the first); a trusted one later
    than `now + CLOCK_SKEW` raises here. Revocation of the TSA certificate is not checked.

    Args:
        tokens: The DER `TimeStampResp`s from the bundle.
        signature: The DSSE signature bytes they must cover.
        authorities: The operator's TSAs; a response is believed only through one of their roots.
        source: Names the bundle in diagnostics.
        now: The verification time (default: the current time).

    Returns:
        The trusted times and the refusals, in bundle order.

    Raises:
        SignatureError: A timestamp a configured TSA vouches for is dated after `now + CLOCK_SKEW`; the
            message names the bundle, the timestamp's time and the TSA.
    """
    key_tsas = tuple(authorities)
    outcomes = [_outcome(t, signature, key_tsas, source) for t in tokens]
    limit = (now or datetime.now(UTC)) + CLOCK_SKEW
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, _Trusted) and outcome.time > limit:
            raise SignatureError(
                f"{source}: rfc3161 timestamp [{i}] of TSA {outcome.authority!r} is dated "
                f"{outcome.time.isoformat()}, after the verification time {(limit - CLOCK_SKEW).isoformat()} "
                f"plus the {CLOCK_SKEW} clock-skew allowance; a timestamp from the future is refused"
            )
    return CheckedTimestamps(
        tuple(o.time for o in outcomes if isinstance(o, _Trusted)),
        tuple(o for o in outcomes if not isinstance(o, _Trusted)),
    )


def verify_timestamp(
    token: bytes,
    signature: bytes,
    authorities: Sequence[TimestampAuthority],
    *,
    source: str,
    now: datetime | None = None,
) -> datetime:
    """Verify one RFC 3161 timestamp over `signature` against the configured TSAs (`check_timestamps`).

    Returns:
        The trusted time (`genTime`, timezone-aware UTC).

    Raises:
        MalformedArtifactError: Not a granted DER timestamp response.
        SignatureError: No configured TSA vouches for it, it is over other bytes than the signature, or it
            is dated after `now + CLOCK_SKEW`.
    """
    (time,) = verify_timestamps((token,), signature, authorities, source=source, now=now)
    return time


def verify_timestamps(
    tokens: Sequence[bytes],
    signature: bytes,
    authorities: Sequence[TimestampAuthority],
    *,
    source: str,
    now: datetime | None = None,
) -> tuple[datetime, ...]:
    """The trusted times of every timestamp in a bundle; any untrusted, malformed or future one fails it.

    Raises:
        MalformedArtifactError: A timestamp is not a granted DER response.
        SignatureError: A timestamp is not trusted, not over this signature, or dated after
            `now + CLOCK_SKEW`.
    """
    return check_timestamps(tokens, signature, authorities, source=source, now=now).all_trusted()


@dataclass(frozen=True, slots=True)
class _Trusted:
    time: datetime
    authority: str


_Outcome = _Trusted | tuple[type[VerificationError], str]
_memo: OrderedDict[tuple[bytes, bytes, tuple[TimestampAuthority, ...], str], _Outcome] = OrderedDict()
_memo_lock = threading.Lock()


def _outcome(
    token: bytes, signature: bytes, authorities: tuple[TimestampAuthority, ...], source: str
) -> _Outcome:
    """`_verify` memoized (least recently used out first); the key holds the token's digest, not the token."""
    key = (hashlib.sha256(token).digest(), signature, authorities, source)
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    outcome = _verify(token, signature, authorities, source)
    with _memo_lock:
        _memo[key] = outcome
        if len(_memo) > _MEMO_ENTRIES:
            _memo.popitem(last=False)
    return outcome


def _verify(
    token: bytes, signature: bytes, authorities: tuple[TimestampAuthority, ...], source: str
) -> _Outcome:
    """The TSA that vouches for `token` over `signature` and its time, or the refusal's error and message."""
    try:
        response = _decode(token, what=f"{source}: rfc3161 timestamp")
    except MalformedArtifactError as e:
        return MalformedArtifactError, str(e)
    reasons = []
    for authority in authorities:
        verifier = rfc3161_client.VerifierBuilder(
            roots=list(authority.roots), intermediates=list(authority.intermediates)
        ).build()
        try:
            verifier.verify_message(response, signature)
        except rfc3161_client.VerificationError as e:
            reasons.append(f"{authority.name}: {e}")
            continue
        return _Trusted(response.tst_info.gen_time, authority.name)
    detail = "; ".join(reasons) if reasons else "no timestamp authority is configured"
    return SignatureError, f"{source}: rfc3161 timestamp is not trusted for this signature ({detail})"
