"""The pytest plugin of tests/support (tests/conftest.py's `pytest_plugins`): servers once per session.

- `registry`: a real CNCF distribution registry (TLS + htpasswd). Tests share it: each pushes to its own
  repositories (distinct names) and reads nothing it did not push.
- `grpc_server`: `modelsec serve` in a thread with `write_server_config`'s defaults (anonymous plaintext, the
  test keys `ci-p256/1` and `ci-sm2/1`, read and write roots `/`), which also lets anyone delete and supersede
  attestations. Tests share its store: each stores bundles of its own model (a distinct seed or name).
  A test that needs a differently configured server starts its own and says why.
- `postgres`: a PostgreSQL server (Debian `postgresql`, as the `postgres` user under root) on a loopback port
  with password authentication; each test creates a database of its own (`postgres.new_database()`).
- `pki` (`tls`, its TLS files): CAs and certificates, read-only.
- `softhsm_token`: a SoftHSM2 token with the keys `release` (P-256) and `release384` (P-384); this process
  loads SoftHSM2 for it (SOFTHSM2_CONF points at it), with a second token `doomed` for a removal test.
  Read-only otherwise: a test that changes a token makes its own (`make_token`).
- `swtpm`, `swtpm_other`: two software TPMs (Debian swtpm, driven with tpm2-tools), each with a provisioned
  attestation key: two nodes; each behind its own tpm2-abrmd on one private D-Bus session bus (`tpm_dbus`)
  where those are installed. A test that extends a PCR resets it (PCR 16 is resettable) before it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.oci import Registry, registry_missing_reason, run_registry
from tests.support.pki import Pki, make_pki
from tests.support.postgres import Postgres, postgres_missing_reason, run_postgres
from tests.support.service import InThreadServer, write_server_config
from tests.support.softhsm import PIN, Token, make_token
from tests.support.tpm import (
    SoftwareTpm,
    abrmd_missing_reason,
    private_dbus,
    run_swtpm,
    tpm_missing_reason,
)

_T = TypeVar("_T")


def _run_or_skip(
    missing_reason: Callable[[], str | None], run: Callable[[], contextlib.AbstractContextManager[_T]]
) -> Iterator[_T]:
    """Skip with `missing_reason()` where the tool is absent; else yield what `run()` starts, then stop it."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    with run() as running:
        yield running


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    directory = tmp_path_factory.mktemp("registry")
    yield from _run_or_skip(registry_missing_reason, lambda: run_registry(directory))


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    yield from _run_or_skip(postgres_missing_reason, run_postgres)


@pytest.fixture(scope="session")
def grpc_server(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[InThreadServer]:
    config = write_server_config(
        tmp_path_factory.mktemp("grpc-server"),
        key_dir,
        access={
            "putAttestation": ["*"],
            "verifyModel": ["*"],
            "watermark": ["*"],
            "robustness": ["*"],
            "deleteAttestation": ["*"],
            "supersedeAttestation": ["*"],
        },
    )
    with InThreadServer(config) as server:
        yield server


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def tls(pki: Pki) -> dict[str, Path]:
    return pki.tls


@pytest.fixture(scope="session")
def softhsm_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Token]:
    token = make_token(tmp_path_factory.mktemp("hsm"))
    # A second token in the same directory, for the removal test: SoftHSM2 only sees tokens that exist
    # when this process first loads it.
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", "doomed", "--so-pin", "5678", "--pin", PIN],
        env=token.env,
        check=True,
        capture_output=True,
    )
    dataclasses.replace(token, label="doomed").generate("doomed", "09", "secp256r1")
    saved = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = token.env["SOFTHSM2_CONF"]
    yield token
    if saved is None:
        os.environ.pop("SOFTHSM2_CONF", None)
    else:
        os.environ["SOFTHSM2_CONF"] = saved


@pytest.fixture(scope="session")
def tpm_dbus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[bool]:
    """A private D-Bus session bus for tpm2-abrmd (`$DBUS_SESSION_BUS_ADDRESS` set while it runs); False,
    and no bus, where tpm2-abrmd, dbus-daemon or the tabrmd TCTI are missing (clients then reach swtpm
    directly)."""
    if abrmd_missing_reason() is not None:
        yield False
        return
    with private_dbus(tmp_path_factory.mktemp("dbus")) as address:
        saved = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
        try:
            yield True
        finally:
            if saved is None:
                os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
            else:
                os.environ["DBUS_SESSION_BUS_ADDRESS"] = saved


@pytest.fixture(scope="session")
def swtpm(tmp_path_factory: pytest.TempPathFactory, tpm_dbus: bool) -> Iterator[SoftwareTpm]:
    """A software TPM with a provisioned attestation key: the node under test (`tests/support/tpm.py`),
    behind tpm2-abrmd where `tpm_dbus` runs one."""
    yield from _run_or_skip(
        tpm_missing_reason, lambda: run_swtpm(tmp_path_factory.mktemp("swtpm"), broker=tpm_dbus)
    )


@pytest.fixture(scope="session")
def swtpm_other(tmp_path_factory: pytest.TempPathFactory, tpm_dbus: bool) -> Iterator[SoftwareTpm]:
    """A second software TPM: another node, whose receipts must not pass as the first one's."""
    yield from _run_or_skip(
        tpm_missing_reason, lambda: run_swtpm(tmp_path_factory.mktemp("swtpm-other"), broker=tpm_dbus)
    )
