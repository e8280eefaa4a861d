"""RFC 3161 timestamps against a real TSA: `openssl ts -reply` behind a loopback HTTP server started here.

The TSA configuration has no `certs=` (rfc3161-client refuses responses that carry extra certificates).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import rfc3161_client
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modelsec.attestations.bundle import add_timestamps, parse_bundle
from modelsec.errors import MalformedArtifactError, PolicyError, SignatureError
from modelsec.policy import Policy, PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.trust.timestamps import (
    check_validity_window,
    load_timestamp_authority,
    request_timestamp,
    verify_timestamps,
)
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI (openssl ts)")

_CONFIG = """[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
serial = {dir}/serial
signer_cert = {dir}/tsa.pem
signer_key = {dir}/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512, sha3-256
accuracy = secs:1
ess_cert_id_alg = sha256
"""


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _make_tsa(d: Path, label: str) -> Path:
    """A root CA and a TSA certificate (critical timeStamping EKU) under `d`; returns the root's PEM path."""
    now = dt.datetime.now(dt.UTC)
    root_key, tsa_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    valid = {"not_valid_before": now - dt.timedelta(days=1), "not_valid_after": now + dt.timedelta(days=30)}
    root = (
        x509.CertificateBuilder(
            subject_name=_name(f"{label} root"), issuer_name=_name(f"{label} root"), **valid
        )
        .public_key(root_key.public_key())
        .serial_number(1)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(root_key, hashes.SHA256())
    )
    tsa = (
        x509.CertificateBuilder(subject_name=_name(f"{label} tsa"), issuer_name=root.subject, **valid)
        .public_key(tsa_key.public_key())
        .serial_number(2)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    d.mkdir()
    (d / "root.pem").write_bytes(root.public_bytes(serialization.Encoding.PEM))
    (d / "tsa.pem").write_bytes(tsa.public_bytes(serialization.Encoding.PEM))
    (d / "tsa.key").write_bytes(
        tsa_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (d / "serial").write_text("01\n")
    (d / "ts.cnf").write_text(_CONFIG.format(dir=d))
    return d / "root.pem"


@contextlib.contextmanager
def serve_tsa(
    d: Path, *, clock: Sequence[str] = (), rewrite: Callable[[bytes], bytes] | None = None
) -> Iterator[str]:
    """Serve the TSA `_make_tsa` made in `d` on loopback HTTP; yields its URL. `clock` prefixes each
    `openssl ts -reply` (e.g. `faketime -f +1h`: a TSA whose clock runs ahead); `rewrite` changes each DER
    query before the TSA answers it (a TSA that answers another question than it was asked)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            query = self.rfile.read(int(self.headers["Content-Length"]))
            if rewrite is not None:
                query = rewrite(query)
            (d / "q.tsq").write_bytes(query)
            subprocess.run(
                [*clock, "openssl", "ts", "-reply", "-config", str(d / "ts.cnf"),
                 "-queryfile", str(d / "q.tsq"), "-out", str(d / "r.tsr")],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip
            body = (d / "r.tsr").read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/timestamp-reply")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tsa"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL of a running TSA, its root certificate file)."""
    d = tmp_path_factory.mktemp("tsa") / "tsa"
    root = _make_tsa(d, "trusted")
    with serve_tsa(d) as url:
        yield url, root


def _unchecked_timestamp(signature: bytes, url: str) -> bytes:
    """The TSA's DER answer to a SHA-256 query over `signature`, taken as it comes (nothing checked)."""
    query = rfc3161_client.TimestampRequestBuilder(
        data=signature, hash_algorithm=rfc3161_client.HashAlgorithm.SHA256, nonce=True, cert_req=True
    ).build()
    request = urllib.request.Request(
        url, data=query.as_bytes(), headers={"Content-Type": "application/timestamp-query"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        body: bytes = reply.read()
    return body


def _signed(model: Path, key_dir: Path) -> tuple[Path, bytes]:
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    bundle = model / "model.sig"
    return bundle, parse_bundle(bundle.read_bytes(), source=str(bundle)).signature.sig


def test_timestamp_round_trip_and_refusals(
    tiny_model: Path, key_dir: Path, tsa: tuple[str, Path], tmp_path: Path
) -> None:
    url, root = tsa
    bundle, signature = _signed(tiny_model, key_dir)
    before = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=2)
    token = request_timestamp(signature, url)
    bundle.write_bytes(add_timestamps(bundle.read_bytes(), [token], source=str(bundle)))
    doc = json.loads(bundle.read_bytes())
    stored = doc["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"]
    assert [base64.b64decode(e["signedTimestamp"]) for e in stored] == [token]
    parsed = parse_bundle(bundle.read_bytes(), source="b")
    authority = load_timestamp_authority(root)
    (when,) = verify_timestamps(parsed.timestamps, signature, [authority], source="b")
    assert before <= when <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    # A bundle carrying a timestamp still verifies as before.
    verify_model(tiny_model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]))

    # Refused: a timestamp over other bytes, and one from a TSA the policy does not name.
    other = request_timestamp(b"other bytes", url)
    with pytest.raises(SignatureError, match="not trusted for this signature"):
        verify_timestamps([other], signature, [authority], source="b")
    stranger = load_timestamp_authority(_make_tsa(tmp_path / "untrusted", "untrusted"))
    with pytest.raises(SignatureError, match="not trusted for this signature"):
        verify_timestamps([token], signature, [stranger], source="b")
    with pytest.raises(SignatureError, match="no timestamp authority is configured"):
        verify_timestamps([token], signature, [], source="b")
    with pytest.raises(MalformedArtifactError, match="not a DER TimeStampResp"):
        verify_timestamps([b"\x30\x03junk"], signature, [authority], source="b")


def test_validity_window_uses_the_trusted_time(
    key_dir: Path, tiny_model: Path, tsa: tuple[str, Path]
) -> None:
    url, root = tsa
    _, signature = _signed(tiny_model, key_dir)
    token = request_timestamp(signature, url)
    (when,) = verify_timestamps([token], signature, [load_timestamp_authority(root)], source="b")
    # The key's window closed one minute after the timestamp: verified later, the signature still counts.
    valid_until = when + dt.timedelta(minutes=1)
    check_validity_window(when, valid_from=when - dt.timedelta(days=1), valid_until=valid_until, key="ci")
    # Without a timestamp the verification time (now + 1 hour here) decides, and it is outside the window.
    later = when + dt.timedelta(hours=1)
    with pytest.raises(SignatureError, match="after key 'ci' validUntil"):
        check_validity_window(later, valid_from=None, valid_until=valid_until, key="ci")
    # A signature timestamped after the key's validUntil is refused.
    with pytest.raises(SignatureError, match="after key 'ci' validUntil"):
        check_validity_window(when, valid_from=None, valid_until=when - dt.timedelta(seconds=1), key="ci")
    with pytest.raises(SignatureError, match="before key 'ci' validFrom"):
        check_validity_window(when, valid_from=when + dt.timedelta(seconds=1), valid_until=None, key="ci")


# --- End to end through the CLI: `sign --timestamp-url`, then `verify --policy` with TSAs and key windows


def _gen_time(bundle: Path) -> dt.datetime:
    import rfc3161_client

    (stored,) = json.loads(bundle.read_bytes())["verificationMaterial"]["timestampVerificationData"][
        "rfc3161Timestamps"
    ]
    return rfc3161_client.decode_timestamp_response(
        base64.b64decode(stored["signedTimestamp"])
    ).tst_info.gen_time


def _policy_file(d: Path, key: Path, **entry: object) -> Path:
    """A policy trusting `key` with `entry`'s window keys; TSA and requireTimestamp fields via `entry`."""
    window = {k: v for k, v in entry.items() if k in ("validFrom", "validUntil")}
    rest = {k: v for k, v in entry.items() if k not in window}
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [{"name": "p", "match": ["file://**"], "keys": [{"path": str(key), **window}], **rest}],
    }
    path = d / f"policy-{len(list(d.glob('policy-*')))}.json"
    path.write_text(json.dumps(doc, default=lambda t: t.isoformat()))
    return path


def test_cli_sign_with_timestamp_verifies_across_key_rotation(
    tiny_model: Path, key_dir: Path, tsa: tuple[str, Path], tmp_path: Path
) -> None:
    url, root = tsa
    r = run_cli(
        "sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--timestamp-url", url, "--json"
    )
    assert r.returncode == 0, r.stderr
    bundle = tiny_model / "model.sig"
    when = _gen_time(bundle)  # whole seconds: the signature existed at `when` at the latest
    while dt.datetime.now(dt.UTC) <= when + dt.timedelta(milliseconds=50):
        time.sleep(0.05)
    pub, tsas = key_dir / "ecdsa-p256.pub.pem", [{"name": "tsa", "certChain": [str(root)]}]

    def verify(policy: Path) -> subprocess.CompletedProcess[str]:
        return run_cli("verify", tiny_model, "--policy", policy)

    # The key was rotated at `when` (validUntil): verified after it, the timestamp keeps the signature valid.
    ok = verify(
        _policy_file(tmp_path, pub, validUntil=when, timestampAuthorities=tsas, requireTimestamp=True)
    )
    assert ok.returncode == 0, ok.stderr
    # Timestamped after the key's validUntil: refused.
    late = verify(
        _policy_file(tmp_path, pub, validUntil=when - dt.timedelta(seconds=1), timestampAuthorities=tsas)
    )
    assert late.returncode == 1 and "after key 'ecdsa-p256.pub.pem' validUntil" in late.stderr
    # Timestamped before validFrom: refused.
    early = verify(
        _policy_file(tmp_path, pub, validFrom=when + dt.timedelta(seconds=1), timestampAuthorities=tsas)
    )
    assert early.returncode == 1 and "before key 'ecdsa-p256.pub.pem' validFrom" in early.stderr
    # Without a TSA to trust the timestamp, the verification time decides: after validUntil, refused ...
    untimed = verify(_policy_file(tmp_path, pub, validUntil=when))
    assert untimed.returncode == 1 and "validUntil" in untimed.stderr
    # ... and inside the window, accepted.
    inside = verify(_policy_file(tmp_path, pub, validUntil=when + dt.timedelta(days=1)))
    assert inside.returncode == 0, inside.stderr
    # A timestamp from a TSA the policy does not name is refused.
    other = _make_tsa(tmp_path / "other", "other")
    stranger = verify(
        _policy_file(tmp_path, pub, timestampAuthorities=[{"name": "other", "certChain": [str(other)]}])
    )
    assert stranger.returncode == 1 and "not trusted for this signature" in stranger.stderr


def test_cli_require_timestamp_refuses_an_untimestamped_bundle(
    tiny_model: Path, key_dir: Path, tsa: tuple[str, Path], tmp_path: Path
) -> None:
    _, root = tsa
    assert run_cli("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    tsas = [{"name": "tsa", "certChain": [str(root)]}]
    policy = _policy_file(
        tmp_path, key_dir / "ecdsa-p256.pub.pem", timestampAuthorities=tsas, requireTimestamp=True
    )
    r = run_cli("verify", tiny_model, "--policy", policy)
    assert r.returncode == 1 and "requires an RFC 3161 timestamp; the bundle has none" in r.stderr
    # A timestamp over other bytes grafted onto the bundle is refused.
    bundle = tiny_model / "model.sig"
    bundle.write_bytes(add_timestamps(bundle.read_bytes(), [request_timestamp(b"other", tsa[0])], source="b"))
    r = run_cli("verify", tiny_model, "--policy", policy)
    assert r.returncode == 1 and "not trusted for this signature" in r.stderr


def test_cli_sign_fails_and_writes_nothing_when_the_tsa_fails(tiny_model: Path, key_dir: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_cli(
        "sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--timestamp-url", f"http://127.0.0.1:{port}/tsa",
    )  # fmt: skip
    assert r.returncode == 1 and "timestamp authority unavailable" in r.stderr
    assert not (tiny_model / "model.sig").exists()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"validFrom": "2025-02-01T00:00:00Z", "validUntil": "2025-01-01T00:00:00Z"},
            "validFrom must be before",
        ),
        ({"validUntil": "2025-01-01T00:00:00"}, "with its offset"),
        ({"validUntil": "next tuesday"}, "RFC 3339"),
    ],
)
def test_policy_refuses_bad_key_windows(
    key_dir: Path, tmp_path: Path, entry: dict[str, str], message: str
) -> None:
    policy = _policy_file(tmp_path, key_dir / "ecdsa-p256.pub.pem", **entry)
    with pytest.raises(PolicyError, match=message):
        PolicySet.from_file(policy)


