"""Errors of the Python API give no command-line advice: a library caller has no `--signature` option."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import KeyMaterialError, SignatureError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from tests.conftest import run_cli

P256 = SignatureAlgorithm.ECDSA_P256.value


def test_missing_bundle_error_names_no_cli_option(tiny_model: Path, key_dir: Path) -> None:
    with pytest.raises(SignatureError, match="no signature bundle found") as e:
        verify_model(tiny_model, Policy.from_key_files([key_dir / f"{P256}.pub.pem"]))
    assert "--" not in e.value.diagnostics()


def test_colliding_bundles_error_names_no_cli_option(tiny_model: Path, key_dir: Path) -> None:
    keys = [load_private_key_file(key_dir / n) for n in (f"{P256}.key.pem", "other.key.pem")]
    with pytest.raises(KeyMaterialError, match="same bundle") as e:
        sign_model(tiny_model, keys)
    assert "--" not in e.value.diagnostics()


def test_cli_adds_its_own_hint(tiny_model: Path, key_dir: Path) -> None:
    r = run_cli("sign", tiny_model, "--signing-key", key_dir / f"{P256}.key.pem", "--signing-key",
        key_dir / "other.key.pem")
    assert r.returncode == 2 and "give --signature for each key" in r.stderr, r.stderr
