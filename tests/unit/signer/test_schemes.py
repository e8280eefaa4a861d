"""The signature-scheme registry, key dispatch by algorithm identifier, and key sources."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.attestations.bundle import Bundle, parse_bundle, sign_payload
from modelsec.errors import KeyMaterialError, SignatureError, UnsupportedAlgorithmError
from modelsec.signer.keys import (
    PemFileKeySource,
    generate_private_key_pem,
    key_source,
    load_private_key,
    load_trusted_key,
)
from modelsec.signer.layout import SIGNATURE_FILE_NAMES
from modelsec.signer.schemes import all_schemes, scheme_for, scheme_for_bundle_name
from modelsec.signer.schemes.sm2 import _asn1 as _sm2_asn1
from modelsec.verifier.trust.bundles import has_key_for_bundle


def test_every_spelling_has_exactly_one_scheme() -> None:
    assert [s.algorithm for s in all_schemes()] == list(SignatureAlgorithm)
    for scheme in all_schemes():
        assert scheme_for(scheme.algorithm) is scheme
        assert scheme_for(scheme.algorithm.value) is scheme
        assert scheme.manifest_hash in scheme.signable_hashes
    with pytest.raises(UnsupportedAlgorithmError, match="slh-dsa-sha2-128s"):
        scheme_for("slh-dsa-sha2-128s")


def test_signed_ignore_list_is_unchanged() -> None:
    # Recorded in every manifest's ignore_paths: a change here changes every signed manifest.
    assert SIGNATURE_FILE_NAMES == (
        "model.sig",
        "model.p384.sig",
        "model.sm2.sig",
        "model.ml-dsa-44.sig",
        "model.ml-dsa-65.sig",
        "model.ml-dsa-87.sig",
    )
    assert {s.manifest_hash for s in all_schemes()} == {HashAlgorithm.SHA256, HashAlgorithm.SM3}


@pytest.fixture
def fast_kdf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sm2_asn1, "PBKDF2_ITERATIONS", 1000)


@pytest.mark.usefixtures("fast_kdf")
@pytest.mark.parametrize("algorithm", list(SignatureAlgorithm))
@pytest.mark.parametrize("password", [None, b"pw"])
def test_each_scheme_round_trips_through_the_dispatch(
    algorithm: SignatureAlgorithm, password: bytes | None
) -> None:
    private, public = generate_private_key_pem(algorithm, password=password)
    signer = load_private_key(private, name="k", password=password)
    trusted = load_trusted_key(public, name="k.pub")
    assert signer.algorithm is algorithm and trusted.algorithm is algorithm
    assert load_trusted_key(signer.public_key_pem(), name="again").keyid == trusted.keyid
    signature = signer.sign(b"message")
    trusted.verify(signature, b"message")
    with pytest.raises(SignatureError):
        trusted.verify(signature, b"messagE")
    other = load_trusted_key(generate_private_key_pem(algorithm)[1], name="other")
    with pytest.raises(SignatureError):
        other.verify(signature, b"message")


def test_unsupported_keys_are_named() -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    p521 = ec.generate_private_key(ec.SECP521R1())
    pkcs8 = (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    spki = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(UnsupportedAlgorithmError, match="RSAPrivateKey keys are not supported"):
        load_private_key(rsa_key.private_bytes(*pkcs8), name="k")
    with pytest.raises(UnsupportedAlgorithmError, match="RSAPublicKey keys are not supported"):
        load_trusted_key(rsa_key.public_key().public_bytes(*spki), name="k")
    with pytest.raises(UnsupportedAlgorithmError, match="secp521r1 is not supported"):
        load_private_key(p521.private_bytes(*pkcs8), name="k")
    with pytest.raises(UnsupportedAlgorithmError, match="secp521r1 is not supported"):
        load_trusted_key(p521.public_key().public_bytes(*spki), name="k")
    encrypted = rsa_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    with pytest.raises(UnsupportedAlgorithmError, match="RSAPrivateKey keys are not supported"):
        load_private_key(encrypted, name="k", password=b"pw")


def test_wrong_password_stops_at_the_first_scheme() -> None:
    private, _ = generate_private_key_pem(SignatureAlgorithm.ECDSA_P384, password=b"right")
    with pytest.raises(KeyMaterialError, match="wrong password"):
        load_private_key(private, name="k", password=b"wrong")
    with pytest.raises(KeyMaterialError, match="no password was given"):
        load_private_key(private, name="k")


def test_name_and_signature_decide_which_default_bundles_a_policy_could_verify(tmp_path: Path) -> None:
    def bundle_by(alg: SignatureAlgorithm) -> Bundle:
        key = load_private_key(generate_private_key_pem(alg)[0], name=alg.value)
        return parse_bundle(sign_payload(b"{}", key), source=alg.value)

    p256, p384 = (
        load_trusted_key(generate_private_key_pem(a)[1], name=a.value)
        for a in (SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.ECDSA_P384)
    )
    by_p256, by_p384 = bundle_by(SignatureAlgorithm.ECDSA_P256), bundle_by(SignatureAlgorithm.ECDSA_P384)
    # model.sig holds any ECDSA curve: a family key could, unless the signature's width rules it out.
    assert has_key_for_bundle(tmp_path / "model.sig", by_p384, [p384])
    assert has_key_for_bundle(tmp_path / "model.sig", by_p256, [p256])
    assert not has_key_for_bundle(tmp_path / "model.sig", by_p256, [p384])
    assert not has_key_for_bundle(tmp_path / "model.sig", by_p384, [p256])
    # The other default names fix one algorithm, whatever the bytes say.
    assert has_key_for_bundle(tmp_path / "model.p384.sig", by_p256, [p384])
    assert not has_key_for_bundle(tmp_path / "model.p384.sig", by_p384, [p256])
    assert not has_key_for_bundle(tmp_path / "model.sm2.sig", by_p256, [p384])
    assert has_key_for_bundle(tmp_path / "model.unknown.sig", by_p256, [p384])  # never skipped silently
    assert scheme_for_bundle_name("model.sm2.sig") is scheme_for(SignatureAlgorithm.SM2)


def test_key_source_is_chosen_by_the_reference(tmp_path: Path) -> None:
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (tmp_path / "k.pem").write_bytes(private)
    source = key_source(tmp_path / "k.pem")
    assert source == PemFileKeySource(tmp_path / "k.pem") and source.reference == str(tmp_path / "k.pem")
    assert source.open().public_key_pem() == load_trusted_key(public, name="p").pem
    assert key_source("pkcs11:token=ci;object=k?module-path=/m.so").reference == "pkcs11:token=ci;object=k"
    with pytest.raises(KeyMaterialError, match=r"module-path=/path/to/pkcs11-module\.so is required"):
        key_source("pkcs11:token=ci;object=release-key")  # a token key (modelsec.signer.pkcs11), not a path
    with pytest.raises(KeyMaterialError, match="cannot read the key file"):
        key_source(tmp_path / "missing.pem").open()
