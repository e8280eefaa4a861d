"""Third-party known-answer vectors for SM3 and SM2 (provenance: tests/vectors/README.md, section SM2/SM3)."""

from __future__ import annotations

import hashlib

import pytest

from modelsec.signer.der import encode_signature
from modelsec.signer.schemes.sm2 import _core as _sm2_core
from modelsec.signer.schemes.sm2 import _gmssl as _sm2_gmssl
from modelsec.signer.schemes.sm2 import api as sm2
from modelsec.signer.schemes.sm2.api import Sm2PrivateKey, Sm2PublicKey
from tests.conftest import CORPUS

# --- GB/T 32905-2016 (SM3) annex A --------------------------------------------------------------------------

SM3_VECTORS = [
    (b"abc", "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0"),  # A.1
    (b"abcd" * 16, "debe9ff92275b8a138604889c18e5a4d6fdb70e5387e5765293dcba39c0c5732"),  # A.2
]


@pytest.mark.parametrize(("message", "digest"), SM3_VECTORS)
def test_sm3_hashlib(message: bytes, digest: str) -> None:
    assert hashlib.new("sm3", message).hexdigest() == digest


@pytest.mark.parametrize(("message", "digest"), SM3_VECTORS)
def test_sm3_cryptography_fallback(message: bytes, digest: str) -> None:
    from cryptography.hazmat.primitives import hashes

    h = hashes.Hash(hashes.SM3())
    h.update(message)
    assert h.finalize().hex() == digest


@pytest.mark.parametrize(("message", "digest"), SM3_VECTORS)
def test_sm3_module_helper(message: bytes, digest: str) -> None:
    assert _sm2_core._sm3(message).hex() == digest


# --- GB/T 32918.5-2017 annex A: SM2 signature on the recommended curve ------------------------------------

G5_D = 0x3945208F7B2144B13F36E38AC6D39F95889393692860B51A42FB81EF4DF7C5B8
G5_X = 0x09F9DF311E5421A150DD7D161E4BC5C672179FAD1833FC076BB08FF356F35020
G5_Y = 0xCCEA490CE26775A52DC6EA718CC1AA600AED05FBF35E084A6632F6072DA9AD13
G5_ID = b"1234567812345678"
G5_M = b"message digest"
G5_ZA = "b2e14c5c79c6df5b85f4fe7ed8db7a262b9da7e07ccb0ea9f4747b8ccda8a4f3"
G5_E = "f0b43e94ba45accaace692ed534382eb17e6ab5a19ce7b31f4486fdfc0d28640"
G5_K = 0x59276E27D506861A16680F3AD9C02DCCEF3CC1FA3CDBE4CE6D54B80DEAC1BC21
G5_R = 0xF5A03B0648D2C4630EEAC513E1BB81A15944DA3827D5B74143AC7EACEEE720B3
G5_S = 0xB1B6AA29DF212FD8763182BC0D421CA1BB9038FD1F7F42D4840B69C485BBC1AA


def test_gbt32918_5_public_key_derivation() -> None:
    assert Sm2PrivateKey(G5_D).public_key == Sm2PublicKey(G5_X, G5_Y)


def test_gbt32918_5_za_and_e() -> None:
    public = Sm2PublicKey(G5_X, G5_Y)
    assert sm2.compute_za(public, G5_ID).hex() == G5_ZA
    assert sm2.compute_digest(public, G5_M, G5_ID).hex() == G5_E


@pytest.mark.parametrize("name", ["openssl", "gmssl"])
def test_gbt32918_5_known_answer_verifies(name: str) -> None:
    backend = sm2.backend_by_name(name)
    public = Sm2PublicKey(G5_X, G5_Y)
    backend.verify(public, G5_M, encode_signature(G5_R, G5_S), G5_ID)


