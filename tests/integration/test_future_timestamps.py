"""A timestamp a trusted TSA dates in the future is refused (beyond the `CLOCK_SKEW` allowance), by the
verifier and already by the signer, which also refuses one dated before it asked.

The TSA is real: `openssl ts -reply` behind a loopback server (`serve_tsa` of test_rfc3161.py) run under
faketime (libfaketime; `make test` installs it), so its clock, and so the `genTime` it signs, runs ahead of
(or behind) the signer's and the verifier's. The policy trusts that TSA: only the time is wrong. Since
`sign --timestamp-url` refuses such a token, the verifier's tests fetch it with `_unchecked_timestamp` (a
signer that checks nothing, as an attacker's or an older modelsec's) and graft it onto the bundle.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.attestations.bundle import add_timestamps, parse_bundle
from modelsec.errors import SignatureError
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.trust.timestamps import CLOCK_SKEW, request_timestamp
from tests.conftest import run_cli
from tests.integration.test_rfc3161 import (
    _gen_time,
    _make_tsa,
    _policy_file,
    _unchecked_timestamp,
    serve_tsa,
)
from tests.integration.test_rfc3161 import pytestmark as needs_openssl
from tests.integration.test_x509_timestamps import _load, _policy, _sign_and_stamp
from tests.support.pki import Pki
from tests.support.pki import write_pem as _pem

pytestmark = [
    needs_openssl,
    pytest.mark.skipif(
        shutil.which("faketime") is None,
        reason="needs faketime (libfaketime; `make test` installs it) to run a TSA whose clock is ahead",
    ),
]


@pytest.fixture(scope="module")
def ahead(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(URL of a TSA whose clock runs an hour ahead, URL of the same TSA one minute ahead, its root file)."""
    d = tmp_path_factory.mktemp("ahead") / "tsa"
    root = _make_tsa(d, "ahead")
    with (
        serve_tsa(d, clock=["faketime", "-f", "+1h"]) as hour,
        serve_tsa(d, clock=["faketime", "-f", "+60"]) as minute,
    ):
        yield hour, minute, root


def _sign_with_timestamp_from(model: Path, key: Path, url: str) -> None:
    """Sign `model` to `model.sig` with `key`, then add the TSA's unchecked timestamp over the signature."""
    sign_model(model, [load_private_key_file(key)])
    bundle = model / "model.sig"
    signature = parse_bundle(bundle.read_bytes(), source=str(bundle)).signature.sig
    token = _unchecked_timestamp(signature, url)
    bundle.write_bytes(add_timestamps(bundle.read_bytes(), [token], source=str(bundle)))


def _tsas(root: Path) -> list[dict[str, object]]:
    return [{"name": "ahead", "certChain": [str(root)]}]


def test_pinned_key_bundle_timestamped_in_the_future_is_refused(
    tiny_model: Path, key_dir: Path, ahead: tuple[str, str, Path], tmp_path: Path
) -> None:
    hour, _, root = ahead
    _sign_with_timestamp_from(tiny_model, key_dir / "ecdsa-p256.key.pem", hour)
    when = _gen_time(tiny_model / "model.sig")
    assert when > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)  # the TSA's clock really runs ahead
    policy = _policy_file(tmp_path, key_dir / "ecdsa-p256.pub.pem", timestampAuthorities=_tsas(root))
    message = (
        rf"model\.sig: rfc3161 timestamp \[0\] of TSA 'ahead' is dated {re.escape(when.isoformat())}, after"
    )
    with pytest.raises(SignatureError, match=message + ".*from the future is refused"):
        verify_model(tiny_model, PolicySet.from_file(policy).policies[0])
    r = run_cli("verify", tiny_model, "--policy", policy, "--json")
    error = json.loads(r.stdout)["error"]
    assert r.returncode == 1 and error["kind"] == "SignatureError", r.stdout + r.stderr
    assert re.search(message, error["message"]), error


def test_future_timestamp_does_not_make_a_not_yet_valid_leaf_valid(
    pki: Pki, ahead: tuple[str, str, Path], tmp_path: Path
) -> None:
    """The chain was checked at the timestamp's time: a leaf valid only from half an hour from now passed."""
    hour, _, root = ahead
    signed = _sign_and_stamp(
        tmp_path, pki, hour, stamp=_unchecked_timestamp, not_before=-dt.timedelta(minutes=30)
    )
    policy = _load(_policy(tmp_path, _pem(tmp_path / "root.pem", pki.root.cert), root))
    with pytest.raises(SignatureError, match=r"at the verification time .*not valid then: the signing"):
        verify_model(signed.use(signed.plain), policy)  # without the timestamp: not valid yet
    when = re.escape(signed.gen_time.isoformat())
    with pytest.raises(
        SignatureError, match=rf"model\.sig: rfc3161 timestamp \[0\] .* is dated {when}, after"
    ):
        verify_model(signed.use(signed.stamped), policy)


