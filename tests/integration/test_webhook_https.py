"""The admission webhook over real TLS: a throwaway CA, a client that checks the certificate like
kube-apiserver, the ADM01/ADM02 corpus cases, a really signed model, certificate rotation, metrics."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import ipaddress
import json
import logging
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modelsec.policy import PolicySet
from modelsec.webhook.review import DirectoryStore, Reviewer, WebhookConfig
from modelsec.webhook.server import AUDIT_LOGGER, CertificateReloader, build_server
from tests.conftest import CORPUS
from tests.support.stores import signed_model_store

pytestmark = pytest.mark.integration

ADM01 = CORPUS / "ADM01-no-policy-match-default-deny"
ADM02 = CORPUS / "ADM02-fail-closed-and-uid"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@dataclass
class CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls) -> CA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("modelsec-test-ca"))
            .issuer_name(_name("modelsec-test-ca"))
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
        return cls(key, cert)

    def client_context(self) -> ssl.SSLContext:
        """A client TLS context trusting only this CA (as kube-apiserver trusts the caBundle)."""
        return ssl.create_default_context(cadata=self.cert.public_bytes(serialization.Encoding.PEM).decode())

    def issue(self, cert_path: Path, key_path: Path) -> int:
        """A serving certificate for the Service DNS name and 127.0.0.1; returns its serial."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("modelsec-webhook.modelsec-system.svc"))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("modelsec-webhook.modelsec-system.svc"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return serial


