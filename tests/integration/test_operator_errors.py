"""The errors an operator meets first, each one line that says what to do next, its detail behind --verbose.

Asserted by class and fields (`RegistryUnreachableError.problem`, `.registry`, `details`), plus one wording
test per class through the CLI. Real registries on loopback: the CNCF registry with TLS (`registry`) and a
plain-HTTP listener started here (it only has to answer, not to be a registry).
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.errors import RegistryUnreachableError, SignatureError
from modelsec.policy import Policy
from modelsec.registry.client import RegistryClient, RegistryOptions
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry

pytestmark = pytest.mark.integration


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the CLI's stderr is under test
        return


@pytest.fixture(scope="module")
def plain_http() -> Iterator[str]:
    """A plain-HTTP server on loopback (`host:port`), answering 400/501 to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _problem(registry: str, **options: object) -> RegistryUnreachableError:
    client = RegistryClient(registry, RegistryOptions(username=USER, password=PASSWORD, timeout=5, **options))
    with pytest.raises(RegistryUnreachableError) as info:
        client.check()
    client.close()
    return info.value


def test_each_registry_problem_is_named(registry: Registry, plain_http: str) -> None:
    cases = {
        "plain-http-server": _problem(plain_http),  # TLS spoken to a plain-HTTP registry
        "tls-server": _problem(registry.address, plain_http=True),  # plain HTTP spoken to a TLS registry
        "untrusted-certificate": _problem(registry.address),  # its CA not given
        "connection": _problem(_closed_port()),
    }
    for problem, error in cases.items():
        assert error.problem == problem
        assert error.registry in str(error) and error.retryable
        assert "\n" not in str(error) and len(str(error)) < 200, str(error)
        assert error.details and error.registry in error.details[0]  # the third-party text, for --verbose
    assert "--plain-http" in str(cases["plain-http-server"])
    assert "MODELSEC_OCI_PLAIN_HTTP" in str(cases["plain-http-server"])
    assert "leave out --plain-http" in str(cases["tls-server"])
    assert "--registry-ca" in str(cases["untrusted-certificate"])


def test_registry_error_wording_and_verbose_detail(
    plain_http: str, tmp_path: Path, key_dir: Path, cli
) -> None:
    ref = f"oci://{plain_http}/models/x@sha256:{'a' * 64}"
    pub = key_dir / "ecdsa-p256.pub.pem"
    r = cli("pull", ref, tmp_path / "dest", "--trusted-key", pub)
    assert r.returncode == 1
    assert r.stderr == (
        f"modelsec: error: registry {plain_http}: it answered in plain HTTP, not TLS: for a development "
        "registry give --plain-http (or set MODELSEC_OCI_PLAIN_HTTP=1)\n"
    )
    verbose = cli("--verbose", "pull", ref, tmp_path / "dest", "--trusted-key", pub)
    first, *detail = verbose.stderr.splitlines()
    assert first == r.stderr.strip() and detail and "SSL" in detail[0]
    doc = json.loads(cli("pull", ref, tmp_path / "dest", "--trusted-key", pub, "--json").stdout)
    assert doc["error"]["kind"] == "RegistryUnreachableError" and doc["error"]["details"]
    assert not (tmp_path / "dest").exists()


def test_pull_with_an_untrusted_key_is_one_line(
    tmp_path: Path, key_dir: Path, registry: Registry, cli
) -> None:
    model = write_tiny_model(tmp_path / "m", seed=41)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    key, pub = key_dir / "ecdsa-p256.key.pem", key_dir / "ecdsa-p256.pub.pem"
    pushed = cli("push", model, f"oci://{registry.address}/models/onekey:v1", "--signing-key", key,
                 "--trusted-key", pub, "--json", env=registry.env())  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    ref = f"oci://{registry.address}/models/onekey@{json.loads(pushed.stdout)['manifestDigest']}"

    from modelsec.distribution.push_pull import pull_model

    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD)
    with pytest.raises(SignatureError) as info:
        pull_model(ref, tmp_path / "lib", Policy.from_key_files([key_dir / "other.pub.pem"]), options=options)
    error = info.value
    assert len(error.details) >= 2  # the binding and the weights bundle, each skipped with its reason
    for line in error.details:
        source = line.split(": ", 1)[0]
        assert line.count(source) == 1, line  # the referrer is named once
    assert not (tmp_path / "lib").exists()

    r = cli("pull", ref, tmp_path / "dest", "--trusted-key", key_dir / "other.pub.pem", env=registry.env())
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and len(r.stderr) < 600, r.stderr
    assert "--trusted-key" in r.stderr and "--verbose lists them" in r.stderr, r.stderr
    # The other signer's bundle is not "invalid": it is signed by a key this pull does not trust.
    assert "signed by a key not trusted here" in r.stderr and "invalid" not in r.stderr
    verbose = cli("-v", "pull", ref, tmp_path / "dest", "--trusted-key", key_dir / "other.pub.pem",
                  env=registry.env())  # fmt: skip
    assert verbose.stderr.splitlines()[1:] == [f"  {line}" for line in error.details]


