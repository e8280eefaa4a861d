"""FIPS 204 ML-DSA known-answer tests (key generation from seed, signature verification) through modelsec.

Source: PyPI `cryptography-vectors` (asymmetric/MLDSA/kat_MLDSA_{44,65,87}_det_pure.rsp: `xi` is the 32-byte
key-generation seed, `pk` the raw public key, `sm` the signature followed by `msg`, `ctx` the context
string). Every vector has a non-empty context, while modelsec signs and verifies with the empty context
(pure ML-DSA as model_signing uses it): so a KAT signature must verify under its context and must be
refused by `TrustedKey.verify`, which binds the empty context.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import SignatureError
from modelsec.signer import load_trusted_key
from modelsec.signer.schemes import scheme_for
from modelsec.signer.schemes.mldsa import MlDsaScheme

cryptography_vectors = pytest.importorskip("cryptography_vectors")
KAT_DIR = Path(cryptography_vectors.__file__).parent / "asymmetric/MLDSA"
PER_SET = 10  # of 100 vectors per parameter set: enough to cover the code path, quick under pure checks


def _vectors(level: int) -> list[dict[str, bytes]]:
    out: list[dict[str, bytes]] = []
    current: dict[str, bytes] = {}
    for line in (KAT_DIR / f"kat_MLDSA_{level}_det_pure.rsp").read_text().splitlines():
        key, sep, value = line.partition(" = ")
        if not sep or key in ("count", "mlen", "smlen"):
            continue
        current[key] = bytes.fromhex(value)
        if key == "ctx":
            out.append(current)
            current = {}
        if len(out) == PER_SET:
            break
    return out


CASES = [
    pytest.param(SignatureAlgorithm(f"ml-dsa-{level}"), v, id=f"ml-dsa-{level}-{i}")
    for level in (44, 65, 87)
    for i, v in enumerate(_vectors(level))
]


def test_vectors_were_read() -> None:
    assert len(CASES) == 3 * PER_SET


@pytest.mark.parametrize(("algorithm", "vector"), CASES)
def test_keygen_from_seed_and_signature_verification(
    algorithm: SignatureAlgorithm, vector: dict[str, bytes]
) -> None:
    scheme = scheme_for(algorithm)
    assert isinstance(scheme, MlDsaScheme)
    private = scheme.private_type.from_seed_bytes(vector["xi"])
    assert private.public_key().public_bytes_raw() == vector["pk"]
    # The raw FIPS 204 key file and the SPKI PEM of the seeded key are the same trusted key.
    raw = load_trusted_key(vector["pk"], name="kat.pub")
    spki = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert raw.algorithm is algorithm and raw.keyid == load_trusted_key(spki, name="kat.pem").keyid
    signature, message = vector["sm"][: scheme.signature_size], vector["sm"][scheme.signature_size :]
    assert message == vector["msg"]
    private.public_key().verify(signature, message, vector["ctx"])
    with pytest.raises(SignatureError, match="does not verify"):
        raw.verify(signature, message)  # modelsec binds the empty context
