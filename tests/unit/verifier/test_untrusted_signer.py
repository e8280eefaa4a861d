"""Verify with a key that did not sign (issue 31): one line naming the key id the bundle states, the keys
tried and what to do; each key's own reason behind --verbose. Not "invalid": another signer's bundle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelsec.errors import SignatureError, UntrustedSignerError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, load_trusted_key, sign_model
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Path:
    model = write_tiny_model(tmp_path_factory.mktemp("untrusted") / "model", seed=31)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return model


def _keyid(path: Path) -> str:
    return load_trusted_key(path.read_bytes(), name=path.name).keyid


def test_wrong_trusted_key_names_the_signer_the_keys_tried_and_the_next_step(
    signed: Path, key_dir: Path
) -> None:
    other = key_dir / "other.pub.pem"
    with pytest.raises(UntrustedSignerError) as info:
        verify_model(signed, Policy.from_key_files([other]))
    error = info.value
    assert isinstance(error, SignatureError)  # callers catching SignatureError still catch it
    assert error.path == str(signed / "model.sig")
    assert error.keyid == _keyid(key_dir / "ecdsa-p256.pub.pem")  # the key id the signer's bundle states
    assert error.tried == ("other.pub.pem",) and error.tried_keyids == (_keyid(other),)
    assert error.role == "weights" and error.named_key is None
    message = str(error)
    assert "\n" not in message and "invalid" not in message
    assert (
        f"key id {error.keyid[:16]}" in message and f"other.pub.pem (key id {_keyid(other)[:16]})" in message
    )
    assert message.endswith("verify with the signer's public key (--trusted-key) or a policy that trusts it")
    assert error.details and "other.pub.pem" in error.details[0]  # the key's own reason, for --verbose


def test_wrong_trusted_key_through_the_cli(signed: Path, key_dir: Path, cli) -> None:  # type: ignore[no-untyped-def]
    other = key_dir / "other.pub.pem"
    r = cli("verify", signed, "--trusted-key", other)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "signed by a key not trusted here" in r.stderr and "--trusted-key" in r.stderr
    verbose = cli("--verbose", "verify", signed, "--trusted-key", other)
    first, *detail = verbose.stderr.splitlines()
    assert first == r.stderr.strip() and detail and detail[0].startswith("  other.pub.pem: ")
    doc = json.loads(cli("verify", signed, "--trusted-key", other, "--json").stdout)
    assert doc["error"]["kind"] == "UntrustedSignerError" and doc["error"]["details"]


def test_no_key_of_the_bundles_algorithm_says_what_to_give(tmp_path: Path, key_dir: Path, cli) -> None:  # type: ignore[no-untyped-def]
    model = write_tiny_model(tmp_path / "sm2-only", seed=32)
    sign_model(model, [load_private_key_file(key_dir / "sm2.key.pem")])
    with pytest.raises(SignatureError) as info:
        verify_model(model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]))
    message = str(info.value)
    assert "model.sm2.sig not checked (no configured key of its algorithm)" in message and "\n" not in message
    assert message.endswith("give the signer's public key (--trusted-key) or a policy that trusts it")
    r = cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem")
    assert r.returncode == 1 and "--trusted-key" in r.stderr and r.stderr.count("\n") == 1
