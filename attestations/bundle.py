"""Sigstore bundle v0.3 JSON carrying a DSSE envelope: strict read, write, and signing.

Source: sigstore protobuf-specs `dev.sigstore.bundle.v1.Bundle` (media type
`application/vnd.dev.sigstore.bundle.v0.3+json`), the same wire format `model_signing` 1.x writes for
key-based signing: `verificationMaterial.publicKey.hint` = hex(SHA-256(public key PEM)), an empty
`tlogEntries`, and a `dsseEnvelope` with base64 `payload`, `payloadType` and exactly one signature.

What parsing guarantees: the structure, the media type, exactly one signature with non-empty strict base64
`sig`, payloadType exactly `application/vnd.in-toto+json`. What it does *not* do: verify anything. Key
material in the bundle (`publicKey.rawBytes`, certificates) is never returned to callers, so it cannot be
used to verify (DESIGN.md decision 7); the hint and keyid are returned as untrusted selectors only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from modelsec.attestations.dsse import PAYLOAD_TYPE_IN_TOTO, Envelope, EnvelopeSignature
from modelsec.attestations.statement import Statement, serialize_statement
from modelsec.errors import MalformedArtifactError, SignatureError
from modelsec.strict_json import strict_loads

__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "Bundle",
    "HintingSigner",
    "StatementSigner",
    "add_timestamps",
    "bundle_to_json",
    "key_hint",
    "parse_bundle",
    "sign_payload",
    "sign_statement",
    "with_certificate_chain",
]

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
_MAX_TIMESTAMPS = 16
_TOP_LEVEL = {"mediaType", "verificationMaterial", "dsseEnvelope", "messageSignature"}


class StatementSigner(Protocol):
    """What DSSE signing needs from a key backend (`modelsec.signer.KeyBackend` satisfies it)."""

    def public_key_pem(self) -> bytes:
        """The SubjectPublicKeyInfo PEM of the signing key."""
        ...

    def sign(self, message: bytes) -> bytes:
        """Sign `message` (the PAE bytes); DER signature."""
        ...


@runtime_checkable
class HintingSigner(Protocol):
    """A signer whose scheme writes its own `publicKey.hint` (ML-DSA: `ML_DSA_65:<hex>`, as model_signing)."""

    def key_hint(self) -> str:
        """The hint (and DSSE keyid) to write instead of hex(SHA-256(public key PEM))."""
        ...


@dataclass(frozen=True, slots=True)
class Bundle:
    """A parsed (not yet verified) bundle.

    Attributes:
        envelope: The DSSE envelope with exactly one signature.
        hint: `verificationMaterial.publicKey.hint`, untrusted, or "" when absent.
        source: Names the bundle (path) in diagnostics.
        timestamps: The DER `TimeStampResp` of each RFC 3161 timestamp in
            `verificationMaterial.timestampVerificationData.rfc3161Timestamps` (over the signature bytes),
            unverified (`modelsec.verifier.trust.timestamps`).
        data: The bundle file's bytes, for the verifiers of certificate and keyless bundles
            (`modelsec.verifier.trust.identity`), which believe its certificates only through a configured
            root.
    """

    envelope: Envelope
    hint: str
    source: str
    timestamps: tuple[bytes, ...] = ()
    data: bytes = field(default=b"", repr=False, compare=False)

    @property
    def signature(self) -> EnvelopeSignature:
        """The single signature."""
        return self.envelope.signatures[0]


def key_hint(public_key_pem: bytes) -> str:
    """The public-key hint of the OMS interop profile: hex(SHA-256(SubjectPublicKeyInfo PEM))."""
    return hashlib.sha256(public_key_pem).hexdigest()


def _b64(value: Any, *, what: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise MalformedArtifactError(f"{what} must be a non-empty base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MalformedArtifactError(f"{what} is not valid base64: {e}") from e


def parse_bundle(data: bytes, *, source: str) -> Bundle:
    """Parse a sigstore bundle v0.3 with a DSSE envelope, strictly.

    Args:
        data: The bundle file contents (size already bounded by the caller's `Limits`).
        source: Names the bundle in errors (usually its path).

    Returns:
        The bundle; nothing in it is verified yet.

    Raises:
        MalformedArtifactError: Not JSON, wrong media type, no DSSE envelope, bad base64.
        SignatureError: The envelope does not carry exactly one signature, or a signature is empty.
    """
    doc = strict_loads(data, what=source)
    if not isinstance(doc, dict):
        raise MalformedArtifactError(f"{source}: bundle is not a JSON object")
    unknown = set(doc) - _TOP_LEVEL
    if unknown:
        raise MalformedArtifactError(f"{source}: bundle has unknown fields {sorted(unknown)}")
    if doc.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise MalformedArtifactError(
            f"{source}: bundle mediaType must be {BUNDLE_MEDIA_TYPE!r}, got {doc.get('mediaType')!r}"
        )
    if "messageSignature" in doc:
        raise MalformedArtifactError(f"{source}: bundle carries a messageSignature, expected a dsseEnvelope")
    env = doc.get("dsseEnvelope")
    if not isinstance(env, dict):
        raise MalformedArtifactError(f"{source}: bundle has no dsseEnvelope object")
    payload_type = env.get("payloadType")
    if payload_type != PAYLOAD_TYPE_IN_TOTO:
        raise MalformedArtifactError(
            f"{source}: DSSE payloadType must be exactly {PAYLOAD_TYPE_IN_TOTO!r}, got {payload_type!r}"
        )
    payload = _b64(env.get("payload"), what=f"{source}: dsseEnvelope.payload")
    sigs = env.get("signatures")
    if not isinstance(sigs, list):
        raise SignatureError(f"{source}: dsseEnvelope.signatures is missing or not a list")
    if len(sigs) != 1:
        raise SignatureError(f"{source}: DSSE envelope must carry exactly one signature, found {len(sigs)}")
    entry = sigs[0]
    if not isinstance(entry, dict) or "sig" not in entry:
        raise SignatureError(f"{source}: dsseEnvelope.signatures[0] has no 'sig' field")
    try:
        sig = _b64(entry["sig"], what=f"{source}: dsseEnvelope.signatures[0].sig")
    except MalformedArtifactError as e:
        raise SignatureError(f"invalid signature: {e}") from e
    # The keyid only orders candidate keys, never decides trust. model_signing 1.0.x writes `"keyid": null`
    # (protobuf JSON's default value), so null and absent both mean "no keyid".
    keyid = entry.get("keyid")
    if keyid is None:
        keyid = ""
    if not isinstance(keyid, str):
        raise MalformedArtifactError(f"{source}: dsseEnvelope.signatures[0].keyid is not a string or null")
    hint = ""
    timestamps: tuple[bytes, ...] = ()
    material = doc.get("verificationMaterial")
    if material is not None:
        if not isinstance(material, dict):
            raise MalformedArtifactError(f"{source}: verificationMaterial is not an object")
        public_key = material.get("publicKey")
        if isinstance(public_key, dict) and isinstance(public_key.get("hint"), str):
            hint = public_key["hint"]
        timestamps = _parse_timestamps(material.get("timestampVerificationData"), source=source)
    envelope = Envelope(
        payload=payload, payload_type=payload_type, signatures=(EnvelopeSignature(sig, keyid),)
    )
    return Bundle(envelope=envelope, hint=hint, source=source, timestamps=timestamps, data=data)


def _parse_timestamps(data: Any, *, source: str) -> tuple[bytes, ...]:
    """`timestampVerificationData.rfc3161Timestamps[].signedTimestamp` (sigstore bundle v0.3), strictly."""
    what = f"{source}: verificationMaterial.timestampVerificationData"
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise MalformedArtifactError(f"{what} is not an object")
    entries = data.get("rfc3161Timestamps", [])
    if not isinstance(entries, list) or len(entries) > _MAX_TIMESTAMPS:
        raise MalformedArtifactError(f"{what}.rfc3161Timestamps is not a list of at most {_MAX_TIMESTAMPS}")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise MalformedArtifactError(f"{what}.rfc3161Timestamps[{i}] is not an object")
        out.append(_b64(entry.get("signedTimestamp"), what=f"{what}.rfc3161Timestamps[{i}].signedTimestamp"))
    return tuple(out)


def add_timestamps(bundle_json: bytes, timestamps: Sequence[bytes], *, source: str) -> bytes:
    """The bundle with RFC 3161 timestamps (DER `TimeStampResp`) appended where sigstore keeps them.

    Raises:
        MalformedArtifactError: `bundle_json` is not a well-formed bundle.
    """
    parse_bundle(bundle_json, source=source)
    doc = strict_loads(bundle_json, what=source)
    material = doc.setdefault("verificationMaterial", {})
    entries = material.setdefault("timestampVerificationData", {}).setdefault("rfc3161Timestamps", [])
    entries.extend({"signedTimestamp": base64.b64encode(t).decode("ascii")} for t in timestamps)
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def bundle_to_json(envelope: Envelope, *, hint: str) -> bytes:
    """Serialise a signed envelope as a sigstore bundle v0.3 (model_signing-compatible key bundle)."""
    doc = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(envelope.payload).decode("ascii"),
            "payloadType": envelope.payload_type,
            "signatures": [
                {"sig": base64.b64encode(s.sig).decode("ascii"), "keyid": s.keyid}
                for s in envelope.signatures
            ],
        },
    }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def sign_statement(statement: Statement, signer: StatementSigner) -> bytes:
    """Sign an in-toto statement as DSSE and return the bundle JSON.

    The payload is `serialize_statement(statement)`; see `sign_payload`.

    Args:
        statement: The statement to sign.
        signer: A key backend (ECDSA or SM2) holding the private key.

    Returns:
        The bundle file contents.
    """
    return sign_payload(serialize_statement(statement), signer)


def sign_payload(payload: bytes, signer: StatementSigner) -> bytes:
    """Sign exact in-toto statement bytes as DSSE and return the bundle JSON.

    The signature covers `PAE("application/vnd.in-toto+json", payload)`; the hint (also used as the DSSE
    keyid) is hex(SHA-256(public key PEM)), or the signer's own `key_hint()` (`HintingSigner`). The caller
    is responsible for `payload` being a statement it means to sign (the signing service parses it strictly
    first).

    Args:
        payload: The statement JSON bytes, signed as they are.
        signer: A key backend (ECDSA or SM2) holding the private key.

    Returns:
        The bundle file contents.
    """
    hint = signer.key_hint() if isinstance(signer, HintingSigner) else key_hint(signer.public_key_pem())
    unsigned = Envelope(payload=payload, payload_type=PAYLOAD_TYPE_IN_TOTO, signatures=())
    sig = signer.sign(unsigned.pae())
    signed = Envelope(
        payload=payload, payload_type=PAYLOAD_TYPE_IN_TOTO, signatures=(EnvelopeSignature(sig, hint),)
    )
    return bundle_to_json(signed, hint=hint)


def with_certificate_chain(bundle_json: bytes, certificates: Sequence[bytes], *, source: str) -> bytes:
    """The bundle with `certificates` (DER, leaf first) as its verification material, as model_signing writes.

    model_signing 1.x's `certificate` method writes `verificationMaterial.x509CertificateChain.certificates`
    (`rawBytes`, leaf then the rest of the chain) and an empty `tlogEntries`, with no public-key hint; the
    DSSE signature's keyid is empty. The signature is left as it is (it covers only the payload).

    Raises:
        MalformedArtifactError: `bundle_json` is not a well-formed bundle, or `certificates` is empty.
    """
    if not certificates:
        raise MalformedArtifactError(f"{source}: a certificate bundle needs the signing certificate")
    parse_bundle(bundle_json, source=source)
    doc = strict_loads(bundle_json, what=source)
    doc["verificationMaterial"] = {
        "x509CertificateChain": {
            "certificates": [{"rawBytes": base64.b64encode(c).decode("ascii")} for c in certificates]
        },
        "tlogEntries": [],
    }
    for signature in doc["dsseEnvelope"]["signatures"]:
        signature["keyid"] = ""
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")
