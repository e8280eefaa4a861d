"""An X.509 chain is checked at the time of a timestamp the policy's TSA vouches for, else now.

model_signing signs with a leaf of the `pki` of test_certificate_trust.py; a real TSA (`openssl ts -reply`
behind a loopback server, the `tsa` fixture of test_rfc3161.py) timestamps the signature. `openssl ts`
takes its time from the system clock, so the leaf that must expire (or begin) between the timestamp and the
verification is certified for the signing key after the timestamp, to expire (begin) one second after its
time, and the module waits once (2 s at most) for that second to pass.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import rfc3161_client.verify
from rfc3161_client import TimeStampResponse, decode_timestamp_response

from modelsec.attestations.bundle import add_timestamps, parse_bundle
from modelsec.errors import SignatureError
from modelsec.policy import Policy, PolicySet
from modelsec.verifier import verify_model
from modelsec.verifier.trust.timestamps import request_timestamp
from tests.conftest import run_cli
from tests.integration.test_certificate_trust import _sign, pki
from tests.integration.test_rfc3161 import _make_tsa, pytestmark, tsa
from tests.x509_support import SAN, Issued, corp_policy_doc, with_certificate_chain
from tests.x509_support import make_leaf as _leaf
from tests.x509_support import write_pem as _pem

__all__ = ["pki", "pytestmark", "tsa"]  # fixtures (and the no-openssl skip marker) shared with those modules

_CHECKED_AT = "chain checked at RFC 3161 timestamp time"


@dataclass
class Signed:
    """A model signed under a leaf, its bundle with a timestamp (`stamped`) and without (`plain`)."""

    model: Path
    stamped: bytes
    plain: bytes
    gen_time: dt.datetime

    def use(self, bundle: bytes) -> Path:
        """Make `bundle` the model's `model.sig`; returns the model directory."""
        (self.model / "model.sig").write_bytes(bundle)
        return self.model


def _sign_and_stamp(
    d: Path,
    pki: tuple[Issued, Issued],
    url: str,
    *,
    stamp: Callable[[bytes, str], bytes] = request_timestamp,
    **window: dt.timedelta,
) -> Signed:
    """Sign a model under a new leaf and timestamp the signature; then give the bundle a certificate for the
    same key whose `not_before`/`not_after` lie `window` away from the timestamp's time (the signature and
    the timestamp over it stay as they are), so the leaf's validity is placed exactly around that time."""
    root, intermediate = pki
    leaf = _leaf(intermediate)
    model = _sign(d, leaf, [intermediate.cert, root.cert])
    bundle = model / "model.sig"
    token = stamp(parse_bundle(bundle.read_bytes(), source=str(bundle)).signature.sig, url)
    gen_time = decode_timestamp_response(token).tst_info.gen_time
    bounds = {k: gen_time + v for k, v in window.items()}
    reissued = _leaf(intermediate, key=leaf.key, **bounds)  # type: ignore[arg-type]
    plain = with_certificate_chain(bundle.read_bytes(), reissued.cert, intermediate.cert, root.cert)
    stamped = add_timestamps(plain, [token], source=str(bundle))
    return Signed(model, stamped, plain, gen_time)


def _policy(d: Path, root: Path, *tsa_roots: Path) -> Path:
    """A policy file trusting the corp root for SAN, and the TSAs whose root certificates are `tsa_roots`."""
    path = d / f"policy-{len(list(d.glob('policy-*')))}.json"
    path.write_text(json.dumps(corp_policy_doc(root, tsa_roots=tsa_roots)))
    return path


def _load(policy: Path) -> Policy:
    return PolicySet.from_file(policy).policies[0]


@pytest.fixture(scope="module")
def timed(
    tmp_path_factory: pytest.TempPathFactory, pki: tuple[Issued, Issued], tsa: tuple[str, Path]
) -> tuple[Signed, Signed]:
    """(signed under a leaf that expired 1 s after its timestamp, under one valid from 1 s after it)."""
    url, _ = tsa
    d = tmp_path_factory.mktemp("timed")
    (d / "expired").mkdir()
    (d / "early").mkdir()
    second = dt.timedelta(seconds=1)
    expired = _sign_and_stamp(d / "expired", pki, url, not_after=second)
    early = _sign_and_stamp(d / "early", pki, url, not_before=second)
    # Certificate times are whole seconds, and so is the time the chain is checked at: wait for the second
    # after the edge. genTime is in whole seconds and not after now: this waits at most about 2 s.
    while dt.datetime.now(dt.UTC) < max(expired.gen_time, early.gen_time) + 2 * second + second / 20:
        time.sleep(0.05)
    return expired, early


@pytest.fixture
def roots(tmp_path: Path, pki: tuple[Issued, Issued], tsa: tuple[str, Path]) -> tuple[Path, Path]:
    """(the corp root's PEM file, the trusted TSA's root PEM file)."""
    return _pem(tmp_path / "root.pem", pki[0].cert), tsa[1]


