"""ECDSA edge cases from the corpus (SIG01 psychic zero, SIG02 r/s out of range) at the unit level."""

from __future__ import annotations

import pytest

from modelsec.errors import SignatureError
from modelsec.signer import load_trusted_key_file
from modelsec.signer.der import decode_signature, encode_signature
from tests.conftest import CORPUS

SIG01 = CORPUS / "SIG01-ecdsa-psychic-zero"
SIG02 = CORPUS / "SIG02-ecdsa-r-s-out-of-range"
pytestmark = pytest.mark.skipif(not SIG02.is_dir(), reason="corpus not present")


@pytest.mark.parametrize("curve", ["p256", "p384"])
def test_psychic_zero_rejected(curve: str) -> None:
    key = load_trusted_key_file(SIG01 / f"trust/trusted-{curve}.pub.pem")
    msg = (SIG01 / "message.pae.bin").read_bytes()
    for sig in [(SIG01 / "sig_r0_s0.der").read_bytes(), (SIG01 / f"sig_r0_s0.{curve}.raw").read_bytes()]:
        with pytest.raises(SignatureError, match="signature"):
            key.verify(sig, msg)


@pytest.mark.parametrize("curve", ["p256", "p384"])
def test_out_of_range_forms_rejected_control_accepted(curve: str) -> None:
    key = load_trusted_key_file(SIG02 / f"trust/trusted-{curve}.pub.pem")
    msg = (SIG02 / "message.pae.bin").read_bytes()
    key.verify((SIG02 / f"sig_valid.{curve}.der").read_bytes(), msg)
    forms = sorted(p for p in SIG02.glob(f"sig_*.{curve}.der") if p.name != f"sig_valid.{curve}.der")
    assert len(forms) == 7
    for p in forms:
        with pytest.raises(SignatureError):
            key.verify(p.read_bytes(), msg)


N256 = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


@pytest.mark.parametrize(
    ("der", "mentions"),
    [
        (b"\x30\x06\x02\x01\x00\x02\x01\x00", r"r is outside \[1, n-1\]"),  # r = s = 0
        (b"\x30\x07\x02\x01\x01\x02\x01\x01\x00", r"not strict DER.*ExtraData"),  # trailing inside
        (b"\x30\x06\x02\x01\x01\x02\x01\x01\x00", r"not strict DER.*ExtraData"),  # trailing outside
        (b"\x30\x07\x02\x02\x00\x01\x02\x01\x01", r"not strict DER.*DssSignature::r"),  # non-minimal INTEGER
        (b"\x30\x81\x06\x02\x01\x01\x02\x01\x01", r"not strict DER.*InvalidLength"),  # non-minimal length
        (b"\x30\x80\x02\x01\x01\x02\x01\x01\x00\x00", r"not strict DER.*InvalidLength"),  # BER indefinite
        (b"\x31\x06\x02\x01\x01\x02\x01\x01", r"not strict DER.*UnexpectedTag"),  # SET
        (b"\x30\x06\x02\x01\x81\x02\x01\x01", r"not strict DER.*DssSignature::r"),  # negative r
        (b"\x30\x06\x02\x01\x01\x02\x01\x81", r"not strict DER.*DssSignature::s"),  # negative s
    ],
)
def test_strict_der(der: bytes, mentions: str) -> None:
    with pytest.raises(SignatureError, match=mentions):
        decode_signature(der, N256)


def test_der_round_trip_and_range() -> None:
    for r, s in [(1, 1), (N256 - 1, 0x80), (0x7F, 0xFF00)]:
        assert decode_signature(encode_signature(r, s), N256) == (r, s)
    with pytest.raises(SignatureError, match=r"\[1, n-1\]"):
        decode_signature(encode_signature(N256, 1), N256)
