"""The distribution-API client against a small in-process fake registry that has the OCI 1.1 referrers API.

The real registry of the integration tests (distribution 2.8) lacks the API; this one has it, asks for a
Bearer token, and records every request, so that the API path and the token flow are each exercised.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import (
    BackendUnavailableError,
    DigestMismatchError,
    KeyMaterialError,
    MalformedArtifactError,
)
from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    RegistryOptions,
    canonical_json,
    descriptor,
    parse_reference,
)

SUBJECT = "sha256:" + "a" * 64
TOKEN = "fake-token"


class _Fake(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.log: list[tuple[str, str]] = []
        self.manifests: dict[str, bytes] = {}
        self.listing = {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [
                {**descriptor(MANIFEST_MEDIA_TYPE, b"x"), "artifactType": BUNDLE_ARTIFACT_TYPE},
                {**descriptor(MANIFEST_MEDIA_TYPE, b"y"), "artifactType": "application/other"},
            ],
        }
        self.blob_body = b"hello"


class _Handler(BaseHTTPRequestHandler):
    server: _Fake

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.path.startswith("/token"):
            expected = "Basic " + base64.b64encode(b"u:p").decode()
            if self.headers.get("Authorization") == expected and "scope=repository" in self.path:
                self._send(200, json.dumps({"token": TOKEN}).encode())
            else:
                self._send(401)
            return False
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
            challenge = f'Bearer realm="{realm}",service="fake",scope="repository:m:pull,push"'
            self._send(401, headers={"WWW-Authenticate": challenge})
            return False
        return True

    def do_GET(self) -> None:
        self.server.log.append(("GET", self.path))
        if not self._authorized():
            return
        if self.path == "/v2/":
            self._send(200)
        elif self.path.startswith("/v2/m/referrers/"):
            self._send(200, canonical_json(self.server.listing), {"Content-Type": INDEX_MEDIA_TYPE})
        elif self.path.startswith("/v2/m/blobs/"):
            self._send(200, self.server.blob_body)
        else:
            self._send(404)

    def do_PUT(self) -> None:
        self.server.log.append(("PUT", self.path))
        if not self._authorized():
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.manifests[self.path] = body
        self._send(201, headers={"OCI-Subject": SUBJECT} if b'"subject"' in body else {})


@pytest.fixture
def fake() -> Iterator[_Fake]:
    server = _Fake()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(fake: _Fake) -> RegistryClient:
    options = RegistryOptions(plain_http=True, username="u", password="p", timeout=5)
    return RegistryClient(f"127.0.0.1:{fake.server_address[1]}", options)


def test_referrers_api_is_used_when_the_registry_has_it(fake: _Fake) -> None:
    client = _client(fake)
    listed = client.referrers("m", SUBJECT, BUNDLE_ARTIFACT_TYPE)
    assert [d["artifactType"] for d in listed] == [BUNDLE_ARTIFACT_TYPE]
    assert len(client.referrers("m", SUBJECT)) == 2
    assert not [p for _, p in fake.log if "/manifests/sha256-" in p]  # the fallback tag is never read
    assert ("GET", "/token?service=fake&scope=repository%3Am%3Apull%2Cpush") in fake.log  # Bearer flow


def test_a_bearer_token_is_kept_until_it_expires(fake: _Fake) -> None:
    """One token serves every request within its lifetime (60 s when the token server does not say, as the
    Docker token specification defines); an expired one is never sent, and a fresh one is fetched."""
    now = [1000.0]
    options = RegistryOptions(plain_http=True, username="u", password="p", timeout=5)
    client = RegistryClient(f"127.0.0.1:{fake.server_address[1]}", options, clock=lambda: now[0])
    for _ in range(3):
        assert len(client.referrers("m", SUBJECT)) == 2
    tokens = [p for _, p in fake.log if p.startswith("/token")]
    assert len(tokens) == 1
    assert len([p for _, p in fake.log if p.startswith("/v2/m/referrers/")]) == 4  # one challenge only
    now[0] += 61
    client.referrers("m", SUBJECT)
    assert len([p for _, p in fake.log if p.startswith("/token")]) == 2


def test_push_referrer_skips_the_fallback_tag_when_the_registry_indexes_subjects(fake: _Fake) -> None:
    body = canonical_json({"schemaVersion": 2, "subject": {"digest": SUBJECT}, "layers": []})
    desc = descriptor(MANIFEST_MEDIA_TYPE, body)
    _client(fake).push_referrer("m", body, desc, SUBJECT)
    assert list(fake.manifests) == [f"/v2/m/manifests/{desc['digest']}"]


def test_blob_is_refused_unless_it_has_its_digest_and_size(fake: _Fake) -> None:
    client = _client(fake)
    good = "sha256:" + hashlib.sha256(b"hello").hexdigest()
    assert client.get_blob("m", good, 100, what="b") == b"hello"
    with pytest.raises(DigestMismatchError):
        client.get_blob("m", "sha256:" + "b" * 64, 100, what="b")
    with pytest.raises(MalformedArtifactError, match="larger"):
        client.get_blob("m", good, 3, what="b")
    sink = bytearray()

    class _Sink:
        def write(self, b: bytes) -> None:
            sink.extend(b)

    with pytest.raises(MalformedArtifactError, match="4 bytes"):
        client.stream_blob("m", good, 4, _Sink(), what="b")  # type: ignore[arg-type]


def test_wrong_credentials_are_an_outage_not_a_verdict(fake: _Fake) -> None:
    options = RegistryOptions(plain_http=True, username="u", password="wrong", timeout=5)
    with pytest.raises(BackendUnavailableError, match="access denied"):
        RegistryClient(f"127.0.0.1:{fake.server_address[1]}", options).check()


def test_docker_config_credentials_and_what_is_refused(fake: _Fake, tmp_path: Path) -> None:
    """`auths.<registry>.auth` of the Docker config is used without a username; a config that is not a
    regular file is refused by kind (a FIFO used to block the client forever), a missing one is anonymous."""
    registry = f"127.0.0.1:{fake.server_address[1]}"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {registry: {"auth": base64.b64encode(b"u:p").decode()}}}))
    options = RegistryOptions(plain_http=True, docker_config=config, timeout=5)
    assert len(RegistryClient(registry, options).referrers("m", SUBJECT)) == 2  # the token flow took u:p
    missing = RegistryOptions(plain_http=True, docker_config=tmp_path / "none.json", timeout=5)
    with pytest.raises(BackendUnavailableError):
        RegistryClient(registry, missing).referrers("m", SUBJECT)  # anonymous: the token is refused
    os.mkfifo(tmp_path / "fifo.json")
    fifo = RegistryOptions(plain_http=True, docker_config=tmp_path / "fifo.json", timeout=5)
    with pytest.raises(KeyMaterialError, match=r"fifo.json: the Docker config file is not a regular file"):
        RegistryClient(registry, fifo)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("oci://registry.example/models/llama:v1", ("registry.example", "models/llama", "v1", None)),
        ("oci://localhost:5000/a@sha256:" + "0" * 64, ("localhost:5000", "a", None, "sha256:" + "0" * 64)),
        ("127.0.0.1:5000/a/b-c:t@sha256:" + "1" * 64, ("127.0.0.1:5000", "a/b-c", "t", "sha256:" + "1" * 64)),
        # No registry (no dot, port or localhost): Docker Hub, as a container runtime reads the name.
        ("oci://docker/models/x", ("docker.io", "docker/models/x", None, None)),
    ],
)
def test_reference_parsing(uri: str, expected: tuple[Any, ...]) -> None:
    ref = parse_reference(uri)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == expected


@pytest.mark.parametrize(
    "uri",
    [
        "oci://registry.example/Models/x",
        "oci://registry.example/models/../x",
        "oci://registry.example/x@sha256:short",
        "oci://registry.example/x:" + "t" * 200,
        "oci://registry.example/x\n",
    ],
)
def test_bad_references_are_refused(uri: str) -> None:
    with pytest.raises(MalformedArtifactError):
        parse_reference(uri)