def test_gbt32918_5_annex_nonce_reproduces_signature() -> None:
    digest = bytes.fromhex(G5_E)
    assert _sm2_gmssl._sign_digest(G5_D, digest, G5_K) == (G5_R, G5_S)
    assert _sm2_gmssl._verify_digest(G5_X, G5_Y, digest, G5_R, G5_S)


@pytest.mark.skipif(not (CORPUS / "SIG05-sm2-r-s-out-of-range").is_dir(), reason="corpus not found")
def test_corpus_key_is_the_gbt32918_5_key() -> None:
    trust = CORPUS / "SIG05-sm2-r-s-out-of-range" / "trust"
    assert Sm2PublicKey.from_pem((trust / "sm2.pub.pem").read_bytes()) == Sm2PublicKey(G5_X, G5_Y)


# --- GB/T 32918.2-2016 annex A (= GM/T 0003.2-2012 annex A): the 256-bit example curve, ID ALICE123@YAHOO.COM
# This curve is not the SM2 curve, so only the curve-parameterised internals can run it.

G2_CURVE = _sm2_core._Curve(
    p=0x8542D69E4C044F18E8B92435BF6FF7DE457283915C45517D722EDB8B08F1DFC3,
    a=0x787968B4FA32C3FD2417842E73BBFEFF2F3C848B6831D7E0EC65228B3937E498,
    b=0x63E4C6D3B23B0C849CF84241484BFE48F61D59A5B16BA06E6E12D1DA27C5249A,
    gx=0x421DEBD61B62EAB6746434EBC3CC315E32220B3BADD50BDC4C4E6C147FEDD43D,
    gy=0x0680512BCBB42C07D47349D2153B70C4E5D7FDFCBFA36EA1A85841B9E46E09A2,
    n=0x8542D69E4C044F18E8B92435BF6FF7DD297720630485628D5AE74EE7C32E79B7,
)
G2_ID = b"ALICE123@YAHOO.COM"
G2_M = b"message digest"
G2_D = 0x128B2FA8BD433C6C068C8D803DFF79792A519A55171B1B650C23661D15897263
G2_X = 0x0AE4C7798AA0F119471BEE11825BE46202BB79E2A5844495E97C04FF4DF2548A
G2_Y = 0x7C0240F88F1CD4E16352A73C17B7F16F07353E53A176D684A9FE0C6BB798E857
G2_ZA = "f4a38489e32b45b6f876e3ac2168ca392362dc8f23459c1d1146fc3dbfb7bc9a"
G2_E = "b524f552cd82b8b028476e005c377fb19a87e6fc682d48bb5d42e3d9b9effe76"
G2_K = 0x6CB28D99385C175C94F94E934817663FC176D925DD72B727260DBAAE1FB2F96F
G2_R = 0x40F1EC59F793D9F49E09DCEF49130D4194F79FB1EED2CAA55BACDB49C4E755D1
G2_S = 0x6FC6DAC32C5D5CF10C77DFB20F7C2EB667A457872FB09EC56327A67EC7DEEBE7


def test_gbt32918_2_example_curve() -> None:
    assert _sm2_core._on_curve(G2_CURVE.gx, G2_CURVE.gy, G2_CURVE)
    assert _sm2_core._scalar_mult(G2_D, G2_CURVE.gx, G2_CURVE.gy, G2_CURVE) == (G2_X, G2_Y)
    za = _sm2_core._za(G2_ID, G2_X, G2_Y, G2_CURVE)
    assert za.hex() == G2_ZA
    digest = _sm2_core._sm3(za + G2_M)
    assert digest.hex() == G2_E
    assert _sm2_gmssl._sign_digest(G2_D, digest, G2_K, G2_CURVE) == (G2_R, G2_S)
    assert _sm2_gmssl._verify_digest(G2_X, G2_Y, digest, G2_R, G2_S, G2_CURVE)
    assert not _sm2_gmssl._verify_digest(G2_X, G2_Y, digest, G2_R, G2_S ^ 1, G2_CURVE)
