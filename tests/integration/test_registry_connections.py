"""The webhook's registry reads reuse one client per registry and credentials, and send nothing elsewhere.

Against the real registry (Debian `docker-registry` 2.8, TLS; htpasswd, and Docker token authentication
with JWTs): uncached admission decisions of a pushed model image open no new TLS connection once the
shared client has its (two: the model's root tag is read beside the referrers listing), answer no further
authentication challenge (nor ask for another token), list the manifest's referrers once per decision for
the binding and the bundles together, and read the root tag where it points at each decision. A blob that
the registry redirects to another host (its storage) is read without the registry's credentials. A client
never sends its registry's credentials to another host, and clients for other credentials (or another
registry) share no authentication state. Connections are counted from urllib3's
own log: every new TCP+TLS connection is logged as it is opened.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from modelsec.distribution.push_pull import bound_root_digests, push_model
from modelsec.errors import BackendUnavailableError
from modelsec.policy import Policy, PolicySet
from modelsec.registry.client import RegistryOptions, canonical_json, shared_client
from modelsec.signer import load_private_key_file, sign_model
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry, registry_missing_reason, run_registry
from tests.unit.webhook.test_review import review_body

pytestmark = pytest.mark.integration

_NEW_CONNECTION = re.compile(r"^(Starting new HTTPS? connection|Resetting dropped connection)")
_REQUEST = re.compile(r'^https?://\S+ "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d+)')


def _options(registry: Registry, password: str = PASSWORD) -> RegistryOptions:
    return RegistryOptions(ca_file=registry.ca, username=USER, password=password, timeout=5)


def _traffic(caplog: pytest.LogCaptureFixture, address: str = "") -> tuple[int, list[tuple[str, str, int]]]:
    """New connections (to `address` only, if given), and (method, path, status) of every request, from
    urllib3's debug log."""
    messages = [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"]
    requests = [
        (m["method"], m["path"], int(m["status"])) for m in map(_REQUEST.match, messages) if m is not None
    ]
    opened = [m for m in messages if _NEW_CONNECTION.match(m)]
    host = address.rpartition(":")[0]
    return sum(m.endswith((address, f"connection: {host}")) for m in opened) if address else len(
        opened
    ), requests


@pytest.fixture(params=["htpasswd", "token"])
def any_auth_registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Registry]:
    """The session's htpasswd registry, and one with Docker token authentication (JWTs, as public registries).

    The token one is started here: the session registry is htpasswd's, and a registry has one auth mode.
    """
    if request.param == "htpasswd":
        yield request.getfixturevalue("registry")
        return
    if registry_missing_reason():
        pytest.skip(registry_missing_reason() or "")
    with run_registry(tmp_path_factory.mktemp("token-registry"), token_auth=True) as registry:
        yield registry


def _uncached_reviewer(
    tmp_path: Path, key_dir: Path, registry: Registry, repository: str
) -> tuple[Reviewer, bytes, Any]:
    """A model pushed to `repository`, a reviewer with every cache off, a Pod naming the image by digest."""
    model = write_tiny_model(tmp_path / "model", shards=1)
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    sign_model(model, [signer])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    options = _options(registry)
    pushed = push_model(model, f"oci://{registry.address}/{repository}:v1", policy, signer, options=options)
    entry = {
        "name": "models",
        "match": [f"oci://{registry.address}/models/**"],
        "keys": ["ecdsa-p256.pub.pem"],
    }
    doc = {"apiVersion": "modelsec.dev/v1alpha1", "kind": "ModelPolicy", "policies": [entry]}
    policies = PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy")
    reviewer = Reviewer(  # as `modelsec webhook serve` builds it, with every cache off
        policies,
        None,
        WebhookConfig(cache_ttl_seconds=0, evidence_ttl_seconds=0, evidence_negative_ttl_seconds=0),
        bindings=lambda reference, policy: bound_root_digests(reference, policy, options=options),
        registry=options,
    )
    body = copy.deepcopy(review_body("Pod"))
    body["request"]["object"]["spec"]["containers"][0]["image"] = (
        f"{registry.address}/{repository}@{pushed.manifest_digest}"
    )
    return reviewer, json.dumps(body).encode(), pushed