def test_policy_require_timestamp_needs_a_tsa(key_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="requireTimestamp needs timestampAuthorities"):
        PolicySet.from_file(_policy_file(tmp_path, key_dir / "ecdsa-p256.pub.pem", requireTimestamp=True))


_SHA256 = bytes.fromhex("0609608648016503040201")  # DER OID 2.16.840.1.101.3.4.2.1
_SHA3_256 = bytes.fromhex("0609608648016503040208")  # 2.16.840.1.101.3.4.2.8, a digest of the same length


def test_request_refuses_an_imprint_under_another_hash_algorithm(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    """A TSA that stamps the same 32 bytes as a SHA3-256 digest: no verifier can match it to the signature."""
    d = tmp_path / "sha3"
    root = _make_tsa(d, "sha3")
    _, signature = _signed(tiny_model, key_dir)
    with serve_tsa(d, rewrite=lambda q: q.replace(_SHA256, _SHA3_256)) as url:
        token = _unchecked_timestamp(signature, url)
        with pytest.raises(MalformedArtifactError, match="over other bytes than the signature"):
            request_timestamp(signature, url)
    imprint = rfc3161_client.decode_timestamp_response(token).tst_info.message_imprint
    assert imprint.hash_algorithm.dotted_string == "2.16.840.1.101.3.4.2.8"
    with pytest.raises(SignatureError, match="not trusted for this signature"):
        verify_timestamps([token], signature, [load_timestamp_authority(root)], source="b")
