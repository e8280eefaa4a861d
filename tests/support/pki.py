"""Throwaway PKI for tests, made with `cryptography` at test time (nothing is checked in).

- Code signing (certificate-trust tests): root and intermediate CAs and code-signing leaves, valid from a
  day ago.
- TLS (`TestCA`): a CA issuing serving and client certificates, valid for one hour.
- `Pki`: one of each, made once per session by the `pki` fixture (tests.support.fixtures).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
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


# KeyUsage(digital_signature, content_commitment, key_encipherment, data_encipherment, key_agreement,
# key_cert_sign, crl_sign, encipher_only, decipher_only)
DIGITAL_SIGNATURE = x509.KeyUsage(True, False, False, False, False, False, False, False, False)
KEY_USAGE_NONE = x509.KeyUsage(False, False, False, False, False, False, False, False, False)


def make_leaf(
    issuer: Issued,
    *,
    san: str = SAN,
    eku: tuple[x509.ObjectIdentifier, ...] = (ExtendedKeyUsageOID.CODE_SIGNING,),
    not_after: datetime.datetime | None = None,
    not_before: datetime.datetime | None = None,
    key: ec.EllipticCurvePrivateKey | None = None,
    ca: bool = False,
    key_usage: x509.KeyUsage | None = None,
) -> Issued:
    """A code-signing leaf (P-256, a new key unless `key`) naming `san` (a URI when it holds `://`, else an
    email); `ca` adds basicConstraints `CA:TRUE` (as model_signing's own test leaves have), `key_usage`
    replaces digitalSignature alone (`KEY_USAGE_NONE`: no keyUsage extension)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    general: x509.GeneralName = x509.UniformResourceIdentifier(san) if "://" in san else x509.RFC822Name(san)
    builder = (
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
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False
        )
    )
    if key_usage is not KEY_USAGE_NONE:
        builder = builder.add_extension(key_usage or DIGITAL_SIGNATURE, critical=True)
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return Issued(key, builder.sign(issuer.key, hashes.SHA256()))


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


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class TestCA:
    """A throwaway certificate authority (P-256), valid for one hour."""

    __test__ = False  # not a pytest test class

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path

    @classmethod
    def create(cls, directory: Path, name: str = "modelsec-test-ca") -> TestCA:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(key, hashes.SHA256())
        )
        path = directory / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(key, cert, path)

    def issue(
        self,
        directory: Path,
        stem: str,
        *,
        cn: str,
        dns: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        """Issue a leaf certificate; returns (cert path, key path)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.UniformResourceIdentifier(u) for u in uris]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        return cert_path, key_path

    def issue_server(self, directory: Path, stem: str = "server") -> tuple[Path, Path]:
        """A serving certificate for `localhost` and 127.0.0.1."""
        return self.issue(
            directory, stem, cn="localhost", dns=("localhost",), ips=("127.0.0.1",), server=True
        )


@dataclass(frozen=True)
class Pki:
    """The session's PKI. Read-only: a test that needs another hierarchy makes its own.

    `root` and `intermediate` are code-signing CAs ("corp root", "corp signing intermediate"); `leaf` is a
    code-signing leaf of `intermediate` naming `SAN`. `tls` holds PEM files of a `TestCA`: `ca`, `server` (for
    localhost and 127.0.0.1), client certificates `ci` (URI SAN spiffe://example.org/ci/signer) and `dev`
    (CN developer-laptop), and `rogue`, a client certificate like `ci` from another CA; each `X` has `X_key`.
    """

    root: Issued
    intermediate: Issued
    leaf: Issued
    tls: dict[str, Path]


def make_pki(directory: Path) -> Pki:
    """Make a `Pki`, writing its TLS files under `directory`."""
    root = make_ca("corp root")
    intermediate = make_ca("corp signing intermediate", root)
    ca = TestCA.create(directory / "ca")
    rogue = TestCA.create(directory / "rogue", name="rogue-ca")
    tls = {"ca": ca.path}
    tls["server"], tls["server_key"] = ca.issue_server(directory)
    tls["ci"], tls["ci_key"] = ca.issue(directory, "ci", cn="ci", uris=("spiffe://example.org/ci/signer",))
    tls["dev"], tls["dev_key"] = ca.issue(directory, "dev", cn="developer-laptop")
    tls["rogue"], tls["rogue_key"] = rogue.issue(
        directory, "rogue", cn="ci", uris=("spiffe://example.org/ci/signer",)
    )
    return Pki(root, intermediate, make_leaf(intermediate), tls)
