"""Signing with keys that stay in a real PKCS#11 token (SoftHSM2): the CLI, the API and the gRPC service.

SM2 and ML-DSA keys in a token cannot be tested here: SoftHSM2 offers no mechanism for either (an SM2 key
object it stores without checking is refused by modelsec with a plain message, tested below).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from modelsec.attestations.bundle import parse_bundle
from modelsec.errors import BackendUnavailableError, KeyMaterialError, PolicyError
from modelsec.signer.der import decode_signature
from modelsec.signer.schemes.ecdsa import ECDSA_P256, ECDSA_P384
from tests.conftest import run_cli, run_cli_process, write_tiny_model
from tests.support.softhsm import PIN, Token, make_token

pytestmark = pytest.mark.integration


@pytest.fixture
def token(tmp_path: Path) -> Token:
    """Its own token: the test adds a key to it and deletes it."""
    return make_token(tmp_path / "hsm")


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelsec: error:"), r.stderr
    return lines[0]


def test_cli_signs_in_the_token_and_verify_accepts_the_exported_keys(
    softhsm_token: Token, tmp_path: Path
) -> None:
    token = softhsm_token
    model = write_tiny_model(tmp_path / "model")
    # The session token is the one this process loaded SoftHSM2 for: the CLI runs in-process.
    r = run_cli(
        "sign", model, "--signing-key", token.uri(), "--signing-key", token.uri("release384"), "--json",
        env=token.env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    signed = json.loads(r.stdout)
    assert [b["algorithm"] for b in signed["bundles"]] == ["ecdsa-p256", "ecdsa-p384"]
    for name, scheme in (("model.sig", ECDSA_P256), ("model.p384.sig", ECDSA_P384)):
        bundle = parse_bundle((model / name).read_bytes(), source=name)
        (signature,) = bundle.envelope.signatures
        _, s = decode_signature(signature.sig, scheme.order)  # strict DER, as the PEM path writes it
        assert s <= scheme.order // 2  # low-S
    r = run_cli(
        "verify", model, "--trusted-key", token.public_key("release"),
        "--trusted-key", token.public_key("release384"), "--require", "ecdsa-p256,ecdsa-p384", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rootDigest"] == signed["rootDigest"]
    # A key generated elsewhere does not verify what the token signed.
    other = run_cli("keygen", "-o", tmp_path / "other")
    assert other.returncode == 0, other.stderr
    r = run_cli("verify", model, "--trusted-key", tmp_path / "other.pub.pem")
    assert r.returncode == 1


@pytest.mark.slow
def test_cli_token_errors_are_one_clear_line(token: Token, tmp_path: Path) -> None:
    # A token of its own (it is deleted and changed here), so a process of its own: SoftHSM2 reads
    # SOFTHSM2_CONF once per process.
    model = write_tiny_model(tmp_path / "model")
    wrong_pin = tmp_path / "wrong-pin"
    wrong_pin.write_text("0000\n")
    cases = [
        (token.uri(pin=f"file:{wrong_pin}"), "the token refused the PIN \\(wrong PIN\\)"),
        (token.uri("no-such-key"), "the token holds no private key matching the URI"),
        (token.uri(pin=f"env:{'MODELSEC_TEST_PIN'}"), "pin-source \\$MODELSEC_TEST_PIN is not set"),
        (token.uri(pin="", **{"pin-value": PIN}), "pin-value is refused: a PIN in the URI"),
        (token.uri(pin=PIN), "pin-source must be file:PATH or env:VAR \\(a PIN is never a literal\\)"),
        (token.uri(pin=""), "no PIN: add pin-source=file:PATH or pin-source=env:VAR"),
        (token.uri(**{"module-path": "/nonexistent/libpkcs11.so"}), "cannot load the PKCS#11 module"),
    ]
    for uri, message in cases:
        line = _one_error_line(run_cli_process("sign", model, "--signing-key", uri, env=token.env))
        assert re.search(message, line), (uri, line)
        assert f"={PIN}" not in line and f":{PIN}" not in line  # the PIN is never echoed
    r = run_cli("sign", model, "--signing-key", token.uri(), "--key-password", f"{token.uri()}=env:X")
    assert "--key-password is for PEM keys" in _one_error_line(r)
    r = run_cli_process("sign", model, "--signing-key", token.uri(), "--json", env=token.env)
    assert r.returncode == 0, r.stderr  # all of the above left the token usable
    # SM2: SoftHSM2 stores an imported SM2 key object but has no mechanism for it.
    token.generate("sm2", "03", "sm2")
    line = _one_error_line(run_cli_process("sign", model, "--signing-key", token.uri("sm2"), env=token.env))
    assert "SM2 keys in PKCS#11 tokens are not supported" in line
    # The token removed: the same URI now names nothing.
    subprocess.run(
        ["softhsm2-util", "--delete-token", "--token", token.label],
        env=token.env,
        check=True,
        capture_output=True,
    )
    r = run_cli_process("sign", model, "--signing-key", token.uri(), "--json", env=token.env)
    assert r.returncode == 1
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "KeyMaterialError" and "no token matching the URI is present" in error["message"]


def test_api_signs_a_model_and_the_private_key_never_leaves_the_token(
    softhsm_token: Token, tmp_path: Path
) -> None:
    import pkcs11

    from modelsec.policy import Policy
    from modelsec.signer import key_source, sign_model
    from modelsec.signer.keys import load_trusted_key_file
    from modelsec.verifier import verify_model

    backend = key_source(softhsm_token.uri()).open()
    assert backend.public_key_pem() == softhsm_token.public_key().read_bytes()
    trusted = load_trusted_key_file(softhsm_token.public_key())
    for i in range(24):  # the token's nonces are random: about half its raw signatures are high-S
        message = f"message {i}".encode()
        signature = backend.sign(message)
        assert decode_signature(signature, ECDSA_P256.order)[1] <= ECDSA_P256.order // 2
        trusted.verify(signature, message)
    # The gRPC service signs from many threads: one session, one operation at a time.
    with ThreadPoolExecutor(8) as pool:
        for message, signature in pool.map(lambda i: (b"%d" % i, backend.sign(b"%d" % i)), range(64)):
            trusted.verify(signature, message)
    model = write_tiny_model(tmp_path / "model")
    signed = sign_model(model, [backend])
    assert verify_model(model, Policy.from_key_files([softhsm_token.public_key()])).root_digest == (
        signed.root_digest
    )
    lib = pkcs11.lib(softhsm_token.module)
    # Logged in already (by the backend: PKCS#11 logs in per process and token), so no PIN here.
    with lib.get_token(token_label=softhsm_token.label).open() as session:
        key = session.get_key(object_class=pkcs11.ObjectClass.PRIVATE_KEY, label="release")
        assert key[pkcs11.Attribute.EXTRACTABLE] is False
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):
            key[pkcs11.Attribute.VALUE]


def test_a_token_removed_under_an_open_key_is_one_clear_error(softhsm_token: Token) -> None:
    from modelsec.signer import key_source

    doomed = dataclasses.replace(softhsm_token, label="doomed")
    backend = key_source(doomed.uri("doomed")).open()
    backend.sign(b"before")
    subprocess.run(
        ["softhsm2-util", "--delete-token", "--token", "doomed"],
        env=doomed.env,
        check=True,
        capture_output=True,
    )
    with pytest.raises(BackendUnavailableError, match="the token or its key is gone"):
        backend.sign(b"after")
    with pytest.raises(KeyMaterialError, match="no token matching the URI is present"):
        key_source(doomed.uri("doomed")).open()


def test_service_config_refuses_a_pin_in_a_key_uri(tmp_path: Path, key_dir: Path) -> None:
    from modelsec.service.config import load_server_config
    from tests.support.service import write_server_config

    uri = f"pkcs11:object=release?module-path=/x.so&pin-value={PIN}"
    config = write_server_config(tmp_path, key_dir, keys=[{"name": "hsm", "path": uri, "allow": ["*"]}])
    with pytest.raises(PolicyError, match=r"keys\[0\]\.path: pkcs11 URI: pin-value is refused") as caught:
        load_server_config(config)
    assert PIN not in str(caught.value)
    assert not isinstance(caught.value, KeyMaterialError)


def test_service_signs_with_a_token_key(softhsm_token: Token, tmp_path: Path, key_dir: Path) -> None:
    token = softhsm_token
    from modelsec.algorithms import HashAlgorithm
    from modelsec.attestations.predicates.oms import manifest_statement
    from modelsec.attestations.statement import serialize_statement
    from modelsec.service.client import ChannelOptions, ModelsecClient
    from modelsec.signer.keys import load_trusted_key_file
    from modelsec.signer.layout import MODEL_IGNORE_PATHS
    from modelsec.signer.signing import compute_manifests
    from modelsec.verifier import verify_bundle_signature
    from tests.support.service import spawn_cli_server, write_server_config

    model = write_tiny_model(tmp_path / "model")
    manifests = compute_manifests(model, [HashAlgorithm.SHA256], ignore_paths=list(MODEL_IGNORE_PATHS))
    statement = serialize_statement(manifest_statement(manifests[HashAlgorithm.SHA256]))
    keys = [
        {"name": "hsm", "path": token.uri(pin=""), "passwordEnv": "MODELSEC_TEST_TOKEN_PIN", "allow": ["*"]},
        {"name": "hsm384", "path": token.uri("release384"), "allow": ["*"]},
    ]
    config = write_server_config(tmp_path / "server", key_dir, keys=keys)
    server = spawn_cli_server(config, env={**token.env, "MODELSEC_TEST_TOKEN_PIN": PIN})
    try:
        with ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=20)) as client:
            for name, key in (("hsm/1", "release"), ("hsm384/1", "release384")):
                assert client.get_public_key(name).public_key_pem == token.public_key(key).read_bytes()
                response = client.sign_statement(name, statement)
                bundle = parse_bundle(response.bundle, source=name)
                verify_bundle_signature(bundle, [load_trusted_key_file(token.public_key(key))])
    finally:
        code, err = server.terminate()
    assert code == 0, err


_MISMATCH = r"""
import sys
import pkcs11
from pkcs11 import Attribute, KeyType, ObjectClass
from pkcs11.util.ec import encode_named_curve_parameters

