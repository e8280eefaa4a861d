"""ML-DSA (FIPS 204) end to end: model signing and verification, hybrid requirements, key formats, and the
bundle shape of model_signing's (unreleased) ML-DSA support, checked against its reference implementation
`dilithium-py` (the library model_signing's `_signing/sign_ml_dsa.py` signs and verifies with)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from dilithium_py.ml_dsa import ML_DSA_44, ML_DSA_65

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations.dsse import PAYLOAD_TYPE_IN_TOTO, Envelope
from modelsec.errors import DigestMismatchError, KeyMaterialError, SignatureError
from modelsec.policy import Policy
from modelsec.signer import load_private_key, load_private_key_file, load_trusted_key, sign_model
from modelsec.signer.keys import load_trusted_key_file
from modelsec.verifier import verify_model
from tests.support.policies import key_policy

P256, MLDSA65 = SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.ML_DSA_65


def _sign(model: Path, key_dir: Path, *algs: SignatureAlgorithm) -> None:
    sign_model(model, [load_private_key_file(key_dir / f"{a.value}.key.pem") for a in algs], force=True)


def _upstream_bundle(payload: bytes, pk: bytes, signature: bytes, variant: str = "ML_DSA_65") -> bytes:
    """A bundle exactly as model_signing's ML-DSA `Signer.sign` builds it (keyid empty, hint variant:hex)."""
    return json.dumps(
        {
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "publicKey": {"hint": f"{variant}:{hashlib.sha256(pk).hexdigest()}"},
                "tlogEntries": [],
            },
            "dsseEnvelope": {
                "payload": base64.b64encode(payload).decode(),
                "payloadType": PAYLOAD_TYPE_IN_TOTO,
                "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}],
            },
        },
        indent=2,
    ).encode()


def _payload(bundle: Path) -> bytes:
    return base64.b64decode(json.loads(bundle.read_bytes())["dsseEnvelope"]["payload"])


@pytest.mark.parametrize("algorithm", [a for a in SignatureAlgorithm if a.value.startswith("ml-dsa")])
def test_each_parameter_set_signs_and_verifies_a_model(
    tiny_model: Path, key_dir: Path, algorithm: SignatureAlgorithm
) -> None:
    _sign(tiny_model, key_dir, algorithm)
    bundle = tiny_model / f"model.{algorithm.value}.sig"
    v = verify_model(tiny_model, key_policy(key_dir, algorithm, require=[algorithm]))
    assert v.algorithms == (algorithm,) and [b.path for b in v.bundles] == [bundle]
    # Tampering with the weights or with the signature is refused.
    doc = json.loads(bundle.read_bytes())
    sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[100] ^= 1
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    bundle.write_text(json.dumps(doc))
    with pytest.raises(SignatureError, match="does not verify"):
        verify_model(tiny_model, key_policy(key_dir, algorithm))
    _sign(tiny_model, key_dir, algorithm)
    shard = next(tiny_model.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError):
        verify_model(tiny_model, key_policy(key_dir, algorithm))


def test_hybrid_policy_needs_both_ecdsa_and_ml_dsa(tmp_path: Path, key_dir: Path) -> None:
    from tests.conftest import write_tiny_model

    hybrid = key_policy(key_dir, P256, MLDSA65, require=[P256, MLDSA65])
    both = write_tiny_model(tmp_path / "both")
    _sign(both, key_dir, P256, MLDSA65)
    assert set(verify_model(both, hybrid).algorithms) == {P256, MLDSA65}
    for present, missing in ((P256, MLDSA65), (MLDSA65, P256)):
        model = write_tiny_model(tmp_path / present.value)
        _sign(model, key_dir, present)
        with pytest.raises(SignatureError, match=rf"required signature.*{missing.value}"):
            verify_model(model, hybrid)


def test_policy_file_spelling_of_the_hybrid_requirement(tmp_path: Path, key_dir: Path) -> None:
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "pq",
                "match": ["file:///**"],
                "keys": [str(key_dir / "ecdsa-p256.pub.pem"), str(key_dir / "ml-dsa-65.pub.pem")],
                "requireAlgorithms": ["ecdsa-p256", "ml-dsa-65"],
            }
        ],
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    from modelsec.policy import PolicySet

    policy = PolicySet.from_file(path).policies[0]
    assert policy.require_algorithms == frozenset({P256, MLDSA65})


