"""Trust in identities: bundles signed under a certificate, believed only through a configured authority.

Two kinds of authority (DESIGN.md decision 12; `modelsec.policy.X509Authority`, `SigstoreAuthority`):

* **X.509** (model_signing's `certificate` method: `verificationMaterial.x509CertificateChain` = leaf, then
  intermediates; or a v0.3 `certificate`). A path is built from the leaf to one of the authority's roots
  (pyca/cryptography's `PolicyBuilder`, RFC 5280 / CA/B Forum profile), using the bundle's other
  certificates only as untrusted intermediates. *When* the chain is checked (path building, every
  certificate's validity window, the leaf): at the time of each RFC 3161 timestamp over the bundle's
  signature that a TSA of the *policy* vouches for (`modelsec.verifier.trust.x509_chain`: the timestamp's CMS
  signature, its imprint of this signature and its TSA chain are verified before its time is used), and the
  chain must verify at every such time; without one, at the verification time (*now*), so an expired leaf
  is refused unless a trusted timestamp shows it signed in time. A timestamp no configured TSA vouches for
  is not believed (now decides, never a time the bundle claims; where the policy has TSAs,
  `modelsec.verifier.trust.bundles.check_signature_time` then refuses the bundle for it). (model_signing
  itself checks at the leaf's notBefore.) The leaf must have
  the code-signing EKU and, when it has a key usage, `digitalSignature`; it must name one of the
  authority's identities. A leaf that asserts `CA:TRUE` is refused by the end-entity profile unless the
  authority sets `allowCaLeaf` (model_signing's own test certificates are such leaves); it then must have a
  key usage with `digitalSignature` as well as the code-signing EKU. Then the DSSE signature is checked with
  the leaf's public key.
* **Sigstore keyless** (`model_signing sign sigstore`): verified offline by the `sigstore` package against a
  trusted root (the package's embedded production or staging root, or a `trusted_root.json`): Fulcio chain,
  SCT, Rekor inclusion proof with its checkpoint or SET, RFC 3161 timestamps, signing time inside the
  certificate's validity, the DSSE signature, and the identity + issuer rules. No network, no cache writes.

Either way the result is a `TrustedKey` built from the verified leaf (named after the authority and the
identity; for X.509 checked at timestamp times, the name says at which), so what follows is the same as for
a pinned key. Nothing here trusts a certificate by itself.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import ExtendedKeyUsageOID, ObjectIdentifier

from modelsec.attestations.bundle import Bundle
from modelsec.errors import (
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    PolicyError,
    SignatureError,
)
from modelsec.policy import Authority, IdentityRule, SigstoreAuthority, TimestampAuthority, X509Authority
from modelsec.signer.keys import TrustedKey, load_trusted_key
from modelsec.strict_json import strict_loads
from modelsec.verifier.trust.x509_chain import trusted_times, verify_chain

if TYPE_CHECKING:
    from sigstore.models import TrustedRoot

__all__ = ["bundle_certificates", "verify_with_authorities"]

_OIDC_ISSUER_V1 = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")  # raw bytes
_OIDC_ISSUER_V2 = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")  # DER UTF8String
_SIGSTORE_OTHERNAME = ObjectIdentifier("1.3.6.1.4.1.57264.1.7")
_MAX_CERTIFICATES = 10
_EMBEDDED_ROOTS = {
    "production": "https%3A%2F%2Ftuf-repo-cdn.sigstore.dev",
    "staging": "https%3A%2F%2Ftuf-repo-cdn.sigstage.dev",
}


def bundle_certificates(bundle: Bundle) -> tuple[bytes, ...]:
    """The DER certificates of a bundle's verification material, leaf first; untrusted.

    Reads `verificationMaterial.certificate.rawBytes` (bundle v0.3) or
    `verificationMaterial.x509CertificateChain.certificates[].rawBytes` (model_signing's `certificate`
    method). Nothing is verified.

    Returns:
        The certificates (empty for a public-key bundle).

    Raises:
        MalformedArtifactError: The material is not an object, a certificate is not base64, or there are
            more than 10.
    """
    doc = strict_loads(bundle.data, what=bundle.source) if bundle.data else {}
    material = doc.get("verificationMaterial") if isinstance(doc, dict) else None
    if not isinstance(material, dict):
        return ()
    single, chain = material.get("certificate"), material.get("x509CertificateChain")
    if single is not None and chain is not None:
        raise MalformedArtifactError(
            f"{bundle.source}: verificationMaterial has both certificate and x509CertificateChain"
        )
    if single is not None:
        entries: Any = [single]
        where = "verificationMaterial.certificate"
    elif chain is not None:
        entries = chain.get("certificates") if isinstance(chain, dict) else None
        where = "verificationMaterial.x509CertificateChain.certificates"
    else:
        return ()
    if not isinstance(entries, list) or not entries or len(entries) > _MAX_CERTIFICATES:
        raise MalformedArtifactError(
            f"{bundle.source}: {where} must hold 1 to {_MAX_CERTIFICATES} certificates"
        )
    out = []
    for i, entry in enumerate(entries):
        raw = entry.get("rawBytes") if isinstance(entry, dict) else None
        try:
            if not isinstance(raw, str) or not raw:
                raise ValueError("not a string")
            out.append(base64.b64decode(raw, validate=True))
        except (binascii.Error, ValueError) as e:
            raise MalformedArtifactError(f"{bundle.source}: {where}[{i}].rawBytes is not base64: {e}") from e
    return tuple(out)


def verify_with_authorities(
    bundle: Bundle,
    authorities: Sequence[Authority],
    *,
    role: str | None,
    timestamp_authorities: Sequence[TimestampAuthority] = (),
) -> tuple[TrustedKey | None, list[str]]:
    """Verify a bundle's certificate and signature through the first authority that vouches for it.

    Args:
        bundle: A parsed bundle (its `data` is read for the certificates and, for Sigstore, the rest of its
            verification material).
        authorities: The policy's authorities; those not allowed to sign `role` are not tried.
        role: The role the signer must hold (None: any).
        timestamp_authorities: The policy's TSAs: an X.509 chain is checked at the time of each bundle
            timestamp one of them vouches for (`trusted_times`), else now. Sigstore keyless bundles use
            their own verified times.

    Returns:
        The key of the verified leaf certificate (its name says which authority and identity), or None with
        each tried authority's reason for refusing; (None, []) when the bundle holds no certificate.

    Raises:
        MalformedArtifactError: The bundle's certificates are malformed (`bundle_certificates`).
        SignatureError: A timestamp a policy TSA vouches for is dated in the future (`trusted_times`).
        BackendUnavailableError: A Sigstore authority is configured but the `sigstore` package is missing,
            or the bundle's timestamps must be verified and `rfc3161-client` is missing.
        PolicyError: A Sigstore authority's trusted root cannot be loaded.
    """
    certificates = bundle_certificates(bundle)
    if not certificates:
        return None, []
    reasons: list[str] = []
    times: tuple[datetime.datetime, ...] | None = None
    for authority in authorities:
        if role is not None and not authority.may(role):
            continue
        if isinstance(authority, X509Authority) and times is None:
            # Outside the try: a trusted timestamp from the future refuses the bundle, not one authority.
            times = trusted_times(bundle, timestamp_authorities)
        try:
            if isinstance(authority, X509Authority):
                return _verify_x509(bundle, certificates, authority, times or ()), reasons
            return _verify_sigstore(bundle, authority), reasons
        except SignatureError as e:
            reasons.append(f"{authority.name}: {e}")
    return None, reasons


def _verify_x509(
    bundle: Bundle,
    certificates: tuple[bytes, ...],
    authority: X509Authority,
    times: tuple[datetime.datetime, ...],
) -> TrustedKey:
    try:
        leaf, *intermediates = (x509.load_der_x509_certificate(c) for c in certificates)
        roots = [x509.load_der_x509_certificate(r) for r in authority.roots]
    except ValueError as e:
        raise SignatureError(f"a certificate cannot be parsed: {e}") from e
    ca_leaf = _asserts_ca(leaf)
    if ca_leaf and not authority.allow_ca_leaf:
        raise SignatureError(
            "the signing certificate asserts CA:TRUE (basicConstraints), which the end-entity profile "
            "refuses; to accept such a leaf, set `allowCaLeaf: true` in the x509 of authority "
            f"{authority.name!r} (it must still have keyUsage digitalSignature and extendedKeyUsage "
            "codeSigning)"
        )
    verify_chain(leaf, intermediates, roots, times, allow_ca_leaf=ca_leaf)
    _check_signing_usage(leaf, ca_leaf=ca_leaf)
    rule = _match_identity(leaf, authority.identities)
    name = f"{authority.name}: {_named(rule, leaf)}"
    if times:
        name += f" (chain checked at RFC 3161 timestamp time {', '.join(t.isoformat() for t in times)})"
    return _leaf_key(bundle, leaf, name, authority.roles)


def _named(rule: IdentityRule, leaf: x509.Certificate) -> str:
    """The rule that matched; for an unconstrained one (`--certificate-chain` alone), what the leaf names."""
    if any(v is not None for v in (rule.identity, rule.identity_regexp, rule.issuer, rule.issuer_regexp)):
        return str(rule)
    return f"any identity ({', '.join(_sans(leaf)) or leaf.subject.rfc4514_string()})"


def _asserts_ca(leaf: x509.Certificate) -> bool:
    """Whether the signing certificate's basicConstraints says `CA:TRUE`."""
    try:
        return bool(leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _check_signing_usage(leaf: x509.Certificate, *, ca_leaf: bool) -> None:
    """The leaf may sign code: EKU codeSigning; digitalSignature in its key usage (a CA leaf needs one)."""
    what = "the signing certificate"
    if ca_leaf:
        what += " (CA:TRUE, accepted by allowCaLeaf)"
    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        raise SignatureError(f"{what} has no extended key usage (code signing needed)") from None
    if ExtendedKeyUsageOID.CODE_SIGNING not in eku:
        raise SignatureError(f"{what}: its extended key usage does not include code signing")
    try:
        usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        if ca_leaf:
            raise SignatureError(f"{what} has no key usage (digitalSignature needed)") from None
        return
    if not usage.digital_signature:
        raise SignatureError(f"{what}: its key usage does not include digitalSignature")


def _sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    names = [
        *ext.get_values_for_type(x509.UniformResourceIdentifier),
        *ext.get_values_for_type(x509.RFC822Name),
    ]
    for other in ext.get_values_for_type(x509.OtherName):
        if other.type_id == _SIGSTORE_OTHERNAME:
            try:
                names.append(_der_utf8(other.value))
            except ValueError:
                continue
    return names


def _der_utf8(der: bytes) -> str:
    """The text of a short DER UTF8String (tag 0x0C, definite length below 128 or 0x81 form)."""
    if len(der) >= 2 and der[0] == 0x0C:
        length, start = der[1], 2
        if length == 0x81 and len(der) >= 3:
            length, start = der[2], 3
        if length < 0x80 or start == 3:
            if len(der) == start + length:
                return der[start:].decode("utf-8")
    raise ValueError("not a DER UTF8String")


def _issuer(cert: x509.Certificate) -> str | None:
    for oid, decode in ((_OIDC_ISSUER_V2, _der_utf8), (_OIDC_ISSUER_V1, bytes.decode)):
        try:
            ext = cert.extensions.get_extension_for_oid(oid).value
        except x509.ExtensionNotFound:
            continue
        try:
            return str(decode(ext.value))  # type: ignore[attr-defined]
        except (ValueError, UnicodeDecodeError) as e:
            raise SignatureError(f"the certificate's OIDC issuer extension is malformed: {e}") from e
    return None


def _rule_matches(rule: IdentityRule, sans: list[str], issuer: str | None) -> bool:
    if rule.identity is not None and rule.identity not in sans:
        return False
    if rule.identity_regexp is not None and not any(rule.identity_regexp.fullmatch(s) for s in sans):
        return False
    if rule.issuer is not None and issuer != rule.issuer:
        return False
    return rule.issuer_regexp is None or (
        issuer is not None and rule.issuer_regexp.fullmatch(issuer) is not None
    )


def _match_identity(cert: x509.Certificate, rules: Sequence[IdentityRule]) -> IdentityRule:
    sans, issuer = _sans(cert), _issuer(cert)
    for rule in rules:
        if _rule_matches(rule, sans, issuer):
            return rule
    wanted = "; ".join(str(r) for r in rules)
    raise SignatureError(
        f"the certificate names {', '.join(sans) or 'no identity'} (issuer {issuer or 'none'}), "
        f"not an identity the policy trusts ({wanted})"
    )


def _leaf_key(bundle: Bundle, leaf: x509.Certificate, name: str, roles: frozenset[str]) -> TrustedKey:
    pem = leaf.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    try:
        key = load_trusted_key(pem, name=name, roles=roles)
    except Error as e:
        raise SignatureError(f"the signing certificate's key is not usable: {e.diagnostics()}") from e
    key.verify(bundle.signature.sig, bundle.envelope.pae())
    return key


def _trusted_root(name: str) -> TrustedRoot:
    """`production`/`staging` from the `sigstore` package's embedded files, else a `trusted_root.json` path.

    Raises:
        PolicyError: The file cannot be read or is not a trusted root.
    """
    from sigstore.errors import Error as SigstoreError

    try:
        return _embedded_root(name) if name in _EMBEDDED_ROOTS else _root_file(name)
    except (SigstoreError, ValueError, OSError) as e:
        raise PolicyError(f"Sigstore trusted root {name!r} cannot be loaded: {e}") from e


@functools.lru_cache(maxsize=2)
def _embedded_root(name: str) -> TrustedRoot:
    import importlib.resources

    resource = importlib.resources.files("sigstore._store") / _EMBEDDED_ROOTS[name] / "trusted_root.json"
    with importlib.resources.as_file(resource) as path:
        return _root_file(str(path))


def _root_file(path: str) -> TrustedRoot:
    from sigstore.models import TrustedRoot

    return TrustedRoot.from_file(path)


class _IdentityPolicy:
    """A sigstore `VerificationPolicy`: the certificate matches one of the rules (exact or full regexp)."""

    def __init__(self, rules: Sequence[IdentityRule]) -> None:
        self._rules = rules
        self.matched: IdentityRule | None = None

    def verify(self, cert: x509.Certificate) -> None:
        from sigstore.errors import VerificationError

        try:
            self.matched = _match_identity(cert, self._rules)
        except SignatureError as e:
            raise VerificationError(str(e)) from e


def _verify_sigstore(bundle: Bundle, authority: SigstoreAuthority) -> TrustedKey:
    try:
        from sigstore.errors import Error as SigstoreError
        from sigstore.models import Bundle as SigstoreBundle
        from sigstore.verify import Verifier
    except ImportError as e:
        raise BackendUnavailableError(
            f"{bundle.source}: a Sigstore authority needs the `sigstore` package "
            "(pip install 'modelsec[sigstore]')"
        ) from e
    policy = _IdentityPolicy(authority.identities)
    root = _trusted_root(authority.trusted_root)
    try:
        parsed = SigstoreBundle.from_json(bundle.data)
        payload_type, payload = Verifier(trusted_root=root).verify_dsse(parsed, policy)
        leaf = parsed.signing_certificate
    except (SigstoreError, ValueError, OSError) as e:
        raise SignatureError(f"keyless verification failed: {e}") from e
    # Both parsers read the same bytes; refuse any difference rather than trust the one not verified.
    if (
        payload_type != bundle.envelope.payload_type
        or payload != bundle.envelope.payload
        or policy.matched is None
    ):
        raise SignatureError("the verified DSSE payload differs from the parsed one")
    return _leaf_key(bundle, leaf, f"{authority.name}: {policy.matched}", authority.roles)