module, token, pin = sys.argv[1:]
with pkcs11.lib(module).get_token(token_label=token).open(rw=True, user_pin=pin) as session:
    params = session.create_domain_parameters(
        KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}, local=True
    )
    mine, _ = params.generate_keypair(store=True, label="mismatched", id=b"\x0c")
    other, _ = params.generate_keypair(store=True, label="other", id=b"\x0d")
    point = bytes(other[Attribute.EC_POINT])
    mine.destroy()
    session.create_object({
        Attribute.CLASS: ObjectClass.PUBLIC_KEY, Attribute.KEY_TYPE: KeyType.EC, Attribute.TOKEN: True,
        Attribute.VERIFY: True, Attribute.LABEL: "mismatched", Attribute.ID: b"\x0c",
        Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1"), Attribute.EC_POINT: point,
    })
"""

_SIGN_MANY = r"""
import json
import sys
from modelsec.errors import KeyMaterialError
from modelsec.signer.keys import key_source

backend = key_source(sys.argv[1]).open()
try:
    signatures = backend.sign_many([b"first", b"second", b"third"])
except KeyMaterialError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
else:
    print(json.dumps({"signatures": len(signatures)}))
"""


def test_a_public_object_of_another_key_fails_signing_closed(token: Token, tmp_path: Path) -> None:
    """The token signs with one key while its public object is another's: every path refuses, none writes.

    Issue 32 item 4 moved the check of each signature to a second thread (`sign_many`); it must still fail
    the whole call, returning no signature, and `modelsec sign` must write no bundle.
    """
    subprocess.run(
        [sys.executable, "-c", _MISMATCH, token.module, token.label, PIN],
        env=token.env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    uri = token.uri("mismatched")
    out = subprocess.run(
        [sys.executable, "-c", _SIGN_MANY, uri], env=token.env, check=True, capture_output=True, text=True
    )
    answer = json.loads(out.stdout)
    assert answer["error"] == "KeyMaterialError", answer
    assert "do not belong together" in answer["message"]
    model = write_tiny_model(tmp_path / "model")
    before = sorted(p.name for p in model.iterdir())
    line = _one_error_line(run_cli_process("sign", model, "--signing-key", uri, env=token.env))
    assert "do not belong together" in line
    assert sorted(p.name for p in model.iterdir()) == before  # no bundle written


def test_sign_many_checks_and_returns_every_signature_in_order(softhsm_token: Token) -> None:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from modelsec.signer.keys import key_source

    backend = key_source(softhsm_token.uri()).open()
    messages = [f"message {i}".encode() for i in range(8)]
    signatures = backend.sign_many(messages)  # type: ignore[attr-defined]
    public = serialization.load_pem_public_key(softhsm_token.public_key().read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey) and len(signatures) == len(messages)
    for message, signature in zip(messages, signatures, strict=True):
        public.verify(signature, message, ec.ECDSA(hashes.SHA256()))  # raises unless it is message's
