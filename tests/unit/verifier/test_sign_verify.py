"""sign_model / verify_model through the Python API: algorithms, requirements, tampering, side files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import (
    DigestMismatchError,
    FileSetMismatchError,
    MalformedArtifactError,
    PolicyError,
    PolicyViolationError,
    SignatureError,
)
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from tests.support.policies import key_policy


def _signers(key_dir: Path, *algs: SignatureAlgorithm):  # type: ignore[no-untyped-def]
    return [load_private_key_file(key_dir / f"{a.value}.key.pem") for a in algs]


ALL = (SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.ECDSA_P384, SignatureAlgorithm.SM2)


def test_all_three_algorithms_sign_and_verify(tiny_model: Path, key_dir: Path) -> None:
    result = sign_model(tiny_model, _signers(key_dir, *ALL))
    assert sorted(p.path.name for p in result.bundles) == ["model.p384.sig", "model.sig", "model.sm2.sig"]
    v = verify_model(tiny_model, key_policy(key_dir, *ALL, require=ALL))
    assert set(v.algorithms) == set(ALL)
    assert v.root_digest == result.root_digest
    assert v.files == 6 and v.tensors == 6 and v.tensor_digests == 6
    sm2_manifest = next(b.manifest for b in v.bundles if b.algorithm is SignatureAlgorithm.SM2)
    assert sm2_manifest.hash_type is HashAlgorithm.SM3
    assert sm2_manifest.subject_digest["sha256"] == result.root_digest


def test_required_algorithm_missing(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    with pytest.raises(SignatureError, match=r"required signature.*sm2"):
        verify_model(tiny_model, key_policy(key_dir, *ALL, require=[SignatureAlgorithm.SM2]))


def test_sm2_only_policy_skips_nothing_it_can_check(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.SM2))
    v = verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.SM2))
    assert v.algorithms == (SignatureAlgorithm.SM2,)
    assert [p.name for p in v.skipped] == ["model.sig"]


def test_untrusted_key(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, [load_private_key_file(key_dir / "other.key.pem")])
    with pytest.raises(SignatureError, match="no trusted key"):
        verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_no_keys_is_a_policy_error() -> None:
    with pytest.raises(PolicyError):
        Policy(keys=())


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_tampered_tensor_named(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    _flip(tiny_model / "model-00002-of-00002.safetensors", -1)
    with pytest.raises(DigestMismatchError, match=r"model-00002-of-00002\.safetensors"):
        verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_single_shard_verification(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.SM2))
    _flip(tiny_model / "model-00002-of-00002.safetensors", -1)
    policy = key_policy(key_dir, SignatureAlgorithm.SM2)
    shard1 = tiny_model / "model-00001-of-00002.safetensors"
    v = verify_model(shard1, policy)
    assert v.files == 1 and v.tensors == 3
    with pytest.raises(DigestMismatchError):
        verify_model(tiny_model / "model-00002-of-00002.safetensors", policy)


def test_extra_and_missing_files(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    policy = key_policy(key_dir, SignatureAlgorithm.ECDSA_P256)
    (tiny_model / "notes.txt").write_text("x")
    with pytest.raises(FileSetMismatchError, match=r"notes\.txt"):
        verify_model(tiny_model, policy)
    (tiny_model / "notes.txt").unlink()
    (tiny_model / "tokenizer.json").rename(tiny_model / "tok.json")
    with pytest.raises(FileSetMismatchError) as info:
        verify_model(tiny_model, policy)
    assert info.value.extra == ["tok.json"] and info.value.missing == ["tokenizer.json"]


def test_signed_remote_code_refused_by_default(tiny_model: Path, key_dir: Path) -> None:
    cfg = json.loads((tiny_model / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_x.Model"}
    (tiny_model / "config.json").write_text(json.dumps(cfg))
    (tiny_model / "modeling_x.py").write_text("")  # allowed remote code must be a signed module
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    with pytest.raises(PolicyViolationError, match=r"auto_map|remote code"):
        verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))
    allowed = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"], allow_remote_code=True)
    verify_model(tiny_model, allowed)


def test_index_must_point_at_signed_shards(tiny_model: Path, key_dir: Path) -> None:
    index = json.loads((tiny_model / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.0.weight"] = "../elsewhere.safetensors"
    (tiny_model / "model.safetensors.index.json").write_text(json.dumps(index))
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    with pytest.raises(MalformedArtifactError, match="weight_map"):
        verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_index_names_tensor_the_shard_lacks(tiny_model: Path, key_dir: Path) -> None:
    index = json.loads((tiny_model / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    (tiny_model / "model.safetensors.index.json").write_text(json.dumps(index))
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    with pytest.raises(MalformedArtifactError, match="ghost"):
        verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_bundle_swap_between_models_fails(tmp_path: Path, key_dir: Path) -> None:
    from tests.conftest import write_tiny_model

    a = write_tiny_model(tmp_path / "a", seed=1)
    b = write_tiny_model(tmp_path / "b", seed=2)
    sign_model(a, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    shutil.copy(a / "model.sig", b / "model.sig")
    with pytest.raises(DigestMismatchError):
        verify_model(b, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_malformed_shard_refused_even_when_signed(tmp_path: Path, key_dir: Path) -> None:
    m = tmp_path / "m"
    m.mkdir()
    save_file({"w": np.ones(4, dtype=np.float32)}, str(m / "model.safetensors"))
    (m / "model.safetensors").write_bytes((m / "model.safetensors").read_bytes() + b"TRAILER")
    with pytest.raises(MalformedArtifactError, match="cover"):
        sign_model(m, _signers(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_empty_dir_and_missing_bundle(tmp_path: Path, key_dir: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(MalformedArtifactError, match="no files"):
        sign_model(tmp_path / "empty", _signers(key_dir, SignatureAlgorithm.ECDSA_P256))
    with pytest.raises(SignatureError, match="no signature bundle"):
        verify_model(tmp_path / "empty", key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))


def test_plain_oms_manifest_without_tensor_digests(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, _signers(key_dir, SignatureAlgorithm.ECDSA_P256), tensor_hash=None)
    v = verify_model(tiny_model, key_policy(key_dir, SignatureAlgorithm.ECDSA_P256))
    assert v.tensor_digests == 0 and v.tensors == 6
    assert (
        "modelsec"
        not in json.loads(
            __import__("base64").b64decode(
                json.loads((tiny_model / "model.sig").read_text())["dsseEnvelope"]["payload"]
            )
        )["predicate"]
    )


def test_a_bundle_named_dot_dot_something_inside_the_model_is_ignored(
    tiny_model: Path, key_dir: Path
) -> None:
    """`..weird.sig` lies inside the model directory: it is recorded as ignored, so verification passes."""
    bundle = tiny_model / "..weird.sig"
    sign_model(
        tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], signature_paths={0: bundle}
    )
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    assert verify_model(tiny_model, policy, bundles=[bundle]).files > 0
