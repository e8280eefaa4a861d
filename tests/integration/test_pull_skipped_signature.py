"""`pull` with one of two signers' keys says that it skipped the other signer's bundle, and why (issue 31).

The model is signed with ECDSA P-256 and SM2 and pushed; a pull that trusts only the P-256 key places only
the bundle that key verified (referrers never veto, and an unverified bundle is not placed). Before, the
pulled folder lost `model.sm2.sig` with one note per referrer in a verifier's wording; now one line says a
signature was skipped, why and that it is not in the destination, `--verbose` lists each referrer, and the
JSON reply lists it with its kind and reason. Real registry (`registry`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_tiny_model
from tests.support.oci import Registry

pytestmark = pytest.mark.integration


@pytest.fixture
def cosigned(cli, tmp_path: Path, key_dir: Path, registry: Registry) -> str:  # type: ignore[no-untyped-def]
    model = write_tiny_model(tmp_path / "model", seed=3132)
    keys = ("--signing-key", key_dir / "ecdsa-p256.key.pem", "--signing-key", key_dir / "sm2.key.pem")
    assert cli("sign", model, *keys).returncode == 0
    reference = f"oci://{registry.address}/pull-skipped/model:v1"
    pushed = cli(
        "push", model, reference, "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key", key_dir / "sm2.pub.pem",
        env=registry.env(),
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    return reference


def test_pull_with_one_key_says_the_other_signature_was_skipped(  # type: ignore[no-untyped-def]
    cli, cosigned: str, tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    trust = ("--trusted-key", key_dir / "ecdsa-p256.pub.pem")
    pulled = cli("pull", cosigned, tmp_path / "p256", *trust, env=registry.env())
    assert pulled.returncode == 0, pulled.stderr
    assert sorted(p.name for p in (tmp_path / "p256").glob("model*.sig")) == ["model.sig"]
    notes = [line for line in pulled.stderr.splitlines() if "skipped" in line]
    assert len(notes) == 1  # one line, whatever the number of referrers
    assert "1 signature signed by a key not trusted here" in notes[0]
    assert f"not in {tmp_path / 'p256'}" in notes[0] and "--verbose" in notes[0]
    assert "sha256:" not in notes[0]  # the referrers' digests are the detail

    verbose = cli("-v", "pull", cosigned, tmp_path / "verbose", *trust, env=registry.env())
    assert verbose.returncode == 0
    details = [
        line.strip() for line in verbose.stderr.splitlines() if line.strip().startswith("skipped oci://")
    ]
    assert len(details) == 1 and "signed by a key not trusted here" in details[0]

    reply = json.loads(cli("pull", cosigned, tmp_path / "json", *trust, "--json", env=registry.env()).stdout)
    assert reply["ok"] is True
    (skipped,) = reply["skipped"]
    assert skipped["kind"] == "signature" and skipped["reason"] == "untrusted-key"
    assert skipped["referrer"].startswith(cosigned.rsplit(":", 1)[0] + "@sha256:")
    assert reply["ignored"] == [skipped["detail"]]


def test_pull_with_both_keys_skips_nothing(  # type: ignore[no-untyped-def]
    cli, cosigned: str, tmp_path: Path, key_dir: Path, registry: Registry
) -> None:
    trust = ("--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key", key_dir / "sm2.pub.pem")
    reply = json.loads(cli("pull", cosigned, tmp_path / "both", *trust, "--json", env=registry.env()).stdout)
    assert reply["ok"] is True and reply["skipped"] == []
    assert sorted(p.name for p in (tmp_path / "both").glob("model*.sig")) == ["model.sig", "model.sm2.sig"]