def test_uncached_decisions_reuse_one_connection_and_list_referrers_once(
    tmp_path: Path, key_dir: Path, any_auth_registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    registry = any_auth_registry
    reviewer, review, pushed = _uncached_reviewer(tmp_path, key_dir, registry, "models/pooled")
    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    assert reviewer.review(review).allowed  # the first decision may connect and answer a challenge
    opened, _ = _traffic(caplog, registry.address)
    caplog.clear()
    decisions = 5
    for _ in range(decisions):
        decision = reviewer.review(review)
        assert decision.allowed and decision.reason == "verified", decision.messages
    connections, requests = _traffic(caplog, registry.address)
    listings = [r for r in requests if f"/manifests/{pushed.manifest_digest.replace(':', '-')}" in r[1]]
    # The kept-alive connections serve every decision: the first may connect twice (requests does not keep
    # the connection that answered a token challenge), and the later ones open one more at most, as a decision
    # has two requests in flight (the model's root tag is read beside the referrers listing).
    assert opened <= 2 and connections <= 1, (opened, connections, requests)
    assert not [r for r in requests if r[2] == 401], requests  # the credentials answered stay answered
    assert not [r for r in requests if r[1].startswith("/token")], requests  # a token is kept, not renewed
    # The binding and the bundles are read from one listing (the tag-schema fallback index) per decision,
    # and the model's root tag once per decision (read beside the listing, from the second decision on).
    assert len(listings) == decisions, requests
    root_tags = [r for r in requests if r[1].endswith(f"/manifests/oms-sha256-{pushed.root_digest}")]
    assert len(root_tags) == decisions, requests


def test_each_uncached_decision_reads_where_the_root_tag_points_now(
    tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    # The root tag is read beside the referrers listing, guessed from the previous decision: a guess of
    # what to read, never an answer. A tag moved between two decisions is seen by the second one.
    reviewer, review, pushed = _uncached_reviewer(tmp_path, key_dir, registry, "models/moving")
    client = shared_client(registry.address, _options(registry))
    tag = f"oms-sha256-{pushed.root_digest}"
    data, media_type, _ = client.get_manifest("models/moving", pushed.manifest_digest)
    moved = json.loads(data)
    moved["annotations"] = {**moved.get("annotations", {}), "org.example.moved": "1"}  # no evidence attached
    for _ in range(2):
        assert reviewer.review(review).allowed
    client.put_manifest("models/moving", tag, canonical_json(moved), media_type)
    decision = reviewer.review(review)
    assert not decision.allowed and decision.reason == "attestation", decision.messages
    assert "missing signature" in decision.messages[0]  # the moved tag's manifest holds no evidence
    client.put_manifest("models/moving", tag, data, media_type)
    assert reviewer.review(review).allowed


class _Recorder(ThreadingHTTPServer):
    """A plain-HTTP 'registry' that records each request's Authorization header and asks for Basic."""

    def __init__(self, credentials: str) -> None:
        super().__init__(("127.0.0.1", 0), _RecorderHandler)
        self.credentials = credentials
        self.seen: list[str | None] = []


class _RecorderHandler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        sent = self.headers.get("Authorization")
        self.server.seen.append(sent)
        ok = sent == f"Basic {self.server.credentials}"
        self.send_response(200 if ok else 401)
        if not ok:
            self.send_header("WWW-Authenticate", 'Basic realm="recorder"')
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder(base64.b64encode(b"other:other-password").decode())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_credentials_never_reach_another_registry_or_another_key(
    registry: Registry, recorder: _Recorder
) -> None:
    mine = shared_client(registry.address, _options(registry))
    mine.check()  # authenticated: the client now answers its registry with Basic credentials
    assert shared_client(registry.address, _options(registry)) is mine  # one client per registry+credentials

    # Another registry, with its own credentials, gets its own client and only its own credentials.
    address = f"127.0.0.1:{recorder.server_address[1]}"
    theirs = RegistryOptions(plain_http=True, username="other", password="other-password", timeout=5)
    other = shared_client(address, theirs)
    assert other is not mine
    for _ in range(2):
        other.check()
        mine.check()
    # An absolute URL on another host (an upload Location, say) gets no Authorization from this client.
    with pytest.raises(BackendUnavailableError, match="access denied"):  # and no challenge is answered
        mine.request("GET", f"http://{address}/v2/")
    mine_basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert f"Basic {mine_basic}" not in recorder.seen
    assert set(recorder.seen) <= {None, f"Basic {recorder.credentials}"}
    assert recorder.seen[-1] is None  # what `mine` sent there

    # Other credentials for the same registry share no authentication state with the accepted ones.
    wrong = shared_client(registry.address, _options(registry, password="wrong-password"))
    assert wrong is not mine
    with pytest.raises(BackendUnavailableError, match="access denied"):
        wrong.check()
    mine.check()


class _Storage(ThreadingHTTPServer):
    """Blob storage on another host (as S3 or GCS behind a registry): records what each request carried."""

    def __init__(self, blob: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _StorageHandler)
        self.blob = blob
        self.seen: list[str | None] = []


class _StorageHandler(BaseHTTPRequestHandler):
    server: _Storage

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.blob)))
        self.end_headers()
        self.wfile.write(self.server.blob)


