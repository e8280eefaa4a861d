"""Operator files (policy, server and gate configuration, keys, certificates) that are not regular files are
refused at once, never read: a FIFO used to block `open()` forever (user trial, finding 4), which hung every
Python process started with `$MODELSEC_POLICY` pointing at it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from modelsec.errors import Error, KeyMaterialError, PolicyError
from modelsec.policy import PolicySet
from modelsec.policy.trust import read_pem_certificates
from modelsec.release import load_gate_spec
from modelsec.service.config import load_server_config
from modelsec.signer.keys import load_trusted_key_file


def _load_tsa(path: Path) -> object:
    timestamps = pytest.importorskip("modelsec.verifier.trust.timestamps")
    return timestamps.load_timestamp_authority(path)


READERS: list[tuple[str, Callable[[Path], object], type[Error], str]] = [
    ("policy", PolicySet.from_file, PolicyError, "policy file"),
    ("server", load_server_config, PolicyError, "server configuration"),
    ("gate", load_gate_spec, PolicyError, "gate configuration"),
    ("trusted-key", load_trusted_key_file, KeyMaterialError, "key file"),
    ("certificates", lambda p: read_pem_certificates(p, "trust.x509"), PolicyError, "certificate file"),
    ("tsa", _load_tsa, KeyMaterialError, "TSA certificate file"),
]


@pytest.fixture
def deadline() -> Iterator[None]:
    """Turn a hang into a failure: old code blocked in open() on a FIFO until a writer came."""

    def expire(_sig: int, _frame: FrameType | None) -> None:
        raise TimeoutError("blocked on a non-regular file")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(("reader", "error", "what"), [r[1:] for r in READERS], ids=[r[0] for r in READERS])
def test_a_fifo_is_refused_without_blocking(
    tmp_path: Path, deadline: None, reader: Callable[[Path], object], error: type[Error], what: str
) -> None:
    fifo = tmp_path / "file.yaml"
    os.mkfifo(fifo)
    with pytest.raises(error, match=f"{fifo}: the {what} is not a regular file \\(a FIFO or pipe\\)"):
        reader(fifo)


@pytest.mark.parametrize(("reader", "error", "what"), [r[1:] for r in READERS], ids=[r[0] for r in READERS])
def test_a_device_and_a_directory_are_refused(
    tmp_path: Path, deadline: None, reader: Callable[[Path], object], error: type[Error], what: str
) -> None:
    with pytest.raises(error, match=f"/dev/zero: the {what} is not a regular file \\(a character device\\)"):
        reader(Path("/dev/zero"))
    with pytest.raises(error, match=f"{tmp_path}: the {what} is not a regular file \\(a directory\\)"):
        reader(tmp_path)


def test_a_key_symlink_is_refused_but_a_policy_symlink_is_followed(tmp_path: Path, key_dir: Path) -> None:
    """Keys never follow a link (as before); policy files do (a Kubernetes ConfigMap mount is links)."""
    link = tmp_path / "k.pub.pem"
    link.symlink_to(key_dir / "ecdsa-p256.pub.pem")
    with pytest.raises(KeyMaterialError, match=f"{link}: the key file is a symlink; refused"):
        load_trusted_key_file(link)
    policy = tmp_path / "p.yaml"
    policy.symlink_to(tmp_path / "missing.yaml")
    with pytest.raises(PolicyError, match=f"{policy}: cannot read the policy file: No such file"):
        PolicySet.from_file(policy)
