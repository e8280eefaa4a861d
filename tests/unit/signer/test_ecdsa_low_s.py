"""The ECDSA signer emits low-S signatures; verification keeps accepting high-S (issue 19)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import SignatureError
from modelsec.signer import load_private_key, load_trusted_key
from modelsec.signer.der import decode_signature, encode_signature
from modelsec.signer.keys import generate_private_key_pem

N = {
    SignatureAlgorithm.ECDSA_P256: 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
    SignatureAlgorithm.ECDSA_P384: int(
        "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973", 16
    ),
}


@pytest.mark.parametrize("algorithm", list(N), ids=lambda a: a.value)
def test_signer_emits_low_s_and_high_s_still_verifies(algorithm: SignatureAlgorithm) -> None:
    private_pem, public_pem = generate_private_key_pem(algorithm)
    signer = load_private_key(private_pem, name="ci.key.pem")
    trusted = load_trusted_key(public_pem, name="ci.pub.pem")
    n = N[algorithm]
    for i in range(200):
        message = b"DSSEv1 statement %d" % i
        signature = signer.sign(message)
        r, s = decode_signature(signature, n)
        assert s <= n // 2, f"signature {i} is high-S"
        trusted.verify(signature, message)
        # The other valid form, (r, n - s), is high-S: the verifier accepts it (model_signing emits it).
        flipped = encode_signature(r, n - s)
        assert decode_signature(flipped, n)[1] > n // 2
        trusted.verify(flipped, message)
        with pytest.raises(SignatureError):
            trusted.verify(flipped, message + b".")


@pytest.mark.parametrize("algorithm", list(N), ids=lambda a: a.value)
def test_low_s_signature_verifies_with_plain_cryptography(algorithm: SignatureAlgorithm) -> None:
    private_pem, public_pem = generate_private_key_pem(algorithm)
    signer = load_private_key(private_pem, name="ci.key.pem")
    public = serialization.load_pem_public_key(public_pem)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    digest = hashes.SHA256() if algorithm is SignatureAlgorithm.ECDSA_P256 else hashes.SHA384()
    public.verify(signer.sign(b"m"), b"m", ec.ECDSA(digest))
    # Still deterministic (RFC 6979): golden files stay reproducible.
    assert signer.sign(b"m") == signer.sign(b"m")