class _Redirecting(ThreadingHTTPServer):
    """A plain-HTTP registry that asks for Basic credentials and redirects blob reads to `storage`."""

    def __init__(self, credentials: str, storage: str) -> None:
        super().__init__(("127.0.0.1", 0), _RedirectingHandler)
        self.credentials, self.storage = credentials, storage


class _RedirectingHandler(BaseHTTPRequestHandler):
    server: _Redirecting

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Basic {self.server.credentials}":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="redirecting"')
        else:
            self.send_response(307)
            self.send_header("Location", f"{self.server.storage}/blob?signature=storage-own-credential")
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_blob_redirected_to_another_host_is_read_without_the_credentials() -> None:
    blob = b'{"a bundle": "redirected to the storage backend"}'
    storage = _Storage(blob)
    credentials = base64.b64encode(b"user:registry-password").decode()
    registry = _Redirecting(credentials, f"http://127.0.0.1:{storage.server_address[1]}")
    servers = [storage, registry]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        client = shared_client(
            f"127.0.0.1:{registry.server_address[1]}",
            RegistryOptions(plain_http=True, username="user", password="registry-password", timeout=5),
        )
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        assert client.get_blob("models/m", digest, 2**20, what="blob") == blob  # followed, then checked
        assert storage.seen == [None]  # the registry's credentials never reached the other host
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_parallel_layer_uploads_answer_each_scope_of_a_token_registry(
    tmp_path: Path, key_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Four layers pushed at once to a token-auth registry: one thread's token for `pull` (its HEAD of a blob)
    must not stand for another's upload, which the registry challenges for `pull,push`. The thread that
    meets the other's token refused asks for its own scope, once; the push and a pull back succeed."""
    from modelsec.distribution.push_pull import pull_model

    if registry_missing_reason():
        pytest.skip(registry_missing_reason() or "")
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    with run_registry(tmp_path_factory.mktemp("token-push"), token_auth=True) as registry:
        for attempt in range(3):  # each repository starts without a token: three chances for the race
            model = write_tiny_model(tmp_path / f"model-{attempt}", shards=6, seed=attempt)
            sign_model(model, [signer])
            options = RegistryOptions(
                ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5, transfers=4
            )
            ref = f"oci://{registry.address}/models/parallel-{attempt}:v1"
            pushed = push_model(model, ref, policy, signer, options=options)
            assert pushed.layers >= 6
            by_digest = f"oci://{registry.address}/models/parallel-{attempt}@{pushed.manifest_digest}"
            pulled = pull_model(by_digest, tmp_path / f"pulled-{attempt}", policy, options=options)
            assert pulled.root_digest == pushed.root_digest
