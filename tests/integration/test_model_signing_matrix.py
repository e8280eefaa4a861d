"""Interop matrix with every released model_signing (1.0.0 … 1.1.1): `key` mode both directions, and
`certificate` mode (model_signing signs, modelsec verifies through an X.509 authority).

Each release runs in its own cached venv (`tests/integration/_ms_venvs.py`, created once per machine under
`.venv/ms-venvs/`). The models hold what broke before: `tokenizer/` beside `tokenizer.json`, `checkpoint/`
beside `checkpoint-100/`, nested folders, an ignored folder, a `.git` directory, and a single file.
Every acceptance is paired with a refusal of a tampered copy, so it cannot pass vacuously.

One model_signing process per release runs all of its operations. `key` mode runs in both directions on
both model shapes for every release: the releases differ in how they treat ignored paths and their own
bundle, which only a directory shows, and only in one direction. The `certificate` method changes the
verification material, not the manifest, so it is independent of the shape: pairwise, each release signs
one shape with it, alternating, so that every release and both shapes meet the method.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from modelsec.errors import SignatureError, VerificationError
from modelsec.policy import IdentityRule, Policy, X509Authority
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model
from tests.integration._ms_venvs import VERSIONS, VenvUnavailable, python_for
from tests.support.pki import SAN, make_ca, make_leaf, write_pem

pytestmark = pytest.mark.integration  # ~2 s a release once its venv exists
TOOL = Path(__file__).with_name("_ms_tool.py")


def _python(version: str) -> Path:
    try:
        return python_for(version)
    except VenvUnavailable as e:
        pytest.skip(str(e))


def _ms(python: Path, ops: list[dict[str, object]], tmp: Path) -> list[dict[str, object]]:
    spec = tmp / "ops.json"
    spec.write_text(json.dumps(ops, default=str))
    r = subprocess.run([str(python), str(TOOL), str(spec)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _dir_model(root: Path) -> Path:
    write_tiny_model(root)
    for name, text in {
        "tokenizer/vocab.json": '{"a": 1}',
        "tokenizer/merges.txt": "a b",
        "checkpoint/trainer_state.json": "{}",
        "checkpoint-100/trainer_state.json": '{"step": 100}',
        "a/b/c/deep.json": "[]",
        "a/b-c.txt": "x",
        "notes/draft.txt": "ignored",
        ".git/HEAD": "ref: refs/heads/main",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _tampered(model: Path, tmp: Path, target: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    copy = tmp / f"tampered-{model.name}"
    if model.is_dir():
        shutil.copytree(model, copy)
        victim = copy / target
    else:
        shutil.copy(model, copy)
        victim = copy
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    return copy


def _root(sig: Path) -> str:
    payload = json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))
    return payload["subject"][0]["digest"]["sha256"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", VERSIONS)
def test_matrix(version: str, tmp_path: Path, key_dir: Path) -> None:
    python = _python(version)
    legacy = version.startswith("1.0.")  # 1.0.x record no ignore list and apply only their own at verify
    priv, pub = key_dir / "ecdsa-p256.key.pem", key_dir / "ecdsa-p256.pub.pem"
    policy = Policy.from_key_files([pub])
    ms_model = _dir_model(tmp_path / "ms" / "dir-model")  # model_signing signs this copy,
    model = _dir_model(tmp_path / "ours" / "dir-model")  # modelsec this one (its bundle lands inside)
    single = write_tiny_model(tmp_path / "single-src") / "model-00001-of-00002.safetensors"
    ignore = [ms_model / ".git", ms_model / "notes"]
    sigs = tmp_path / "sigs"
    sigs.mkdir()

    # modelsec signs (before the model_signing process, which verifies these bundles).
    key = load_private_key_file(priv)
    ours = sign_model(model, [key], ignore_paths=["notes"])
    sign_model(single, [key], signature_paths={0: sigs / "ours-single.sig"}, tensor_hash=None)
    dir_ignore = [model / ".git", model / "notes", model / "model.sig"] if legacy else []
    tampered_dir = _tampered(model, tmp_path / "ours", "checkpoint-100/trainer_state.json")
    tampered_ignore = (
        [tampered_dir / ".git", tampered_dir / "notes", tampered_dir / "model.sig"] if legacy else []
    )
    tampered_single = _tampered(single, tmp_path / "ours-single", "")

    # The certificate method on one shape (pairwise, see the module docstring).
    cert_shape = ("dir", "single")[VERSIONS.index(version) % 2]
    cert_model = ms_model if cert_shape == "dir" else single
    ca_root = make_ca("corp root")
    intermediate = make_ca("corp intermediate", ca_root)
    leaf = make_leaf(intermediate)
    cert_sign = {
        "op": "sign-cert",
        "model": cert_model,
        "sig": sigs / "ms-cert.sig",
        "key": leaf.key_pem(tmp_path / "leaf.key.pem"),
        "cert": write_pem(tmp_path / "leaf.pem", leaf.cert),
        "chain": [write_pem(tmp_path / "chain.pem", intermediate.cert, ca_root.cert)],
        **({"ignore": ignore} if cert_shape == "dir" else {}),
    }

    results = _ms(
        python,
        [
            {"op": "sign", "model": ms_model, "sig": sigs / "ms-dir.sig", "key": priv, "ignore": ignore},
            {"op": "sign", "model": single, "sig": sigs / "ms-single.sig", "key": priv},
            cert_sign,
            {"op": "verify", "model": model, "sig": model / "model.sig", "key": pub, "ignore": dir_ignore},
            {"op": "verify", "model": single, "sig": sigs / "ours-single.sig", "key": pub},
            {
                "op": "verify",
                "model": tampered_dir,
                "sig": model / "model.sig",
                "key": pub,
                "ignore": tampered_ignore,
            },
            {"op": "verify", "model": tampered_single, "sig": sigs / "ours-single.sig", "key": pub},
        ],
        tmp_path,
    )
    assert all(r["ok"] for r in results[:3]), results

    # modelsec signed, model_signing verified (and refused the tampered copies).
    assert [r["ok"] for r in results[3:]] == [True, True, False, False], results

    # model_signing signed (key method); modelsec verifies and refuses tampered copies. 1.0.x record no
    # ignore list: the operator names the ignored paths, as with their own verify.
    extra = [".git", "notes"] if legacy else []
    got = verify_model(ms_model, policy, bundles=[sigs / "ms-dir.sig"], ignore_paths=extra)
    assert got.root_digest == _root(sigs / "ms-dir.sig") == ours.root_digest and got.files == 12
    got = verify_model(single, policy, bundles=[sigs / "ms-single.sig"])
    assert got.root_digest == _root(sigs / "ms-single.sig")
    for m, sig, target in ((ms_model, "ms-dir.sig", "tokenizer/vocab.json"), (single, "ms-single.sig", "")):
        with pytest.raises(VerificationError):
            verify_model(
                _tampered(m, tmp_path / sig, target), policy, bundles=[sigs / sig], ignore_paths=extra
            )

    # model_signing signed with the certificate method: verified under the root and identity a policy
    # names, only then. The bundle carries its own root: believed only when the policy names it.
    cert = sigs / "ms-cert.sig"
    assert "x509CertificateChain" in json.loads(cert.read_text())["verificationMaterial"]  # not a key hint
    x509 = _x509_policy(ca_root.cert.public_bytes(serialization.Encoding.DER))
    cert_extra = extra if cert_shape == "dir" else []
    got = verify_model(cert_model, x509, bundles=[cert], ignore_paths=cert_extra)
    assert got.root_digest == _root(cert) and got.files == (12 if cert_shape == "dir" else 1)
    assert got.bundles[0].key.name == f"corp-ca: {SAN}"
    target = "tokenizer/vocab.json" if cert_shape == "dir" else ""
    with pytest.raises(VerificationError):
        verify_model(
            _tampered(cert_model, tmp_path / "cert", target), x509, bundles=[cert], ignore_paths=cert_extra
        )
    other = _x509_policy(make_ca("other root").cert.public_bytes(serialization.Encoding.DER))
    with pytest.raises(SignatureError, match="does not verify to a configured root"):
        verify_model(cert_model, other, bundles=[cert], ignore_paths=cert_extra)
    wrong = _x509_policy(ca_root.cert.public_bytes(serialization.Encoding.DER), "intern@corp.example")
    with pytest.raises(SignatureError, match="not an identity the policy trusts"):
        verify_model(cert_model, wrong, bundles=[cert], ignore_paths=cert_extra)


def _x509_policy(root_der: bytes, identity: str = SAN) -> Policy:
    authority = X509Authority("corp-ca", (root_der,), (IdentityRule(identity=identity),), frozenset())
    return Policy(keys=(), authorities=(authority,))
