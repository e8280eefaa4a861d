"""NIST CAVP FIPS 186-3 ECDSA SigVer vectors (P-256/SHA-256, P-384/SHA-384) through TrustedKey.verify.

Source: PyPI `cryptography-vectors` (asymmetric/ECDSA/FIPS_186-3/SigVer.rsp, NIST CAVP). Each vector is
verified through the same code path as bundles: strict DER, range checks, then OpenSSL via cryptography.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelsec.errors import SignatureError
from modelsec.signer import load_trusted_key
from modelsec.signer.der import encode_signature

cryptography_vectors = pytest.importorskip("cryptography_vectors")
SIGVER = Path(cryptography_vectors.__file__).parent / "asymmetric/ECDSA/FIPS_186-3/SigVer.rsp"
CURVES = {"P-256,SHA-256": ec.SECP256R1(), "P-384,SHA-384": ec.SECP384R1()}


def _vectors() -> list[tuple[str, dict[str, str]]]:
    out, section, current = [], None, {}
    for line in SIGVER.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line[1:-1]
            continue
        if " = " in line and section in CURVES:
            k, v = line.split(" = ", 1)
            current[k] = v
            if k == "Result":
                out.append((section, current))
                current = {}
    return out


VECTORS = _vectors()


def test_vectors_found() -> None:
    assert sum(1 for s, _ in VECTORS if s == "P-256,SHA-256") >= 15
    assert sum(1 for s, _ in VECTORS if s == "P-384,SHA-384") >= 15


@pytest.mark.parametrize(("section", "v"), VECTORS)
def test_sigver(section: str, v: dict[str, str]) -> None:
    curve = CURVES[section]
    try:
        pub = ec.EllipticCurvePublicNumbers(int(v["Qx"], 16), int(v["Qy"], 16), curve).public_key()
    except ValueError:
        assert v["Result"].startswith("F")  # invalid public key vectors
        return
    pem = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    key = load_trusted_key(pem, name="nist")
    sig = encode_signature(int(v["R"], 16), int(v["S"], 16))
    msg = bytes.fromhex(v["Msg"])
    if v["Result"].startswith("P"):
        key.verify(sig, msg)
    else:
        with pytest.raises(SignatureError):
            key.verify(sig, msg)