def test_timestamp_ahead_within_the_clock_skew_allowance_is_accepted(
    tiny_model: Path, key_dir: Path, ahead: tuple[str, str, Path], tmp_path: Path
) -> None:
    _, minute, root = ahead
    r = run_cli(
        "sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--timestamp-url", minute
    )
    assert r.returncode == 0, r.stderr
    when = _gen_time(tiny_model / "model.sig")
    assert dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30) < when < dt.datetime.now(dt.UTC) + CLOCK_SKEW
    policy = _policy_file(
        tmp_path, key_dir / "ecdsa-p256.pub.pem", timestampAuthorities=_tsas(root), requireTimestamp=True
    )
    r = run_cli("verify", tiny_model, "--policy", policy)
    assert r.returncode == 0, r.stderr


_ISO = r"(\d{4}-\d\d-\d\dT[\d:.]+\+00:00)"


def test_sign_refuses_a_timestamp_from_a_tsa_whose_clock_runs_ahead(
    tiny_model: Path, key_dir: Path, ahead: tuple[str, str, Path]
) -> None:
    """Not written: a verifier would refuse the bundle (or, trusting no TSA, keep a token it cannot use)."""
    hour, _, _ = ahead
    before = sorted(p.name for p in tiny_model.iterdir())
    r = run_cli(
        "sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--signing-key",
        key_dir / "sm2.key.pem", "--timestamp-url", hour, "--json",
    )  # fmt: skip
    error = json.loads(r.stdout)["error"]
    assert r.returncode == 1 and error["kind"] == "SignatureError", r.stdout + r.stderr
    found = re.match(
        rf"{re.escape(hour)}: the TSA dated the timestamp {_ISO}, more than the 0:05:00 clock-skew allowance "
        rf"after this machine's clock \({_ISO}\)",
        error["message"],
    )
    assert found, error["message"]
    dated, local = (dt.datetime.fromisoformat(t) for t in found.groups())
    assert dt.timedelta(minutes=59) < dated - local <= dt.timedelta(hours=1)
    assert sorted(p.name for p in tiny_model.iterdir()) == before  # no bundle, no temporary file


@pytest.fixture(scope="module")
def behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a TSA whose clock runs an hour behind."""
    d = tmp_path_factory.mktemp("behind") / "tsa"
    _make_tsa(d, "behind")
    with serve_tsa(d, clock=["faketime", "-f", "-1h"]) as url:
        yield url


def test_sign_refuses_a_timestamp_dated_before_it_asked(tiny_model: Path, key_dir: Path, behind: str) -> None:
    """A backdated time would place the signature inside a key window it was made after."""
    asked = dt.datetime.now(dt.UTC)
    with pytest.raises(SignatureError) as refused:
        request_timestamp(b"signature bytes", behind)
    found = re.match(
        rf"{re.escape(behind)}: the TSA dated the timestamp {_ISO}, more than the 0:05:00 clock-skew "
        rf"allowance before this machine's clock when it was asked \({_ISO}\)",
        str(refused.value),
    )
    assert found, refused.value
    dated, local = (dt.datetime.fromisoformat(t) for t in found.groups())
    assert dt.timedelta(minutes=59) < local - dated <= dt.timedelta(minutes=61)
    assert asked <= local
    r = run_cli(
        "sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--timestamp-url", behind
    )
    assert r.returncode == 1 and "before this machine's clock" in r.stderr, r.stderr
    assert not (tiny_model / "model.sig").exists()


@pytest.mark.slow
def test_release_refuses_a_timestamp_from_a_tsa_whose_clock_runs_ahead(
    key_dir: Path, ahead: tuple[str, str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.integration._lenet_release import ENV, release_inputs

    hour, _, _ = ahead
    release_inputs(tmp_path_factory, tmp_path)  # the sign stage refuses, before the gate
    r = run_cli(
        "release", tmp_path / "advtrained", "--out", tmp_path / "released",
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--watermark-key", tmp_path / "wm.key", "-m",
        "release-1",
        "--gate-config", tmp_path / "gate.yaml", "--timestamp-url", hour, env=ENV,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.startswith(
        f"modelsec: error: release stage 'sign': {hour}: the TSA dated the timestamp "
    ), r.stderr
    assert "after this machine's clock" in r.stderr
    # All or nothing: no released directory, nor a staging directory beside it.
    assert not any(p.name == "released" or ".released." in p.name for p in tmp_path.iterdir())
