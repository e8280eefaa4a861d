"""RFC 3161 timestamps beyond `sign`: attestation bundles are held to key windows and TSAs as weights bundles
are, and `release --timestamp-url` timestamps every bundle it writes (a real TSA: `openssl ts -reply`
behind a loopback server, the `tsa` fixture of test_rfc3161.py).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.attestations import verify_attestations
from tests.conftest import run_cli
from tests.integration._lenet_release import ENV, release_inputs
from tests.integration.test_rfc3161 import _gen_time, _policy_file, pytestmark, tsa

__all__ = ["pytestmark", "tsa"]  # the TSA fixture and its skip marker (no openssl CLI) come with it


def _after(when: dt.datetime) -> None:
    while dt.datetime.now(dt.UTC) <= when + dt.timedelta(milliseconds=50):
        time.sleep(0.05)


def test_attestation_bundles_are_held_to_windows_and_timestamps(
    tiny_model: Path, key_dir: Path, tsa: tuple[str, Path], tmp_path: Path
) -> None:
    """`verify_attestations` (the attestation path of verify, the webhook, the service) checks the time."""
    url, root = tsa
    key, pub = key_dir / "ecdsa-p256.key.pem", key_dir / "ecdsa-p256.pub.pem"
    r = run_cli("sign", tiny_model, "--signing-key", key, "--timestamp-url", url, "--json")
    assert r.returncode == 0, r.stderr
    root_digest = json.loads(r.stdout)["rootDigest"].removeprefix("sha256:")
    stamped = (tiny_model / "model.sig").read_bytes()
    when = _gen_time(tiny_model / "model.sig")
    _after(when)
    untimed = sign_model(
        tiny_model, [load_private_key_file(key)], signature_paths={0: tmp_path / "plain.sig"}
    )
    assert untimed.root_digest == root_digest
    plain = (tmp_path / "plain.sig").read_bytes()
    tsas = [{"name": "tsa", "certChain": [str(root)]}]

    def verdict(bundle: bytes, **entry: object) -> tuple[bool, str]:
        policy = PolicySet.from_file(_policy_file(tmp_path, pub, **entry)).policies[0]
        v = verify_attestations(root_digest, [bundle], policy)
        return v.ok, "; ".join(v.ignored)

    # The key was rotated at `when`: the timestamp keeps the signature valid after it.
    assert verdict(stamped, validUntil=when, timestampAuthorities=tsas, requireTimestamp=True) == (True, "")
    # Without a TSA to believe the timestamp, the verification time decides: after validUntil, ignored.
    ok, why = verdict(stamped, validUntil=when)
    assert not ok and "after key 'ecdsa-p256.pub.pem' validUntil" in why
    # Timestamped after the key's validUntil: ignored.
    ok, why = verdict(stamped, validUntil=when - dt.timedelta(seconds=1), timestampAuthorities=tsas)
    assert not ok and "validUntil" in why
    # requireTimestamp: a bundle without one is ignored, the same bundle is fine without the requirement.
    ok, why = verdict(plain, timestampAuthorities=tsas, requireTimestamp=True)
    assert not ok and "the policy requires an RFC 3161 timestamp; the bundle has none" in why
    assert verdict(plain, timestampAuthorities=tsas) == (True, "")


@pytest.mark.slow
def test_release_timestamps_every_bundle(
    key_dir: Path, tsa: tuple[str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url, root = tsa
    release_inputs(tmp_path_factory, tmp_path)  # the real LeNet5, 20 real digits: the gate is not under test
    out = tmp_path / "released"
    r = run_cli(
        "release", tmp_path / "advtrained", "--out", out, "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--watermark-key", tmp_path / "wm.key", "-m", "release-1", "--gate-config", tmp_path / "gate.yaml",
        "--timestamp-url", url, "--json", env=ENV,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    bundles = ("model.sig", "model.watermark.sig", "model.gate.sig")
    latest = max(_gen_time(out / name) for name in bundles)
    _after(latest)
    # The key's window closed at the last timestamp; a policy requiring a trusted timestamp on every
    # signature, the gate and the watermark accepts the release.
    policy = _policy_file(
        tmp_path, key_dir / "ecdsa-p256.pub.pem", validUntil=latest, requireTimestamp=True,
        timestampAuthorities=[{"name": "tsa", "certChain": [str(root)]}],
        attestations={
            "robustness": {"minEps": 0.3, "minRobustAccuracy": 0.5}, "watermark": {"required": True}
        },
    )  # fmt: skip
    r = run_cli("verify", out, "--policy", policy)
    assert r.returncode == 0, r.stderr
    # The same window without the TSA: the verification time is after validUntil, so it is refused.
    r = run_cli(
        "verify", out, "--policy", _policy_file(tmp_path, key_dir / "ecdsa-p256.pub.pem", validUntil=latest)
    )
    assert r.returncode == 1 and "validUntil" in r.stderr