@dataclass
class Webhook:
    port: int
    client_context: ssl.SSLContext
    store: Path
    certificates: CertificateReloader
    cert: Path
    key: Path
    ca: CA
    digest: str

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, int]:
        """(HTTP status, body, serial of the server certificate seen)."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.client_context, timeout=10)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
            serial = x509.load_der_x509_certificate(der).serial_number
            return response.status, response.read(), serial
        finally:
            conn.close()

    def review(self, body: bytes) -> tuple[int, dict[str, Any]]:
        status, data, _ = self.request("POST", "/validate", body)
        return status, json.loads(data) if status == 200 else {"raw": data.decode(errors="replace")}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    root = tmp_path_factory.mktemp("webhook-https")
    ca = CA.create()
    cert, key = root / "tls.crt", root / "tls.key"
    ca.issue(cert, key)
    # A tiny model signed with the corpus' trusted (test-only) key, its bundle filed in the store.
    digest, store = signed_model_store(root, ADM01 / "trust" / "trusted-p256.TESTONLY.key.pem")
    policies = PolicySet.from_file(ADM01 / "policy.json")
    assert PolicySet.from_file(ADM02 / "policy.json").policies[0].name == policies.policies[0].name
    reviewer = Reviewer(policies, DirectoryStore(store), WebhookConfig(deadline_seconds=8))
    with running(reviewer, cert, key) as (port, certificates):
        # Like kube-apiserver: trust only the caBundle, check the name the Service is reached by.
        client = ca.client_context()
        yield Webhook(port, client, store, certificates, cert, key, ca, digest)


@contextlib.contextmanager
def running(
    reviewer: Reviewer, cert: Path, key: Path, **options: Any
) -> Iterator[tuple[int, CertificateReloader]]:
    """The real uvicorn server on 127.0.0.1, an ephemeral port, in a background thread.

    `options` go to `build_server` (e.g. `limits`).
    """
    server, certificates = build_server(reviewer, cert, key, reload_interval=3600, **options)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("webhook server did not start")
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1], certificates
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.mark.parametrize(
    "name",
    [
        "unmatched_registry.json",
        "unmatched_scheme.json",
        "one_of_two_unmatched.json",
        "control_no_model.json",
    ],
)
def test_adm01_corpus(name: str, webhook: Webhook) -> None:
    expected = json.loads((ADM01 / "expected.json").read_text())
    raw = (ADM01 / "requests" / name).read_bytes()
    status, out = webhook.review(raw)
    assert status == 200
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == json.loads(raw)["request"]["uid"]
    models = json.loads(raw)["request"]["object"]["metadata"]["annotations"].get("modelsec.dev/models", "")
    if name in expected["applies_to"]:
        assert out["response"]["allowed"] is False
        message = out["response"]["status"]["message"]
        unmatched = [m for m in models.split(",") if "registry.internal/models/" not in m]
        assert all(m.strip() in message for m in unmatched) and "no policy" in message
    else:
        assert expected["control"] == f"{name} allowed"
        assert out["response"]["allowed"] is True


@pytest.mark.parametrize(
    "name",
    ["backend_unavailable.json", "dry_run.json", "malformed_ref.json", "missing_object.json", "v1beta1.json"],
)
def test_adm02_corpus_denies_with_uid(name: str, webhook: Webhook) -> None:
    raw = (ADM02 / "requests" / name).read_bytes()
    request = json.loads(raw)
    if name == "backend_unavailable.json":
        # Make the store unreachable: its directory is replaced by a plain file for this request.
        moved = webhook.store.with_name("store.moved")
        webhook.store.rename(moved)
        webhook.store.write_text("the store is down")
        try:
            status, out = webhook.review(raw)
        finally:
            webhook.store.unlink()
            moved.rename(webhook.store)
        assert "attestation store" in out["response"]["status"]["message"]
    else:
        status, out = webhook.review(raw)
    assert status == 200
    assert out["apiVersion"] == request["apiVersion"]  # a v1beta1 review gets a v1beta1-shaped deny
    assert out["response"]["uid"] == request["request"]["uid"]
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["code"] == 403
    models = (request["request"].get("object") or {}).get("metadata", {}).get("annotations", {})
    if name not in ("missing_object.json", "v1beta1.json"):
        assert models["modelsec.dev/models"] in out["response"]["status"]["message"]


def test_adm02_not_json_is_http_400(webhook: Webhook) -> None:
    status, out = webhook.review((ADM02 / "requests" / "not_json.txt").read_bytes())
    assert status == 400
    assert '"allowed"' not in out["raw"]


def test_signed_model_is_allowed_and_logged(webhook: Webhook, caplog: pytest.LogCaptureFixture) -> None:
    body = json.loads((ADM01 / "requests" / "unmatched_registry.json").read_text())
    ref = f"oci://registry.internal/models/x@sha256:{webhook.digest}"
    body["request"]["uid"] = "uid-signed"
    body["request"]["object"]["metadata"]["annotations"]["modelsec.dev/models"] = ref
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        status, out = webhook.review(json.dumps(body).encode())
        time.sleep(0.05)
    assert status == 200
    assert out["response"] == {
        "uid": "uid-signed",
        "allowed": True,
        "auditAnnotations": {"decision": "allow", "reason": "verified", "mode": "enforce"},
    }
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]
    line = next(x for x in lines if x.get("uid") == "uid-signed")
    assert line["verdict"] == "allow" and line["references"][0]["reference"] == ref
    assert line["namespace"] == "ml-serving" and line["latencyMs"] >= 0


def test_probes_and_metrics(webhook: Webhook) -> None:
    assert webhook.request("GET", "/healthz")[0] == 200
    assert webhook.request("GET", "/readyz")[0] == 200
    webhook.review((ADM01 / "requests" / "unmatched_registry.json").read_bytes())
    status, text, _ = webhook.request("GET", "/metrics")
    assert status == 200
    metrics = text.decode()
    assert 'modelsec_webhook_decisions_total{outcome="deny",reason="no-policy"}' in metrics
    assert "modelsec_webhook_decision_seconds_bucket" in metrics
    assert webhook.request("GET", "/validate")[0] == 405


def test_plain_http_and_untrusted_ca_are_refused(webhook: Webhook) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=5)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()
    other = ssl.create_default_context(
        cadata=CA.create().cert.public_bytes(serialization.Encoding.PEM).decode()
    )
    conn = http.client.HTTPSConnection("127.0.0.1", webhook.port, context=other, timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/healthz")
    conn.close()


def test_certificate_is_reloaded_when_it_changes_on_disk(webhook: Webhook, tmp_path: Path) -> None:
    _, _, before = webhook.request("GET", "/healthz")
    # A broken pair is refused and the served certificate stays.
    saved = tmp_path / "saved.crt"
    shutil.copy(webhook.cert, saved)
    webhook.cert.write_text("garbage")
    with pytest.raises(Exception, match="serving certificate"):
        webhook.certificates.maybe_reload()
    assert webhook.request("GET", "/healthz")[2] == before
    # A rotated pair is served to new connections.
    new_serial = webhook.ca.issue(webhook.cert, webhook.key)
    assert webhook.certificates.maybe_reload() is True
    status, _, after = webhook.request("GET", "/healthz")
    assert status == 200 and after == new_serial != before
    assert webhook.certificates.maybe_reload() is False


def test_cli_serve_refuses_bad_tls_material(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from modelsec.cli.webhook import webhook

    (tmp_path / "store").mkdir()
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    args = ["serve", "--policy", str(ADM01 / "policy.json"), "--store", str(tmp_path / "store")]
    args += ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"), "--port", "0"]
    result = CliRunner().invoke(webhook, args)
    assert result.exit_code == 1
    assert "cannot load the serving certificate" in result.output
    result = CliRunner().invoke(webhook, [*args, "--mode", "permissive"])
    assert result.exit_code == 2


def test_server_denies_at_the_deadline_and_reports_store_outage(webhook: Webhook, tmp_path: Path) -> None:
    class SlowStore:
        def revision(self, digest: str) -> None:
            return None

        def entries(self, digest: str) -> list[bytes]:
            time.sleep(2.0)
            return []

    policies = PolicySet.from_file(ADM01 / "policy.json")
    slow = Reviewer(policies, SlowStore(), WebhookConfig(deadline_seconds=0.2))
    raw = (ADM02 / "requests" / "dry_run.json").read_bytes()
    with running(slow, webhook.cert, webhook.key) as (port, _):
        other = Webhook(
            port,
            webhook.client_context,
            webhook.store,
            webhook.certificates,
            webhook.cert,
            webhook.key,
            webhook.ca,
            webhook.digest,
        )
        started = time.monotonic()
        status, out = other.review(raw)
        assert time.monotonic() - started < 1.5
        assert status == 200 and out["response"]["uid"] == "uid-adm02-d"
        assert out["response"]["allowed"] is False and "deadline" in out["response"]["status"]["message"]
    missing = Reviewer(policies, DirectoryStore(tmp_path / "no-store"), WebhookConfig())
    with running(missing, webhook.cert, webhook.key) as (port, _):
        other = Webhook(
            port,
            webhook.client_context,
            webhook.store,
            webhook.certificates,
            webhook.cert,
            webhook.key,
            webhook.ca,
            webhook.digest,
        )
        assert other.request("GET", "/readyz")[0] == 503
        assert other.request("GET", "/healthz")[0] == 200


def _configmap_update(mount: Path, files: dict[str, bytes], generation: int) -> None:
    """What the kubelet does on a ConfigMap update: a new `..<n>` directory, then one `..data` link swap."""
    target = mount / f"..{generation}"
    target.mkdir()
    for name, data in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)
    tmp_link = mount / "..data_tmp"
    tmp_link.symlink_to(target.name)
    tmp_link.replace(mount / "..data")
    for name in files:
        top = mount / name.split("/")[0]
        if not top.is_symlink():
            top.symlink_to(f"..data/{name.split('/')[0]}")


def test_policy_configmap_update_is_picked_up_without_restart(webhook: Webhook, tmp_path: Path) -> None:
    """A policy change is loaded by the running server; an invalid update keeps the previous policy."""
    key = (ADM01 / "trust" / "trusted-p256.pub.pem").read_bytes()
    policy = json.loads((ADM01 / "policy.json").read_text())
    mount = tmp_path / "policy"
    mount.mkdir()
    _configmap_update(
        mount, {"policy.json": json.dumps(policy).encode(), "trust/trusted-p256.pub.pem": key}, 1
    )
    policies = PolicySet.from_file(mount / "policy.json")
    reviewer = Reviewer(policies, DirectoryStore(webhook.store), WebhookConfig(deadline_seconds=8))
    server, _ = build_server(
        reviewer, webhook.cert, webhook.key, reload_interval=0.05, policy_file=mount / "policy.json"
    )
    body = json.loads((ADM01 / "requests" / "unmatched_registry.json").read_text())
    ref = f"oci://mirror.internal/models/x@sha256:{webhook.digest}"
    body["request"]["object"]["metadata"]["annotations"]["modelsec.dev/models"] = ref
    raw = json.dumps(body).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        client = Webhook(sock.getsockname()[1], webhook.client_context, *dataclass_rest(webhook))

        def allowed_within(seconds: float) -> bool:
            end = time.monotonic() + seconds
            while True:
                status, out = client.review(raw)
                assert status == 200
                if out["response"]["allowed"] or time.monotonic() > end:
                    return bool(out["response"]["allowed"])
                time.sleep(0.05)

        assert allowed_within(0) is False  # the mirror is not covered yet
        policy["policies"][0]["match"].append("oci://mirror.internal/models/**")
        _configmap_update(
            mount, {"policy.json": json.dumps(policy).encode(), "trust/trusted-p256.pub.pem": key}, 2
        )
        assert allowed_within(10) is True
        # A broken update is refused and logged; the policy in use stays the last good one.
        _configmap_update(mount, {"policy.json": b"{not json", "trust/trusted-p256.pub.pem": key}, 3)
        time.sleep(0.3)
        assert client.review(raw)[1]["response"]["allowed"] is True
        # Withdrawing the key (same policy bytes) is a new generation: no cached allow survives it.
        untrusted = (
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        _configmap_update(
            mount, {"policy.json": json.dumps(policy).encode(), "trust/trusted-p256.pub.pem": untrusted}, 4
        )
        end = time.monotonic() + 10
        while client.review(raw)[1]["response"]["allowed"] and time.monotonic() < end:
            time.sleep(0.05)
        assert client.review(raw)[1]["response"]["allowed"] is False
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def dataclass_rest(webhook: Webhook) -> tuple[Any, ...]:
    return (webhook.store, webhook.certificates, webhook.cert, webhook.key, webhook.ca, webhook.digest)
