"""A token key made by opensc's `pkcs11-tool --keypairgen` (non-extractable), and model_signing 1.1.1's
PKCS#11 signer as a cross-check: it signs with the token key and modelsec verifies, and the reverse.

The token is SoftHSM2 in a temporary directory (tests/support/softhsm.py); `pkcs11-tool` comes from Debian's
`opensc`, installed by `make test` (or here, as root with apt-get) and otherwise skipped with the reason.
model_signing runs in its cached 1.1.1 venv (tests/integration/_ms_venvs.py) and needs `PyKCS11`, installed
into that venv from a wheel on first use; without one the cross-check skips saying so.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from modelsec.errors import VerificationError
from modelsec.policy import Policy
from modelsec.verifier import verify_model
from tests.conftest import run_cli, run_cli_process, write_tiny_model
from tests.integration._ms_venvs import VenvUnavailable, python_for
from tests.support.softhsm import PIN, Token, make_token

pytestmark = pytest.mark.integration
TOOL = Path(__file__).with_name("_ms_tool.py")
LABEL = "opensc"


@dataclass(frozen=True)
class OpenscKey:
    token: Token
    public_key: Path  # exported by pkcs11-tool, not by modelsec
    objects: str  # `pkcs11-tool --list-objects` (all objects) after the key was made


@functools.cache
def _pkcs11_tool() -> str | None:
    if shutil.which("pkcs11-tool") is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "opensc"], capture_output=True, timeout=600, check=False)
    return shutil.which("pkcs11-tool")


@pytest.fixture
def opensc_key(tmp_path: Path) -> OpenscKey:
    token = make_token(tmp_path / "hsm")
    tool = _pkcs11_tool()
    if tool is None:
        pytest.skip("opensc's pkcs11-tool is not installed and could not be (apt-get install -y opensc)")
    base = [tool, "--module", token.module, "--token-label", token.label]
    login = [*base, "--login", "--pin", PIN]

    def run(*args: str) -> str:
        r = subprocess.run(args, env=token.env, capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout

    run(*login, "--keypairgen", "--key-type", "EC:prime256v1", "--label", LABEL, "--id", "05")
    run(*base, "--read-object", "--type", "pubkey", "--label", LABEL, "-o", str(tmp_path / "pub.der"))
    public = serialization.load_der_public_key((tmp_path / "pub.der").read_bytes())
    pem = tmp_path / "opensc.pub.pem"
    pem.write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return OpenscKey(token, pem, run(*login, "--list-objects"))


def test_a_pkcs11_tool_key_signs_through_the_cli(opensc_key: OpenscKey, tmp_path: Path) -> None:
    token = opensc_key.token
    blocks = re.split(r"\n(?=\S)", opensc_key.objects)  # one block per object, its attributes indented
    (private,) = [
        b for b in blocks if b.startswith("Private Key Object; EC") and f"label:      {LABEL}\n" in b
    ]
    assert (
        "never extractable" in private and "always sensitive" in private
    )  # made in, and stays in, the token
    model = write_tiny_model(tmp_path / "model")
    # A process of its own for the token's SOFTHSM2_CONF (SoftHSM2 reads it once per process).
    r = run_cli_process("sign", model, "--signing-key", token.uri(LABEL), "--json", env=token.env)
    assert r.returncode == 0, r.stderr
    signed = json.loads(r.stdout)
    r = run_cli("verify", model, "--trusted-key", opensc_key.public_key, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rootDigest"] == signed["rootDigest"]
    # Another key of the same token does not verify it.
    assert run_cli("verify", model, "--trusted-key", token.public_key("release")).returncode == 1


def _model_signing_with_pykcs11() -> Path:
    try:
        python = python_for("1.1.1")
    except VenvUnavailable as e:
        pytest.skip(str(e))
    check = [str(python), "-c", "import PyKCS11"]
    if subprocess.run(check, capture_output=True, timeout=60, check=False).returncode != 0:
        install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        r = subprocess.run(
            [*install, "--only-binary", ":all:", "PyKCS11"], capture_output=True, text=True, timeout=600
        )
        if r.returncode != 0:
            pytest.skip(
                f"PyKCS11 (model_signing's PKCS#11 binding) has no installable wheel here: {r.stderr[-300:]}"
            )
    return python


def _ms(
    python: Path, ops: list[dict[str, object]], tmp: Path, env: dict[str, str]
) -> list[dict[str, object]]:
    spec = tmp / "ops.json"
    spec.write_text(json.dumps(ops, default=str))
    r = subprocess.run(
        [str(python), str(TOOL), str(spec)], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _tampered(model: Path, tmp: Path) -> Path:
    copy = tmp / f"tampered-{model.name}"
    shutil.copytree(model, copy)
    victim = copy / "config.json"
    victim.write_text(victim.read_text() + " ")
    return copy


@pytest.mark.slow
def test_model_signing_pkcs11_signer_and_modelsec_agree(opensc_key: OpenscKey, tmp_path: Path) -> None:
    python = _model_signing_with_pykcs11()
    token = opensc_key.token
    # model_signing reads the whole pin-source file (a trailing newline would become part of the PIN).
    pin = tmp_path / "pin-no-newline"
    pin.write_text(PIN)
    uri = token.uri(LABEL, pin=f"file:{pin}")
    policy = Policy.from_key_files([opensc_key.public_key])

    # model_signing signs with the token key; modelsec verifies, and refuses a tampered copy.
    model = write_tiny_model(tmp_path / "ms-model")
    sig = tmp_path / "ms.sig"
    (result,) = _ms(
        python, [{"op": "sign-pkcs11", "model": model, "sig": sig, "key": uri}], tmp_path, token.env
    )
    assert result["ok"], result
    subject = json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))["subject"]
    assert verify_model(model, policy, bundles=[sig]).root_digest == subject[0]["digest"]["sha256"]
    with pytest.raises(VerificationError):
        verify_model(_tampered(model, tmp_path / "t1"), policy, bundles=[sig])

    # modelsec signs with the same token key; model_signing verifies, and refuses a tampered copy.
    ours = write_tiny_model(tmp_path / "our-model")
    r = run_cli_process("sign", ours, "--signing-key", uri, "--json", env=token.env)
    assert r.returncode == 0, r.stderr
    ops: list[dict[str, object]] = [
        {"op": "verify", "model": m, "sig": ours / "model.sig", "key": opensc_key.public_key}
        for m in (ours, _tampered(ours, tmp_path / "t2"))
    ]
    assert [r["ok"] for r in _ms(python, ops, tmp_path, token.env)] == [True, False]
