"""Signature bundles of a model: where they are, how they are read, and which trusted key signed them."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations.bundle import Bundle, parse_bundle
from modelsec.errors import (
    MalformedArtifactError,
    PolicyViolationError,
    SignatureError,
    UntrustedSignerError,
)
from modelsec.limits import Limits
from modelsec.modelformat.model_files import open_beneath
from modelsec.policy import Policy
from modelsec.signer.keys import TrustedKey
from modelsec.signer.layout import OMS_BUNDLE_NAME
from modelsec.signer.schemes import all_schemes, scheme_for, scheme_for_bundle_name
from modelsec.verifier.trust.timestamp_backend import check_bundle_timestamps

if TYPE_CHECKING:
    from modelsec.policy import Authority, TimestampAuthority

__all__ = [
    "check_bundle_name",
    "check_bundle_size",
    "check_signature_time",
    "has_key_for_bundle",
    "read_bundle",
    "read_bundle_bytes",
    "signature_algorithms",
    "verify_bundle_signature",
]


def read_bundle(path: Path, limits: Limits) -> Bundle:
    """Read and parse a bundle file (symlinks refused, size bounded by `limits.max_bundle_bytes`).

    Raises:
        SignatureError: The file does not exist.
        MalformedArtifactError: Too large, not a regular file, or not a well-formed bundle.
        PolicyViolationError: The path is a symlink.
    """
    data = read_bundle_bytes(path, limits.max_bundle_bytes)
    check_bundle_size(data, path, limits)
    return parse_bundle(data, source=str(path))


def check_bundle_size(data: bytes, path: Path, limits: Limits) -> None:
    """Refuse a bundle over `limits.max_bundle_bytes`, naming the policy field that raises the limit.

    Raises:
        MalformedArtifactError: `data` is larger than the limit.
    """
    if len(data) > limits.max_bundle_bytes:
        raise MalformedArtifactError(
            f"{path}: signature bundle exceeds {limits.max_bundle_bytes} bytes (limits.maxBundleBytes of "
            "the policy file raises it)"
        )


def read_bundle_bytes(path: Path, max_bytes: int) -> bytes:
    """At most `max_bytes + 1` bytes of a bundle file; the caller checks the size.

    Only a regular file is read, opened without following symlinks and without blocking (a FIFO planted
    in a store cannot hang the reader). In a Hugging Face hub cache snapshot, a bundle that is a link to a
    blob of the same cache entry is read from that blob, as every model file is
    (`modelsec.modelformat.model_files.open_beneath`).

    Raises:
        SignatureError: The file does not exist.
        MalformedArtifactError: Not a regular file, or unreadable.
        PolicyViolationError: The path is a symlink.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SignatureError(f"{path}: signature bundle not found") from None
    except OSError as e:
        if not os.path.islink(path):
            raise MalformedArtifactError(f"{path}: cannot open signature bundle: {e.strerror}") from e
        blob = _open_hub_bundle(path)
        if blob is None:
            raise PolicyViolationError(f"{path}: signature bundle is a symlink; refused") from e
        fd = blob
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise MalformedArtifactError(f"{path}: signature bundle is not a regular file")
        return f.read(max_bytes + 1)


def _open_hub_bundle(path: Path) -> int | None:
    """The blob behind a hub cache snapshot's bundle link, or None when `path` is any other link."""
    try:
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return open_beneath(parent_fd, path.name, what=str(path.parent))
    except PolicyViolationError:
        return None
    finally:
        os.close(parent_fd)