def test_model_signing_bundle_shape_both_ways(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    # Ours, read as model_signing's ML-DSA verifier reads it: hint "ML_DSA_65:<sha256(raw pk)>", PAE signed.
    _sign(tiny_model, key_dir, MLDSA65)
    ours = json.loads((tiny_model / "model.ml-dsa-65.sig").read_bytes())
    trusted = load_trusted_key_file(key_dir / "ml-dsa-65.pub.pem")
    raw_pk = serialization.load_pem_public_key(trusted.pem).public_bytes_raw()  # type: ignore[union-attr]
    assert ours["verificationMaterial"] == {
        "publicKey": {"hint": f"ML_DSA_65:{hashlib.sha256(raw_pk).hexdigest()}"},
        "tlogEntries": [],
    }
    payload = base64.b64decode(ours["dsseEnvelope"]["payload"])
    pae = Envelope(payload=payload, payload_type=PAYLOAD_TYPE_IN_TOTO, signatures=()).pae()
    assert ML_DSA_65.verify(raw_pk, pae, base64.b64decode(ours["dsseEnvelope"]["signatures"][0]["sig"]))

    # Theirs: a dilithium-py key pair, the raw public-key file model_signing writes, its bundle shape.
    pk, sk = ML_DSA_65.keygen()
    (tmp_path / "upstream.pub").write_bytes(pk)
    (tiny_model / "model.ml-dsa-65.sig").write_bytes(_upstream_bundle(payload, pk, ML_DSA_65.sign(sk, pae)))
    policy = Policy.from_key_files([tmp_path / "upstream.pub"], require=[MLDSA65])
    assert verify_model(tiny_model, policy).algorithms == (MLDSA65,)
    # Refused: model_signing 0.2's non-PAE "compat" encoding, which its verifier still falls back to.
    compat = f"DSSEv1 {len(PAYLOAD_TYPE_IN_TOTO)} {PAYLOAD_TYPE_IN_TOTO} {len(payload)} {payload!r}".encode()
    (tiny_model / "model.ml-dsa-65.sig").write_bytes(
        _upstream_bundle(payload, pk, ML_DSA_65.sign(sk, compat))
    )
    with pytest.raises(SignatureError, match="does not verify"):
        verify_model(tiny_model, policy)
    # Refused: another parameter set's signature (wrong size) under an ML-DSA-65 key.
    _, sk44 = ML_DSA_44.keygen()
    (tiny_model / "model.ml-dsa-65.sig").write_bytes(_upstream_bundle(payload, pk, ML_DSA_44.sign(sk44, pae)))
    wrong_size = r"an ml-dsa-65 key cannot have made this signature \(an ml-dsa-65 signature is 3309 bytes"
    with pytest.raises(SignatureError, match=wrong_size):
        verify_model(tiny_model, policy)


def test_upstream_private_key_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    _, sk = ML_DSA_65.keygen()
    with pytest.raises(KeyMaterialError, match="expanded ML-DSA private key without its 32-byte seed"):
        load_private_key(sk, name="upstream.key")
    encrypted = b"MLDSA-ENC-V1" + bytes(16 + 12) + bytes(len(sk) + 16)  # model_signing's encrypted layout
    with pytest.raises(KeyMaterialError, match=r"MLDSA-ENC-V1.*without its 32-byte seed"):
        load_private_key(encrypted, name="upstream.key.enc")
    cryptography_vectors = pytest.importorskip("cryptography_vectors")
    noseed = (
        Path(cryptography_vectors.__file__).parent / "asymmetric/MLDSA/mldsa65_noseed_priv.der"
    ).read_bytes()
    # PKCS#8 in the expandedKey form (RFC 9881), as OpenSSL writes it with ml-dsa.output_formats=priv-only.
    armoured = b"-----BEGIN PRIVATE KEY-----\n" + base64.encodebytes(noseed) + b"-----END PRIVATE KEY-----\n"
    with pytest.raises(KeyMaterialError, match=r"expandedKey form.*without its 32-byte seed"):
        load_private_key(armoured, name="noseed.pem")


def test_wrong_size_and_wrong_set_keys_are_refused(key_dir: Path) -> None:
    pk, _ = ML_DSA_65.keygen()
    assert load_trusted_key(pk, name="raw").algorithm is MLDSA65
    for bad in (pk[:-1], pk + b"\0"):
        with pytest.raises(KeyMaterialError, match="raw"):
            load_trusted_key(bad, name="raw")
    # An SPKI whose BIT STRING is one byte short: cryptography checks the FIPS 204 size.
    spki = serialization.load_pem_public_key((key_dir / "ml-dsa-65.pub.pem").read_bytes()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    short = bytearray(spki[:-1])
    short[2:4] = (len(short) - 4).to_bytes(2, "big")
    short[20:22] = (len(short) - 22).to_bytes(2, "big")
    armoured = (
        b"-----BEGIN PUBLIC KEY-----\n" + base64.encodebytes(bytes(short)) + b"-----END PUBLIC KEY-----\n"
    )
    with pytest.raises(KeyMaterialError, match="not a valid PEM public key"):
        load_trusted_key(armoured, name="short.pem")
    # An ML-DSA-44 signature never verifies under an ML-DSA-65 key (refused before verification).
    signer44 = load_private_key_file(key_dir / "ml-dsa-44.key.pem")
    with pytest.raises(SignatureError, match="3309 bytes, got 2420"):
        load_trusted_key_file(key_dir / "ml-dsa-65.pub.pem").verify(signer44.sign(b"m"), b"m")
