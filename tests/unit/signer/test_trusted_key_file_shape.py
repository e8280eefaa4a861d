"""A trusted key file holds exactly one PEM public key (user trial 2, finding 6; issue 27, 8a).

PEM parsers read the first block of a file and ignore the rest, so `cat p256.pub p384.pub > two.pub` trusted
the P-256 key alone. Two blocks, a stray BEGIN or END line, and text inside the block are refused, naming the
file. Text around the one block is explanation (RFC 7468 section 2) and is ignored, as OpenSSL, `cryptography`
and model_signing ignore it: GnuTLS `certtool --pubkey-info` writes such files (`fixtures/README.md`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelsec.errors import KeyMaterialError
from modelsec.signer.keys import load_trusted_key_file
from tests.conftest import run_cli
from tests.support.policies import write_policy_file

FIXTURES = Path(__file__).parent / "fixtures"
CERTTOOL_PUB = FIXTURES / "certtool-p256.pub.pem"
CERTTOOL_KEY = FIXTURES / "certtool-p256.key.pem"


def test_two_public_keys_in_one_file_are_refused(key_dir: Path, tmp_path: Path) -> None:
    two = tmp_path / "two.pub.pem"
    two.write_bytes(
        (key_dir / "ecdsa-p256.pub.pem").read_bytes() + (key_dir / "ecdsa-p384.pub.pem").read_bytes()
    )
    with pytest.raises(KeyMaterialError, match=rf"^{tmp_path}/two.pub.pem: holds 2 PEM blocks"):
        load_trusted_key_file(two)


@pytest.mark.parametrize(
    "extra",
    [b"-----END PUBLIC KEY-----\n", b"-----BEGIN PUBLIC KEY-----\n", b"x -----END CERTIFICATE-----\n"],
)
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_stray_pem_boundary_outside_the_block_is_refused(
    key_dir: Path, tmp_path: Path, extra: bytes, where: str
) -> None:
    pem = (key_dir / "ecdsa-p256.pub.pem").read_bytes()
    path = tmp_path / "trail.pub.pem"
    path.write_bytes(extra + pem if where == "before" else pem + extra)
    refused = rf"^{path}: (holds 2 PEM blocks|the PEM block is not terminated)"
    with pytest.raises(KeyMaterialError, match=refused):
        load_trusted_key_file(path)


@pytest.mark.parametrize("inside", [b"Comment: mine\n", b"garbage!\n", b"Proc-Type: 4,ENCRYPTED\n\n"])
def test_text_inside_the_block_is_refused(key_dir: Path, tmp_path: Path, inside: bytes) -> None:
    head, body = (key_dir / "ecdsa-p256.pub.pem").read_bytes().split(b"\n", 1)
    path = tmp_path / "inside.pub.pem"
    path.write_bytes(head + b"\n" + inside + body)
    with pytest.raises(KeyMaterialError, match=rf"^{path}: text inside the PEM block"):
        load_trusted_key_file(path)


@pytest.mark.parametrize("alg", ["ecdsa-p256", "sm2", "ml-dsa-65"])
def test_text_around_the_block_is_ignored(key_dir: Path, tmp_path: Path, alg: str) -> None:
    pem = (key_dir / f"{alg}.pub.pem").read_bytes()
    path = tmp_path / "told.pub.pem"
    path.write_bytes(b"Public Key Information:\n\tAlgorithm: mine\n\n" + pem + b"trailing note\n")
    assert load_trusted_key_file(path).pem == load_trusted_key_file(key_dir / f"{alg}.pub.pem").pem


def test_a_private_key_with_text_around_it_is_still_refused(key_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "told.key.pem"
    path.write_bytes(b"Private key for signing\n" + (key_dir / "ecdsa-p256.key.pem").read_bytes())
    with pytest.raises(KeyMaterialError, match="is a private key"):
        load_trusted_key_file(path)


def test_a_certtool_public_key_verifies_a_real_bundle(tiny_model: Path, tmp_path: Path) -> None:
    """GnuTLS `certtool --pubkey-info` output, as `--trusted-key` and as a policy key file."""
    assert CERTTOOL_PUB.read_bytes().startswith(b"Public Key Information:\n")  # text above the block
    r = run_cli("sign", tiny_model, "--signing-key", CERTTOOL_KEY, "-q")
    assert r.returncode == 0, r.stderr
    r = run_cli("verify", tiny_model, "--trusted-key", CERTTOOL_PUB, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True
    policy = write_policy_file(tmp_path / "policy.json", keys=[CERTTOOL_PUB])
    r = run_cli("verify", tiny_model, "--policy", policy)
    assert r.returncode == 0, r.stderr
    # The key file still holds exactly one key: a second block after the text is refused.
    two = tmp_path / "two.pub.pem"
    two.write_bytes(CERTTOOL_PUB.read_bytes() + CERTTOOL_PUB.read_bytes())
    r = run_cli("verify", tiny_model, "--trusted-key", two)
    assert r.returncode == 1 and f"{two}: holds 2 PEM blocks" in r.stderr, r.stderr


@pytest.mark.parametrize("alg", ["ecdsa-p256", "sm2", "ml-dsa-65"])
def test_whitespace_around_the_block_is_accepted(key_dir: Path, tmp_path: Path, alg: str) -> None:
    pem = (key_dir / f"{alg}.pub.pem").read_bytes()
    path = tmp_path / "spaced.pub.pem"
    path.write_bytes(b"\n \r\n" + pem.replace(b"\n", b"\r\n") + b"\n\n\t")
    assert load_trusted_key_file(path).pem == load_trusted_key_file(key_dir / f"{alg}.pub.pem").pem


def test_a_private_key_file_keeps_its_own_reason(key_dir: Path) -> None:
    with pytest.raises(KeyMaterialError, match="is a private key"):
        load_trusted_key_file(key_dir / "ecdsa-p256.key.pem")