def verify_bundle_signature(
    bundle: Bundle,
    keys: Sequence[TrustedKey],
    *,
    role: str | None = "weights",
    authorities: Sequence[Authority] = (),
    timestamp_authorities: Sequence[TimestampAuthority] = (),
) -> TrustedKey:
    """Check the bundle's single DSSE signature with the trusted keys, then through the authorities.

    The bundle's `publicKey.hint` and DSSE `keyid` only order the candidates (a key whose keyid matches is
    tried first); every configured key allowed for `role` is tried, and the signature alone decides. A
    public key embedded in the bundle is never used (DESIGN.md decision 7); a certificate in it is believed
    only through a configured authority (decision 12, `modelsec.verifier.trust.identity`).

    Args:
        bundle: A parsed bundle.
        keys: The policy's trusted keys.
        role: The role the signing key must hold (`weights`, `watermark`, `gate`); None: any configured key.
        authorities: The policy's certificate and Sigstore authorities (tried when no key verifies and the
            bundle carries a certificate).
        timestamp_authorities: The policy's TSAs: an X.509 chain is checked at the time of each bundle
            timestamp one of them vouches for, else now (`modelsec.verifier.trust.identity`).

    Returns:
        The trusted key that verified: a pinned key, or the key of a certificate an authority vouched for.

    Raises:
        SignatureError: No configured key verifies the signature over the PAE, and no authority vouches for
            the bundle's certificate and signature.
            Or an X.509 bundle carries a timestamp a TSA vouches for that is dated in the future.
            `UntrustedSignerError` (a subclass) when the bundle names no key tried: another signer's.
        MalformedArtifactError: The bundle's certificates are malformed (only read when authorities are
            configured).
        BackendUnavailableError: A Sigstore authority is configured without the `sigstore` package, or an
            X.509 bundle's timestamps must be verified without `rfc3161-client`.
        PolicyError: A Sigstore authority's trusted root cannot be loaded.
    """
    selectors = {bundle.hint, bundle.signature.keyid} - {""}
    candidates = sorted(
        (k for k in keys if role is None or k.may(role)), key=lambda k: not k.is_named_by(selectors)
    )
    message = bundle.envelope.pae()
    shape = signature_algorithms(bundle.signature.sig)
    reasons = []
    # "Invalid" only when the bundle names a key the caller trusts; a bundle of another signer is not
    # invalid, only not trusted here (pull or verify with one of two signers' keys meets the other's).
    named = any(k.is_named_by(selectors) for k in candidates)
    for key in candidates:
        try:
            key.verify(bundle.signature.sig, message)
        except SignatureError as e:
            # The key that checked the signature describes it; the encoding only adds a hint, and only
            # when the signature is well formed, in range, for another scheme (`signature_algorithms`).
            reason = f"{key.name}: {e if named else str(e).removeprefix('invalid signature: ')}"
            if shape is not None and key.algorithm not in shape:
                reason += f" (it has the form of an {' or '.join(sorted(a.value for a in shape))} signature)"
            reasons.append(reason)
            continue
        return key
    refusals: list[str] = []
    if authorities:
        # Imported here: certificate chains (cryptography.x509) are only for policies with authorities, and
        # the loader's start-up would otherwise pay for them.
        from modelsec.verifier.trust.identity import verify_with_authorities

        vouched, refusals = verify_with_authorities(
            bundle, authorities, role=role, timestamp_authorities=timestamp_authorities
        )
        if vouched is not None:
            return vouched
        reasons.extend(refusals)
    # An authority's refusal (another identity, an untrusted root) is the reason itself: it stays in the line.
    if not named and not refusals:
        stated = bundle.hint or bundle.signature.keyid
        other_role = next((k.name for k in keys if k.is_named_by(selectors)), None)
        raise UntrustedSignerError(
            bundle.source,
            stated,
            [(k.name, k.keyid) for k in candidates],
            role=role,
            reasons=reasons,
            named_key=other_role,
        )
    detail = "; ".join(reasons) if reasons else f"no configured key may sign {role!r}"
    verdict = "invalid signature" if named else "signed by a key not trusted here"
    raise SignatureError(
        f"{bundle.source}: {verdict}: no trusted key allowed to sign {role!r} verifies its signature "
        f"({detail})"
    )


def check_signature_time(
    bundle: Bundle, key: TrustedKey, policy: Policy, *, now: datetime | None = None
) -> tuple[datetime, ...]:
    """Place a verified bundle's signature in time: its RFC 3161 timestamps, then its key's validity window.

    With `policy.timestamp_authorities`, every timestamp in the bundle must be a TSA's timestamp over this
    signature, dated no later than `now` plus the clock-skew allowance
    (`modelsec.verifier.trust.timestamps.check_timestamps`, each timestamp verified once for both this check
    and the X.509 chain's); without any TSA, timestamps are not read (no TSA to believe them through). A key
    window (`policy.window_for(key)`) then holds every trusted time; with no trusted time it holds the
    verification time `now`: a signature made before its key's `validUntil` stays valid later only if a
    trusted timestamp proves it.

    Args:
        bundle: A bundle whose signature `key` verified.
        key: The policy key that verified it.
        policy: The TSAs, `requireTimestamp` and key windows.
        now: The verification time (default: the current time).

    Returns:
        The trusted times of its timestamps (empty when none was verified).

    Raises:
        SignatureError: A timestamp is untrusted, over other bytes or dated after `now` plus
            `modelsec.verifier.trust.timestamps.CLOCK_SKEW`, a required timestamp is missing, or a time lies
            outside the key's window.
        MalformedArtifactError: A timestamp is not a granted DER `TimeStampResp`.
        BackendUnavailableError: Timestamps must be verified and `rfc3161-client` is not installed.
    """
    times: tuple[datetime, ...] = ()
    if policy.timestamp_authorities and bundle.timestamps:
        times = check_bundle_timestamps(bundle, policy.timestamp_authorities, now=now).all_trusted()
    if policy.require_timestamp and not times:
        raise SignatureError(
            f"{bundle.source}: the policy requires an RFC 3161 timestamp; the bundle has none"
        )
    window = policy.window_for(key)
    if window is not None:
        for time in times or (now or datetime.now(UTC),):
            try:
                window.check(time)
            except SignatureError as e:
                raise SignatureError(f"{bundle.source}: {e}") from None
    return times


