"""A trusted key file holds exactly one PEM public key (user trial 2, finding 6).

PEM parsers read the first block of a file and ignore the rest, so `cat p256.pub p384.pub > two.pub` trusted
the P-256 key alone and a trailing line of garbage went unnoticed. Both are refused, naming the file;
whitespace around the block (a missing or extra final newline, CRLF) is fine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.errors import KeyMaterialError
from modelsec.signer.keys import load_trusted_key, load_trusted_key_file


def test_two_public_keys_in_one_file_are_refused(key_dir: Path, tmp_path: Path) -> None:
    two = tmp_path / "two.pub.pem"
    two.write_bytes(
        (key_dir / "ecdsa-p256.pub.pem").read_bytes() + (key_dir / "ecdsa-p384.pub.pem").read_bytes()
    )
    with pytest.raises(KeyMaterialError, match=rf"^{tmp_path}/two.pub.pem: holds 2 PEM blocks"):
        load_trusted_key_file(two)


@pytest.mark.parametrize("extra", [b"garbage\n", b"\x00", b"-----END PUBLIC KEY-----\n"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_data_outside_the_block_is_refused(key_dir: Path, tmp_path: Path, extra: bytes, where: str) -> None:
    pem = (key_dir / "ecdsa-p256.pub.pem").read_bytes()
    path = tmp_path / "trail.pub.pem"
    path.write_bytes(extra + pem if where == "before" else pem + extra)
    with pytest.raises(KeyMaterialError, match=rf"^{path}: data outside the PEM block"):
        load_trusted_key_file(path)
    with pytest.raises(KeyMaterialError, match="data outside the PEM block"):
        load_trusted_key(path.read_bytes(), name="k")


@pytest.mark.parametrize("alg", ["ecdsa-p256", "sm2", "ml-dsa-65"])
def test_whitespace_around_the_block_is_accepted(key_dir: Path, tmp_path: Path, alg: str) -> None:
    pem = (key_dir / f"{alg}.pub.pem").read_bytes()
    path = tmp_path / "spaced.pub.pem"
    path.write_bytes(b"\n \r\n" + pem.replace(b"\n", b"\r\n") + b"\n\n\t")
    assert load_trusted_key_file(path).pem == load_trusted_key_file(key_dir / f"{alg}.pub.pem").pem


def test_a_private_key_file_keeps_its_own_reason(key_dir: Path) -> None:
    with pytest.raises(KeyMaterialError, match="is a private key"):
        load_trusted_key_file(key_dir / "ecdsa-p256.key.pem")
