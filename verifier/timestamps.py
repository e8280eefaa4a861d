"""RFC 3161 trusted timestamps over a bundle's signature: obtaining one, and verifying it against TSAs.

A timestamp is stored as sigstore stores it (`verificationMaterial.timestampVerificationData
.rfc3161Timestamps[].signedTimestamp`, the DER `TimeStampResp`) and covers the DSSE signature bytes, as
model_signing's and sigstore's timestamps do. Verification (through `rfc3161-client`) checks the TSA's CMS
signature, its certificate chain up to a root the *operator* configured (DESIGN.md decision 12: certificates
embedded in the response are believed only through that root), the timeStamping extended key usage, and that
the message imprint is the hash of exactly this signature. It does not check revocation of the TSA
certificate. The trusted time then places the signature inside its key's validity window
(`check_validity_window`); without a timestamp the caller passes the verification time.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import rfc3161_client
from cryptography import x509

from modelsec.errors import BackendUnavailableError, KeyMaterialError, MalformedArtifactError, SignatureError
from modelsec.policy import TimestampAuthority, check_validity_window

__all__ = [
    "TimestampAuthority",
    "check_validity_window",
    "load_timestamp_authority",
    "request_timestamp",
    "verify_timestamp",
    "verify_timestamps",
]

_MAX_RESPONSE_BYTES = 64 * 1024
_MAX_CERT_FILE_BYTES = 256 * 1024
_GRANTED = (0, 1)  # PKIStatus granted, grantedWithMods (RFC 3161 section 2.4.2)


def load_timestamp_authority(path: Path, *, name: str | None = None) -> TimestampAuthority:
    """Load a PEM file of TSA certificates: self-issued ones are roots, the others intermediates.

    Raises:
        KeyMaterialError: The file cannot be read, holds no certificate, or no self-issued root.
    """
    try:
        data = path.read_bytes()[: _MAX_CERT_FILE_BYTES + 1]
    except OSError as e:
        raise KeyMaterialError(f"{path}: cannot read TSA certificates: {e.strerror}") from e
    if len(data) > _MAX_CERT_FILE_BYTES:
        raise KeyMaterialError(f"{path}: TSA certificate file is larger than {_MAX_CERT_FILE_BYTES} bytes")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise KeyMaterialError(f"{path}: not a PEM certificate file ({e})") from e
    roots = tuple(c for c in certs if c.subject == c.issuer)
    if not roots:
        raise KeyMaterialError(f"{path}: no self-issued root certificate among the TSA certificates")
    return TimestampAuthority(name or path.name, roots, tuple(c for c in certs if c.subject != c.issuer))


def request_timestamp(signature: bytes, url: str, *, timeout: float = 30.0) -> bytes:
    """Obtain an RFC 3161 timestamp over `signature` from the TSA at `url` (HTTP POST, RFC 3161 section 3.4).

    The request carries a SHA-256 imprint, a random nonce and asks for the TSA's certificate; the response
    must be granted, carry the same imprint and nonce. Whether the TSA is trusted is decided at verification.

    Args:
        signature: The DSSE signature bytes to timestamp.
        url: An `http://` or `https://` URL of the TSA.
        timeout: Seconds for the whole exchange.

    Returns:
        The DER `TimeStampResp`, for `modelsec.attestations.bundle.add_timestamps`.

    Raises:
        BackendUnavailableError: The TSA cannot be reached or answers with an HTTP error (retryable).
        MalformedArtifactError: The TSA's answer is not a granted timestamp over this request.
    """
    if not url.lower().startswith(("http://", "https://")):
        raise KeyMaterialError(f"{url}: the timestamp URL must be http:// or https://")
    request = rfc3161_client.TimestampRequestBuilder(
        data=signature, hash_algorithm=rfc3161_client.HashAlgorithm.SHA256, nonce=True, cert_req=True
    ).build()
    http = urllib.request.Request(  # noqa: S310 (scheme checked above)
        url,
        data=request.as_bytes(),
        headers={"Content-Type": "application/timestamp-query", "Accept": "application/timestamp-reply"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(http, timeout=timeout) as reply:  # noqa: S310
            body = reply.read(_MAX_RESPONSE_BYTES + 1)
    except (urllib.error.URLError, OSError) as e:
        raise BackendUnavailableError(f"{url}: timestamp authority unavailable: {e}") from e
    if len(body) > _MAX_RESPONSE_BYTES:
        raise MalformedArtifactError(f"{url}: timestamp response exceeds {_MAX_RESPONSE_BYTES} bytes")
    response = _decode(body, what=f"{url}: timestamp response")
    if response.tst_info.nonce != request.nonce:
        raise MalformedArtifactError(f"{url}: timestamp response does not answer this request (nonce)")
    if response.tst_info.message_imprint.message != request.message_imprint.message:
        raise MalformedArtifactError(f"{url}: timestamp response is over other bytes than the signature")
    return response.as_bytes()


def _decode(data: bytes, *, what: str) -> rfc3161_client.TimeStampResponse:
    try:
        response = rfc3161_client.decode_timestamp_response(data)
    except ValueError as e:
        raise MalformedArtifactError(f"{what} is not a DER TimeStampResp ({e})") from e
    if response.status not in _GRANTED:
        raise MalformedArtifactError(f"{what}: timestamp not granted (PKIStatus {response.status})")
    return response


def verify_timestamp(
    token: bytes, signature: bytes, authorities: Sequence[TimestampAuthority], *, source: str
) -> datetime:
    """Verify one RFC 3161 timestamp over `signature` against the configured TSAs.

    Args:
        token: The DER `TimeStampResp` from the bundle.
        signature: The DSSE signature bytes it must cover.
        authorities: The operator's TSAs; a response is believed only through one of their roots.
        source: Names the bundle in diagnostics.

    Returns:
        The trusted time (`genTime`, timezone-aware UTC).

    Raises:
        MalformedArtifactError: Not a granted DER timestamp response.
        SignatureError: No configured TSA vouches for it, or it is over other bytes than the signature.
    """
    response = _decode(token, what=f"{source}: rfc3161 timestamp")
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
        return response.tst_info.gen_time
    detail = "; ".join(reasons) if reasons else "no timestamp authority is configured"
    raise SignatureError(f"{source}: rfc3161 timestamp is not trusted for this signature ({detail})")


def verify_timestamps(
    tokens: Sequence[bytes], signature: bytes, authorities: Sequence[TimestampAuthority], *, source: str
) -> tuple[datetime, ...]:
    """The trusted times of every timestamp in a bundle; any untrusted or malformed one fails the bundle.

    Raises:
        MalformedArtifactError: A timestamp is not a granted DER response.
        SignatureError: A timestamp is not trusted or not over this signature.
    """
    return tuple(verify_timestamp(t, signature, authorities, source=source) for t in tokens)
