"""A malformed ECDSA signature is described by the key checking it, not by its integers' width (issue 27, 8).

An ECDSA signature whose s (or r) is out of range was called "an ecdsa-p384 signature" because one of its
integers had more than 256 bits, and `model.sig` holding it was then skipped as "no configured key of its
algorithm". A signature counts as another scheme's only when that scheme's strict decoding accepts it (DER,
r and s in [1, n-1] of its curve, both of its width): none of these does, so the P-256 key that checks it
names itself and its reason, and the bundle is refused rather than skipped.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from modelsec.signer.schemes.ecdsa import ECDSA_P256, ECDSA_P384
from tests.conftest import run_cli

N256, N384 = ECDSA_P256.order, ECDSA_P384.order


def _set_signature(bundle: Path, make: Callable[[int, int], tuple[int, int]]) -> None:
    doc = json.loads(bundle.read_text())
    entry = doc["dsseEnvelope"]["signatures"][0]
    r, s = decode_dss_signature(base64.b64decode(entry["sig"]))
    new_r, new_s = make(r, s)
    entry["sig"] = base64.b64encode(encode_dss_signature(new_r, new_s)).decode()
    bundle.write_text(json.dumps(doc))


CASES: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "s=n": lambda r, s: (r, N256),
    "s=n+2^256": lambda r, s: (r, N256 + 2**256),  # 257 bits: was read as a P-384 signature
    "s=2^300": lambda r, s: (r, 2**300),
    "r=0": lambda r, s: (0, s),
    "r=0,s=2^383": lambda r, s: (0, 2**383),
    "r=1,s=n384": lambda r, s: (1, N384),  # out of range for every curve
    "r=2^300,s": lambda r, s: (2**300, s),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("explicit", [False, True], ids=["default-bundle", "explicit-bundle"])
def test_out_of_range_signature_is_described_by_the_p256_key(
    tiny_model: Path, key_dir: Path, case: str, explicit: bool
) -> None:
    assert run_cli("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "-q").returncode == 0
    _set_signature(tiny_model / "model.sig", CASES[case])
    bundle_args = ["-s", tiny_model / "model.sig"] if explicit else []
    r = run_cli(
        "verify", tiny_model, *bundle_args, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json"
    )
    assert r.returncode == 1, r.stdout
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "SignatureError"
    message = error["message"]
    described = "ecdsa-p256.pub.pem: invalid signature: an ecdsa-p256 key cannot have made this signature ("
    assert described in message
    assert "outside [1, n-1]" in message
    assert "p384" not in message and "it has the form of" not in message
    assert "not checked" not in message  # refused by the key that checks it, not skipped as another's
