"""`sign --hash-type blake3`: OMS's BLAKE3 hash type, byte-compatible with model_signing both ways."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import blake3
import pytest

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import DigestMismatchError, UnsupportedAlgorithmError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import load_model, verify_model
from modelsec.verifier.trust.signatures import verify_signatures
from tests.conftest import run_cli, write_tiny_model

ms_signing = pytest.importorskip("model_signing.signing")
ms_verifying = pytest.importorskip("model_signing.verifying")
ms_hashing = pytest.importorskip("model_signing.hashing")

pytestmark = pytest.mark.integration


def _payload(sig: Path) -> dict[str, object]:
    return json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))  # type: ignore[no-any-return]


def _ms_sign_blake3(model: Path, sig: Path, key: Path, *ignore: Path) -> None:
    cfg = ms_hashing.Config().use_file_serialization(hashing_algorithm="blake3")
    cfg.set_ignored_paths(paths=[sig, *ignore])
    ms_signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(cfg).sign(model, sig)


def test_modelsec_blake3_bundle_verifies_with_model_signing(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    pub, priv = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    r = run_cli("sign", model, "--signing-key", priv, "--hash-type", "blake3", "--json")
    assert r.returncode == 0, r.stderr
    payload = _payload(model / "model.sig")
    predicate = payload["predicate"]
    assert predicate["serialization"]["hash_type"] == "blake3"  # type: ignore[index]
    resources = {e["name"]: e for e in predicate["resources"]}  # type: ignore[index]
    for name, entry in resources.items():
        assert entry["algorithm"] == "blake3"
        assert entry["digest"] == blake3.blake3((model / name).read_bytes()).hexdigest()
    ms_verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(model, model / "model.sig")

    ms_sig = tmp_path / "ms.sig"
    _ms_sign_blake3(model, ms_sig, priv, model / "model.sig")
    ours_root = json.loads(r.stdout)["rootDigest"]
    assert ours_root == "sha256:" + _payload(ms_sig)["subject"][0]["digest"]["sha256"]  # type: ignore[index]
    assert _payload(ms_sig)["predicate"]["resources"] == predicate["resources"]  # type: ignore[index]


def test_model_signing_blake3_bundle_verifies_here_hashing_blake3_only(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    pub, priv = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    sig = tmp_path / "ms.sig"
    _ms_sign_blake3(model, sig, priv)
    policy = Policy.from_key_files([pub])
    root = _payload(sig)["subject"][0]["digest"]["sha256"]  # type: ignore[index]
    assert verify_model(model, policy, bundles=[sig]).root_digest == root
    # No SHA-256 pass over the weights: the BLAKE3 manifest binds the bytes and its own root.
    assert verify_signatures(model, policy, bundles=[sig]).file_hashes == (HashAlgorithm.BLAKE3,)

    shard = model / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="model-00002"):
        verify_model(model, policy, bundles=[sig])


def test_blake3_bundle_with_tensor_digests_loads_partially(tmp_path: Path, key_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    model = write_tiny_model(tmp_path / "m")
    pub, priv = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    result = sign_model(model, [load_private_key_file(priv)], hash_type=HashAlgorithm.BLAKE3)
    policy = Policy.from_key_files([pub])
    assert verify_model(model, policy).root_digest == result.root_digest
    whole = load_model(model, policy)
    name = sorted(whole)[-1]
    part = load_model(model, policy, tensors=[name])
    assert torch.equal(part[name], whole[name])


def test_sm2_refuses_blake3(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    with pytest.raises(UnsupportedAlgorithmError, match="sm2"):
        sign_model(model, [load_private_key_file(key_dir / "sm2.key.pem")], hash_type=HashAlgorithm.BLAKE3)
    assert not (model / "model.sm2.sig").exists()
    r = run_cli("sign", model, "--signing-key", key_dir / "sm2.key.pem", "--hash-type", "blake3")
    assert r.returncode == 1 and "sha256" in r.stderr