def check_bundle_name(path: Path, key: TrustedKey) -> None:
    """Refuse a default-named bundle signed by a key of another algorithm than its name says.

    The default names (`modelsec.signer.layout.SIGNATURE_FILE_NAMES`) say which scheme signed:
    `model.p384.sig` is ECDSA P-384, `model.sm2.sig` SM2, `model.ml-dsa-65.sig` ML-DSA-65, and only that
    scheme's key may have signed it, so a copy of one bundle under another default name is not a second
    signature (nor counted for `--require`). `model.sig` is the exception: model_signing writes every bundle
    there, whatever its key (ECDSA on any curve, certificates and keyless Sigstore, ML-DSA where it supports
    it), so it accepts every scheme that ecosystem signs with (`SignatureScheme.certified`: all but SM2, which
    only modelsec writes, to `model.sm2.sig`). Other names (explicit `--signature` paths) say nothing and are
    not checked.

    Args:
        path: The bundle's path; only its final name is looked at.
        key: The trusted key that verified its signature.

    Raises:
        SignatureError: The name is a default name of another scheme; the message names the file, the
            name's algorithm and the key's.
    """
    named = scheme_for_bundle_name(path.name)
    if named is None:
        return
    signer = scheme_for(key.algorithm)
    if signer is named or (path.name == OMS_BUNDLE_NAME and signer.certified):
        return
    wanted = "a model_signing scheme (not sm2)" if path.name == OMS_BUNDLE_NAME else named.algorithm.value
    raise SignatureError(
        f"{path}: the name {path.name!r} is for {wanted} bundles, but the {key.algorithm.value} key "
        f"{key.name} signed it; refused (a default-named bundle must be of its name's algorithm)"
    )


def has_key_for_bundle(
    path: Path, bundle: Bundle, keys: Sequence[TrustedKey], authorities: Sequence[Authority] = ()
) -> bool:
    """Whether any key or authority could verify the default-named bundle `path`, read as `bundle`.

    A name other than `model.sig` fixes its scheme (`check_bundle_name`), so only a key of exactly that
    algorithm could (`model.p384.sig`: an ECDSA P-384 key; `model.ml-dsa-44.sig`: an ML-DSA-44 key).
    `model.sig` holds any curve of its family (model_signing writes every ECDSA bundle there), so any key of
    that family could, except one the signature's encoding rules out (`signature_algorithms`: a P-384
    signature with a P-256 key). An authority could vouch for the names of certified schemes
    (`SignatureScheme.certified`: all but SM2). A name no scheme writes counts as verifiable, so the caller
    reports its signature failure instead of skipping it.

    Only the name and the signature's shape are looked at; nothing is verified here (the caller asks this
    once a bundle did not verify, to skip rather than refuse it).
    """
    scheme = scheme_for_bundle_name(path.name)
    if scheme is None:
        return True
    if authorities and scheme.certified:
        return True
    if path.name != OMS_BUNDLE_NAME:
        return any(k.algorithm is scheme.algorithm for k in keys)
    shape = signature_algorithms(bundle.signature.sig)
    return any(
        scheme_for(k.algorithm).family == scheme.family and (shape is None or k.algorithm in shape)
        for k in keys
    )


# The curves whose DER signatures have r and s of at most this many bits (and more than the row above's).
_ECDSA_WIDTHS: tuple[tuple[int, frozenset[SignatureAlgorithm]], ...] = (
    (256, frozenset({SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.SM2})),
    (384, frozenset({SignatureAlgorithm.ECDSA_P384})),
)


def signature_algorithms(signature: bytes) -> frozenset[SignatureAlgorithm] | None:
    """The algorithms whose signatures `signature` can be, from its encoding alone; None when it says nothing.

    Never verified. A scheme counts only when its own strict decoding accepts the signature
    (`SignatureScheme.signature_form_error`: strict DER with r and s in [1, n-1] of its curve, or an ML-DSA
    parameter set's fixed length, FIPS 204 table 2): a 256-bit-wide signature with s >= n or r = 0 fits no
    scheme and says nothing, so the key that checks it describes it. Among the ECDSA-shaped schemes, every
    256-bit curve's signature is also in range for P-384, so the width separates them: r and s both of at most
    256 bits fit a 256-bit curve (P-256, SM2: r, s < n < 2^256), and both wider fit P-384 (each of a P-384
    signature's r and s is below 2^256 with probability about 2^-128). One of each width fits neither.
    """
    fits = frozenset(x.algorithm for x in all_schemes() if x.signature_form_error(signature) is None)
    try:
        r, s = decode_dss_signature(signature)
    except ValueError:
        return fits or None
    narrow, wide = sorted((r.bit_length(), s.bit_length()))
    lower = 0
    for bits, algs in _ECDSA_WIDTHS:
        if lower < narrow and wide <= bits:  # both integers in (lower, bits] bits
            return (fits & algs) or None
        lower = bits
    return None
