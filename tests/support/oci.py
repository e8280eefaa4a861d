"""A real CNCF distribution registry (Debian's `docker-registry`, 2.8) on 127.0.0.1 with TLS and htpasswd.

Distribution 2.8 has no referrers API and no OCI artifact manifests: image manifests with `artifactType` /
`subject` and the referrers tag-schema fallback are what it serves, as many registries in the field do.
`make test` installs the package (`apt-get install -y docker-registry`); without it the tests skip and
say so.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding

from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    EMPTY_CONFIG,
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    canonical_json,
    descriptor,
)
from tests.support.pki import TestCA

REGISTRY_BINARY = "docker-registry"
USER, PASSWORD = "ci", "s3cret-registry-password"


@dataclass
class Registry:
    """A running registry: its `host:port`, CA, credentials and storage directory."""

    address: str
    ca: Path
    storage: Path
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        return {
            "MODELSEC_OCI_USERNAME": USER,
            "MODELSEC_OCI_PASSWORD": PASSWORD,
            "MODELSEC_OCI_CA": str(self.ca),
        }

    def blob_path(self, digest: str) -> Path:
        hex_ = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hex_[:2] / hex_ / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _htpasswd(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # bcrypt through libxcrypt; the registry accepts only bcrypt entries

        hashed = crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 5))
    path.write_text(f"{USER}:{hashed}\n")


TOKEN_SERVICE, TOKEN_ISSUER = "modelsec-test-registry", "modelsec-test-token-issuer"
TOKEN_LIFETIME = 300  # seconds, as a token server's `expires_in` says it (Docker Hub's: 300)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(claims: dict[str, Any], key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> str:
    """An ES256 JWT as a Docker token server signs it: the signing certificate in `x5c`."""
    header = {
        "typ": "JWT",
        "alg": "ES256",
        "x5c": [base64.b64encode(cert.public_bytes(Encoding.DER)).decode()],
    }
    signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@contextlib.contextmanager
def _token_server(cert: Path, key: Path, signer: tuple[Path, Path]) -> Iterator[str]:
    """A Docker token server (the registry token authentication specification) on a loopback TLS port.

    `GET /token?service=…&scope=repository:NAME:ACTIONS` with the test's Basic credentials answers a JWT
    granting the requested actions for `TOKEN_LIFETIME` seconds; anything else is a 401. Yields the realm.
    """
    signing_cert = x509.load_pem_x509_certificate(signer[0].read_bytes())
    signing_key = serialization.load_pem_private_key(signer[1].read_bytes(), None)
    assert isinstance(signing_key, ec.EllipticCurvePrivateKey)
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            sent = self.headers.get("Authorization", "")
            if url.path != "/token" or not hmac.compare_digest(sent.encode(), expected.encode()):
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            access = []
            for scope in query.get("scope", []):
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
            now = int(time.time())
            claims = {
                "iss": TOKEN_ISSUER,
                "sub": USER,
                "aud": query.get("service", [""])[0],
                "exp": now + TOKEN_LIFETIME,
                "nbf": now - 10,
                "iat": now,
                "jti": secrets.token_hex(8),
                "access": access,
            }
            body = json.dumps(
                {"token": _jwt(claims, signing_key, signing_cert), "expires_in": TOKEN_LIFETIME}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/token"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def run_registry(directory: Path, *, token_auth: bool = False) -> Iterator[Registry]:
    """Start `docker-registry` on a free loopback port; yields once `/v2/` answers (401: auth required).

    Authentication is htpasswd (Basic, checked with bcrypt on every request), or with `token_auth` the
    Docker token authentication that public registries use: a token server (`_token_server`, same CA)
    grants ES256 JWTs for the test's credentials, and the registry checks each request's token.
    """
    with contextlib.ExitStack() as stack:
        binary = shutil.which(REGISTRY_BINARY) or shutil.which(REGISTRY_BINARY, path="/usr/bin")
        if binary is None:
            raise FileNotFoundError(REGISTRY_BINARY)
        ca = TestCA.create(directory / "ca")
        cert, key = ca.issue_server(directory / "ca")
        if token_auth:
            signer = ca.issue(directory / "ca", "token-signer", cn=TOKEN_ISSUER)
            realm = stack.enter_context(_token_server(cert, key, signer))
            auth = (
                f"token: {{realm: '{realm}', service: {TOKEN_SERVICE}, issuer: {TOKEN_ISSUER}, "
                f"rootcertbundle: {ca.path}}}"
            )
        else:
            _htpasswd(directory / "htpasswd")
            auth = f"htpasswd: {{realm: modelsec-test, path: {directory / 'htpasswd'}}}"
        yield stack.enter_context(_start_registry(directory, binary, ca, cert, key, auth))


@contextlib.contextmanager
def _start_registry(
    directory: Path, binary: str, ca: TestCA, cert: Path, key: Path, auth: str
) -> Iterator[Registry]:
    port = _free_port()
    storage = directory / "storage"
    config = directory / "config.yml"
    config.write_text(
        f"""version: 0.1
log: {{level: error, accesslog: {{disabled: true}}}}
storage:
  filesystem: {{rootdirectory: {storage}}}
  delete: {{enabled: true}}
http:
  addr: 127.0.0.1:{port}
  tls: {{certificate: {cert}, key: {key}}}
auth:
  {auth}
"""
    )
    log = open(directory / "registry.log", "wb")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if (
                    requests.get(f"https://127.0.0.1:{port}/v2/", verify=str(ca.path), timeout=1).status_code
                    == 401
                ):
                    break
            except requests.RequestException:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "registry did not start: " + (directory / "registry.log").read_text()[-2000:]
                )
            time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", ca.path, storage, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def registry_missing_reason() -> str | None:
    if shutil.which(REGISTRY_BINARY) or os.path.exists(f"/usr/bin/{REGISTRY_BINARY}"):
        return None
    return (
        "the CNCF distribution registry is not installed: `apt-get install -y docker-registry` "
        "(the Makefile's test set-up does it where apt-get exists)"
    )


def flood_referrers(
    client: RegistryClient, repo: str, subject: dict[str, Any], artifact_type: str, layer: bytes, count: int
) -> None:
    """Attach `count` distinct referrers of `artifact_type` (one shared layer), as a pusher does.

    The fallback index is written once (the registry checks that each listed manifest exists).
    """
    client.put_blob(repo, str(EMPTY_CONFIG["digest"]), 2, b"{}")
    layer_desc = descriptor(BUNDLE_ARTIFACT_TYPE, layer)
    client.put_blob(repo, layer_desc["digest"], len(layer), layer)
    tag = subject["digest"].replace(":", "-")
    index = json.loads(client.get_manifest(repo, tag)[0])
    for i in range(count):
        manifest = canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "artifactType": artifact_type,
                "config": EMPTY_CONFIG,
                "layers": [layer_desc],
                "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
                "annotations": {"junk": str(i)},
            }
        )
        desc = descriptor(MANIFEST_MEDIA_TYPE, manifest, artifactType=artifact_type)
        client.put_manifest(repo, desc["digest"], manifest, MANIFEST_MEDIA_TYPE)
        index["manifests"].append(desc)
    client.put_manifest(repo, tag, canonical_json(index), INDEX_MEDIA_TYPE)
