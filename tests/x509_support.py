"""A throwaway X.509 hierarchy for certificate-trust tests: root and intermediate CAs, code-signing leaves.

Made with `cryptography` at test time (nothing is checked in), valid from a day ago.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.UTC)
SAN = "release@corp.example"


@dataclass
class Issued:
    """A certificate and its private key."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def key_pem(self, path: Path) -> Path:
        """Write the private key as unencrypted PKCS#8 PEM to `path`."""
        path.write_bytes(
            self.key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str, issuer: Issued | None = None) -> Issued:
    """A self-signed root CA, or an intermediate CA issued by `issuer`."""
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer.cert.subject if issuer else _name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(ski, critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False
        )
    return Issued(key, builder.sign(issuer.key if issuer else key, hashes.SHA256()))


def make_leaf(
    issuer: Issued,
    *,
    san: str = SAN,
    eku: tuple[x509.ObjectIdentifier, ...] = (ExtendedKeyUsageOID.CODE_SIGNING,),
    not_after: datetime.datetime | None = None,
    not_before: datetime.datetime | None = None,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> Issued:
    """A code-signing leaf (P-256, a new key unless `key`) naming `san` (a URI when it holds `://`, else an
    email)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    general: x509.GeneralName = x509.UniformResourceIdentifier(san) if "://" in san else x509.RFC822Name(san)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("release signer"))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or NOW - datetime.timedelta(days=1))
        .not_valid_after(not_after or NOW + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName([general]), critical=False)
        .add_extension(x509.ExtendedKeyUsage(list(eku)), critical=False)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False
        )
        .sign(issuer.key, hashes.SHA256())
    )
    return Issued(key, cert)


def write_pem(path: Path, *certs: x509.Certificate) -> Path:
    """Write `certs` as concatenated PEM to `path`."""
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return path


def with_certificate_chain(bundle_json: bytes, *certs: x509.Certificate) -> bytes:
    """A bundle whose verification material is `certs` (leaf first) as model_signing's certificate method
    writes it (`x509CertificateChain`), instead of a public-key hint; the signature is left as it is."""
    doc = json.loads(bundle_json)
    doc["verificationMaterial"] = {
        "x509CertificateChain": {
            "certificates": [
                {"rawBytes": base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode()}
                for c in certs
            ]
        },
        "tlogEntries": [],
    }
    return json.dumps(doc).encode()


def corp_policy_doc(
    root: str | Path,
    identity: dict[str, str] | None = None,
    *,
    roles: Sequence[str] = (),
    tsa_roots: Sequence[Path] = (),
) -> dict[str, Any]:
    """A ModelPolicy document: policy `corp` over every `file://` model, whose authority `corp-ca` trusts the
    root certificate file `root` for `identity` (default: the SAN `SAN`), for `roles` (default: any), and
    the TSAs `tsa0`, `tsa1`, ... whose root certificate files are `tsa_roots`."""
    authority: dict[str, Any] = {
        "name": "corp-ca",
        "x509": {"roots": [str(root)], "identities": [identity or {"san": SAN}]},
    }
    if roles:
        authority["roles"] = list(roles)
    policy: dict[str, Any] = {"name": "corp", "match": ["file:///**"], "authorities": [authority]}
    if tsa_roots:
        policy["timestampAuthorities"] = [
            {"name": f"tsa{i}", "certChain": [str(r)]} for i, r in enumerate(tsa_roots)
        ]
    return {"apiVersion": "modelsec.dev/v1alpha1", "kind": "ModelPolicy", "policies": [policy]}