def test_expired_leaf_verifies_at_a_trusted_timestamp(
    timed: tuple[Signed, Signed], roots: tuple[Path, Path], tmp_path: Path
) -> None:
    signed, _ = timed
    model, policy = signed.use(signed.stamped), _policy(tmp_path, *roots)
    when = signed.gen_time.isoformat()
    key = verify_model(model, _load(policy)).bundles[0].key
    assert key.name == f"corp-ca: {SAN} ({_CHECKED_AT} {when})"
    r = run_cli("verify", model, "--policy", policy, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["bundles"][0]["key"] == f"corp-ca: {SAN} ({_CHECKED_AT} {when})"
    r = run_cli("verify", model, "--policy", policy)
    assert r.returncode == 0 and f"{_CHECKED_AT} {when}" in r.stdout, r.stdout + r.stderr


def test_expired_leaf_with_a_timestamp_no_configured_tsa_vouches_for_is_refused(
    timed: tuple[Signed, Signed], roots: tuple[Path, Path], tmp_path: Path
) -> None:
    signed, _ = timed
    model = signed.use(signed.stamped)
    corp_root, _ = roots
    # The TSA is not in the policy (another one is, or none): its time is not believed; now decides.
    other = _make_tsa(tmp_path / "other-tsa", "other")
    for policy in (_policy(tmp_path, corp_root, other), _policy(tmp_path, corp_root)):
        with pytest.raises(SignatureError, match=r"at the verification time .*not valid then: the signing"):
            verify_model(model, _load(policy))
    r = run_cli("verify", model, "--policy", policy, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["kind"] == "SignatureError"


def test_expired_leaf_without_a_timestamp_is_refused(
    timed: tuple[Signed, Signed], roots: tuple[Path, Path], tmp_path: Path
) -> None:
    signed, _ = timed
    with pytest.raises(SignatureError, match=r"does not verify to a configured root.*not valid at"):
        verify_model(signed.use(signed.plain), _load(_policy(tmp_path, *roots)))


def test_leaf_not_yet_valid_at_the_timestamp_is_refused(
    timed: tuple[Signed, Signed], roots: tuple[Path, Path], tmp_path: Path
) -> None:
    _, signed = timed
    policy = _load(_policy(tmp_path, *roots))
    verify_model(signed.use(signed.plain), policy)  # valid now: without the timestamp, accepted
    when = re.escape(signed.gen_time.isoformat())
    with pytest.raises(SignatureError, match=rf"at the RFC 3161 timestamp's time {when}: .*not valid then"):
        verify_model(signed.use(signed.stamped), policy)


def test_timestamp_after_the_leaf_expired_is_refused_naming_its_time(
    pki: tuple[Issued, Issued], tsa: tuple[str, Path], roots: tuple[Path, Path], tmp_path: Path
) -> None:
    signed = _sign_and_stamp(tmp_path, pki, tsa[0], not_after=-dt.timedelta(minutes=1))
    policy = _policy(tmp_path, *roots)
    when = re.escape(signed.gen_time.isoformat())
    message = (
        rf"at the RFC 3161 timestamp's time {when}: .*not valid then: the signing certificate CN=release"
    )
    with pytest.raises(SignatureError, match=message):
        verify_model(signed.use(signed.stamped), _load(policy))
    r = run_cli("verify", signed.model, "--policy", policy, "--json")
    assert r.returncode == 1 and f"timestamp's time {signed.gen_time.isoformat()}" in r.stdout


def test_every_trusted_timestamp_must_fall_inside_the_chain_validity(
    timed: tuple[Signed, Signed], roots: tuple[Path, Path], tsa: tuple[str, Path], tmp_path: Path
) -> None:
    signed, _ = timed
    bundle = signed.use(signed.stamped) / "model.sig"
    late = request_timestamp(parse_bundle(signed.plain, source="b").signature.sig, tsa[0])
    bundle.write_bytes(add_timestamps(signed.stamped, [late], source=str(bundle)))
    late_time = re.escape(decode_timestamp_response(late).tst_info.gen_time.isoformat())
    with pytest.raises(SignatureError, match=rf"at the RFC 3161 timestamp's time {late_time}: "):
        verify_model(signed.model, _load(_policy(tmp_path, *roots)))


def test_each_timestamp_is_verified_once_per_bundle(
    pki: tuple[Issued, Issued],
    tsa: tuple[str, Path],
    roots: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chain check and the signature-time check share one verification of the token (rfc3161-client's,
    observed, not replaced)."""
    signed = _sign_and_stamp(tmp_path, pki, tsa[0])
    verified: list[int] = []
    real = rfc3161_client.verify._Verifier.verify_message

    def observed(self: rfc3161_client.verify._Verifier, response: TimeStampResponse, message: bytes) -> bool:
        verified.append(response.tst_info.serial_number)
        return real(self, response, message)

    monkeypatch.setattr(rfc3161_client.verify._Verifier, "verify_message", observed)
    key = verify_model(signed.use(signed.stamped), _load(_policy(tmp_path, *roots))).bundles[0].key
    assert key.name.endswith(f"({_CHECKED_AT} {signed.gen_time.isoformat()})")
    assert len(verified) == 1, verified
