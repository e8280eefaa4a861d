"""A real PKCS#11 token for tests: SoftHSM2 (Debian `softhsm2`) in a temporary directory.

`make test` installs softhsm2 with apt-get; a test run without it tries the same once (as root, where apt-get
exists) and otherwise skips with the reason. Keys are generated inside the token (non-extractable,
sensitive) by python-pkcs11 in a child process, which also exports each public key as PEM for
`modelsec verify`: SoftHSM2 reads `SOFTHSM2_CONF` once per process, so the test process itself only loads
the module for the one session-wide token (`session_token`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

PIN = "1234"
_MODULES = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
)

_KEYGEN = r"""
import sys
import pkcs11
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pkcs11 import Attribute, KeyType
from pkcs11.util.ec import encode_named_curve_parameters

module, token, pin, label, key_id, curve, out = sys.argv[1:]
with pkcs11.lib(module).get_token(token_label=token).open(rw=True, user_pin=pin) as session:
    if curve == "sm2":  # SoftHSM2 cannot generate SM2 keys; it stores an imported one without checking.
        session.create_object({
            Attribute.CLASS: pkcs11.ObjectClass.PRIVATE_KEY, Attribute.KEY_TYPE: KeyType.EC,
            Attribute.TOKEN: True, Attribute.PRIVATE: True, Attribute.SIGN: True, Attribute.LABEL: label,
            Attribute.ID: bytes.fromhex(key_id), Attribute.EC_PARAMS: bytes.fromhex("06082a811ccf5501822d"),
            Attribute.VALUE: bytes(31) + b"\x07",
        })
        sys.exit(0)
    params = session.create_domain_parameters(
        KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters(curve)}, local=True
    )
    public, private = params.generate_keypair(
        store=True, label=label, id=bytes.fromhex(key_id),
        private_template={Attribute.EXTRACTABLE: False, Attribute.SENSITIVE: True},
    )
    assert private[Attribute.EXTRACTABLE] is False and private[Attribute.SENSITIVE] is True
    point = bytes(public[Attribute.EC_POINT])[2:]  # the DER OCTET STRING around the uncompressed point
    named = {"secp256r1": ec.SECP256R1(), "secp384r1": ec.SECP384R1()}[curve]
    with open(out, "wb") as f:
        f.write(ec.EllipticCurvePublicKey.from_encoded_point(named, point).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
"""


@functools.cache
def softhsm_module() -> str | None:
    """The SoftHSM2 PKCS#11 module, installing softhsm2 with apt-get once if it is missing and we may."""
    found = next((m for m in _MODULES if os.path.exists(m)), None)
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        install = ["apt-get", "install", "-y", "softhsm2"]
        if subprocess.run(install, capture_output=True, timeout=600, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, timeout=600, check=False)
            subprocess.run(install, capture_output=True, timeout=600, check=False)
        found = next((m for m in _MODULES if os.path.exists(m)), None)
    return found


def require_softhsm() -> str:
    """The module path, or skip the test saying why (no softhsm2 and it could not be installed)."""
    pytest.importorskip("pkcs11", reason="python-pkcs11 is not installed (pip install 'modelsec[pkcs11]')")
    module = softhsm_module()
    if module is None or shutil.which("softhsm2-util") is None:
        pytest.skip(
            "softhsm2 is not installed and could not be installed (apt-get install -y softhsm2 as root)"
        )
    return module


@dataclass(frozen=True)
class Token:
    """An initialised SoftHSM2 token with a P-256 key `release` (id 01) and a P-384 key `release384` (02)."""

    directory: Path
    module: str
    label: str
    env: dict[str, str]
    pin_file: Path

    def uri(self, obj: str = "release", *, pin: str | None = None, **extra: str) -> str:
        """`pkcs11:token=…;object=…?module-path=…&pin-source=file:…` (pin-source overridable or dropped)."""
        query = {"module-path": self.module, **extra}
        if pin is None:
            query["pin-source"] = f"file:{self.pin_file}"
        elif pin:
            query["pin-source"] = pin
        q = "&".join(f"{k}={quote(v, safe='/:')}" for k, v in query.items())
        return f"pkcs11:token={quote(self.label)};object={quote(obj)}?{q}"

    def public_key(self, name: str = "release") -> Path:
        """The exported public key PEM of the token key `name`."""
        return self.directory / f"{name}.pub.pem"

    def generate(self, label: str, key_id: str, curve: str) -> None:
        """Generate a key pair inside the token (`curve`: secp256r1, secp384r1, or sm2 to import one)."""
        out = self.public_key(label)
        subprocess.run(
            [sys.executable, "-c", _KEYGEN, self.module, self.label, PIN, label, key_id, curve, str(out)],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=120,
        )


def make_token(directory: Path, label: str = "modelsec-test") -> Token:
    """Initialise a token in `directory` (its own SOFTHSM2_CONF) and generate the P-256 and P-384 keys."""
    module = require_softhsm()
    tokens = directory / "tokens"
    tokens.mkdir(parents=True)
    conf = directory / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n")
    env = {**os.environ, "SOFTHSM2_CONF": str(conf)}
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", "5678", "--pin", PIN],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    pin_file = directory / "pin"
    pin_file.write_text(PIN + "\n")
    token = Token(directory, module, label, env, pin_file)
    token.generate("release", "01", "secp256r1")
    token.generate("release384", "02", "secp384r1")
    return token
