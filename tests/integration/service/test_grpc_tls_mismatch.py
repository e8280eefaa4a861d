"""TLS spoken to a plaintext `modelsec serve`, plaintext to a TLS one, an untrusted certificate (issue 31).

Each is a `ServerUnreachableError` naming the server, the problem and the option to give (`--plaintext`,
`--tls-ca`), one line; gRPC's own text (the SSL error) only in `details`, behind --verbose. A TLS server of
its own: the session's `grpc_server` is plaintext.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.errors import BackendUnavailableError, ServerUnreachableError
from modelsec.service.client import ChannelOptions, ModelsecClient
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration
DIGEST = "ab" * 32


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory, key_dir: Path, tls: dict[str, Path]
) -> Iterator[str]:
    config = write_server_config(
        tmp_path_factory.mktemp("tls-server"),
        key_dir,
        tls={"cert": str(tls["server"]), "key": str(tls["server_key"])},
        tokens=[{"identity": "ci", "sha256": hashlib.sha256(b"t0ken").hexdigest()}],
    )
    with InThreadServer(config) as server:
        yield server.target


def _error(target: str, options: ChannelOptions) -> ServerUnreachableError:
    with ModelsecClient(target, options) as client, pytest.raises(ServerUnreachableError) as info:
        client.list_keys()
    return info.value


def test_each_transport_mismatch_is_named(grpc_server, tls_server: str, tls: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    cases = {
        "plaintext-server": _error(grpc_server.target, ChannelOptions(ca=tls["ca"], timeout=10)),
        "tls-server": _error(tls_server, ChannelOptions(plaintext=True, timeout=10)),
        "untrusted-certificate": _error(tls_server, ChannelOptions(timeout=10)),
    }
    for problem, error in cases.items():
        assert error.problem == problem and isinstance(error, BackendUnavailableError) and error.retryable
        assert str(error).startswith(f"server {error.server}: ") and "\n" not in str(error)
        assert "SSL" not in str(error) and "UNAVAILABLE" not in str(error)  # gRPC's words are the detail
        assert error.details and "UNAVAILABLE" in error.details[0]
    assert "--plaintext" in str(cases["plaintext-server"])
    assert "leave out --plaintext" in str(cases["tls-server"]) and "--tls-ca" in str(cases["tls-server"])
    assert "--tls-ca" in str(cases["untrusted-certificate"])


def test_tls_to_a_plaintext_server_through_the_cli(grpc_server, tls: dict[str, Path], cli) -> None:  # type: ignore[no-untyped-def]
    args = ("attest", "pull", DIGEST, "--server", grpc_server.target, "--tls-ca", tls["ca"])
    r = cli(*args)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "--plaintext" in r.stderr and "SSL" not in r.stderr
    verbose = cli("--verbose", *args)
    first, *detail = verbose.stderr.splitlines()
    assert first == r.stderr.strip() and detail and "SSL" in detail[0]
    doc = json.loads(cli(*args, "--json").stdout)
    assert doc["error"]["kind"] == "ServerUnreachableError" and doc["error"]["details"]