def test_attest_list_skips_what_verify_skips_in_the_registry(
    tmp_path: Path, key_dir: Path, registry, cli
) -> None:
    model = write_tiny_model(tmp_path / "m", seed=51)
    sign_model(
        model,
        [
            load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
            load_private_key_file(key_dir / "sm2.key.pem"),
        ],
    )
    key, pub = key_dir / "ecdsa-p256.key.pem", key_dir / "ecdsa-p256.pub.pem"
    pushed = cli(
        "push",
        model,
        f"oci://{registry.address}/models/al:v1",
        "--signing-key",
        key,
        "--trusted-key",
        pub,
        "--json",
        env=registry.env(),
    )
    assert pushed.returncode == 0, pushed.stderr
    ref = f"oci://{registry.address}/models/al@{json.loads(pushed.stdout)['manifestDigest']}"
    v = cli("verify", model, "--trusted-key", pub, env=registry.env())
    assert v.returncode == 0 and "model.sm2.sig not checked" in v.stderr
    # attest list skips the SM2 bundles no given key can check, locally and in the registry, as verify does.
    r = cli("attest", "list", model, "--store", ref, "--trusted-key", pub, "--json", env=registry.env())
    assert r.returncode == 0, r.stdout
    rows = json.loads(r.stdout)["bundles"]
    sources = [row["path"] for row in rows]
    assert any(p.startswith("oci://") for p in sources) and any(p.endswith("model.sm2.sig") for p in sources)
    skipped = [row for row in rows if row["skipped"]]
    assert skipped and all(row["signer"] is None for row in skipped)
    assert any(row["signer"] and row["signer"]["algorithm"] == "ecdsa-p256" for row in rows)


class _CutShort(_Quiet):
    """A registry whose blobs end early: `Content-Length: 100`, 10 bytes, then the connection closes."""

    def do_GET(self) -> None:
        self.send_response(200)
        if self.path.startswith("/v2/") and "/blobs/" in self.path:
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_connection_failing_mid_body_is_a_registry_error(tmp_path: Path) -> None:
    """Not a bare requests/urllib3/ssl error: what a reset or TLS failure in the middle of a blob raises."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    client = RegistryClient(address, RegistryOptions(plain_http=True, timeout=5))
    try:
        with pytest.raises(RegistryUnreachableError) as info:
            client.get_blob("models/x", "sha256:" + "a" * 64, 1000, what="blob")
        with pytest.raises(RegistryUnreachableError), (tmp_path / "sink").open("wb") as sink:
            client.stream_blob("models/x", "sha256:" + "a" * 64, 100, sink, what="blob")
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    error = info.value
    assert error.registry == address and error.problem == "connection"
    assert "\n" not in str(error) and error.details and "IncompleteRead" in error.details[0]


def test_tls_to_a_plain_http_timestamp_authority_says_what_to_give(plain_http: str) -> None:
    """The TSA client's `ssl.SSLError` is the detail; the line says what to do (here: an http:// URL)."""
    from modelsec.errors import BackendUnavailableError
    from modelsec.verifier.trust.timestamps import request_timestamp

    url = f"https://{plain_http}/tsa"
    with pytest.raises(BackendUnavailableError) as info:
        request_timestamp(b"signature", url, timeout=5)
    error = info.value
    assert str(error).startswith(f"{url}: timestamp authority unavailable: ") and "\n" not in str(error)
    assert "give an http:// URL" in str(error) and "SSL" not in str(error)
    assert error.details and "SSL" in error.details[0]
