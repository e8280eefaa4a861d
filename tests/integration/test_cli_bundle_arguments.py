"""Bundles named on `attest put` / `attest push` are read as every operator file is: regular files only (a
FIFO is refused by kind, never waited on), at most `Limits.max_bundle_bytes`, nothing stored otherwise."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from modelsec.limits import Limits
from tests.conftest import run_cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["put", "push"])
def test_a_fifo_or_oversized_bundle_is_refused_and_nothing_is_stored(command: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    os.mkfifo(tmp_path / "bundle.fifo")  # no writer: the old read_bytes() blocked here until the timeout
    big = tmp_path / "big.sig"
    with open(big, "wb") as f:
        f.truncate(Limits().max_bundle_bytes + 1)  # sparse: the old read_bytes() read all of it
    cases = [
        (tmp_path / "bundle.fifo", "the attestation bundle is not a regular file (a FIFO or pipe)"),
        (big, f"the attestation bundle is larger than {Limits().max_bundle_bytes} bytes"),
        (tmp_path / "missing.sig", "cannot read the attestation bundle: No such file or directory"),
    ]
    for bundle, message in cases:
        args = ["--store", store, bundle] if command == "put" else [store, bundle]
        r = run_cli("attest", command, *args, "--json")
        assert r.returncode == 1, r.stderr
        error = json.loads(r.stdout)["error"]
        assert error["kind"] == "MalformedArtifactError", error
        assert error["message"].startswith(str(bundle)) and message in error["message"], error
    assert list(store.rglob("*.sig")) == []
