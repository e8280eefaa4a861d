"""Weight indexes: sign refuses the broken index that every verify would refuse.

The rules live once in `modelsec.modelformat.shard_index`; the signer (before hashing) and the verifier (on
the signed bytes) both call it, so sign's refusal is verify's, word for word. They hold for every index at
any depth and in any naming (`*.index.json`, `*.index.<variant>.json`, pickle and safetensors indexes).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.modelformat.shard_index import INDEX_NAME, check_index, is_index_name
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from tests.support.policies import key_policy

SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _edit_index(model: Path, edit: Any) -> None:
    path = model / INDEX_NAME
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _set(tensor: str, target: object) -> Any:
    return lambda doc: doc["weight_map"].__setitem__(tensor, target)


BROKEN = [
    pytest.param(_set("layers.0.weight", "../elsewhere.safetensors"), "layers.0.weight", id="outside-target"),
    pytest.param(_set("layers.0.weight", "missing.safetensors"), "missing.safetensors", id="absent-shard"),
    pytest.param(_set("layers.0.weight", "config.json"), "config.json", id="not-safetensors"),
    pytest.param(_set("layers.0.weight", 5), "layers.0.weight", id="non-string-target"),
    pytest.param(_set("ghost", SHARD1), "`ghost`", id="tensor-not-held"),
    pytest.param(_set("layers.0.weight", SHARD2), "`layers.0.weight`", id="tensor-in-other-shard"),
    pytest.param(lambda doc: doc.pop("weight_map"), "weight_map is missing", id="no-weight-map"),
    pytest.param(lambda doc: doc.__setitem__("weight_map", [SHARD1]), "weight_map", id="weight-map-list"),
]


def _signer(key_dir: Path) -> Any:
    return load_private_key_file(key_dir / "ecdsa-p256.key.pem")


@pytest.mark.parametrize(("edit", "named"), BROKEN)
def test_sign_refuses_a_broken_index_with_verifys_reason(
    tiny_model: Path, key_dir: Path, edit: Any, named: str
) -> None:
    _edit_index(tiny_model, edit)
    with pytest.raises(MalformedArtifactError) as refused:
        sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True)
    refusal = str(refused.value)
    assert f"{tiny_model}/{INDEX_NAME}: " in refusal and named in refusal, refusal
    assert "--allow-unverifiable" in refusal
    assert not (tiny_model / "model.sig").exists()

    # Signed anyway, every verify refuses it with the same words: the refusal was not a guess.
    sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=False)
    with pytest.raises(MalformedArtifactError) as verified:
        verify_model(tiny_model, key_policy(key_dir))
    assert refusal.startswith(str(verified.value) + " (")


def test_sign_refuses_an_index_naming_an_ignored_shard(tiny_model: Path, key_dir: Path) -> None:
    with pytest.raises(MalformedArtifactError, match=rf"{INDEX_NAME}: weight_map\[`layers\.1\.\w+`\]"):
        sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True, ignore_paths=[SHARD2])


def test_a_good_sharded_model_signs_and_verifies(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True)
    result = verify_model(tiny_model, key_policy(key_dir))
    assert {SHARD1, SHARD2, INDEX_NAME} <= set(result.manifest.names)


def test_an_index_may_map_a_subset_of_the_tensors(tiny_model: Path, key_dir: Path) -> None:
    _edit_index(tiny_model, lambda doc: doc["weight_map"].pop("layers.1.ids"))
    sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True)
    verify_model(tiny_model, key_policy(key_dir))


def test_a_malformed_shard_is_refused_for_itself_not_for_the_index(tiny_model: Path, key_dir: Path) -> None:
    (tiny_model / SHARD2).write_bytes(b"\xff" * 16)
    with pytest.raises(MalformedArtifactError) as info:
        sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True)
    assert SHARD2 in str(info.value) and INDEX_NAME not in str(info.value)


def test_check_index_skips_shards_the_caller_does_not_know() -> None:
    raw = json.dumps({"weight_map": {"a": SHARD1, "b": SHARD2}}).encode()
    held = {SHARD1: {"a"}}
    assert check_index(raw, "i.index.json", {SHARD1, SHARD2}, held.get, model="m") == {
        "a": SHARD1,
        "b": SHARD2,
    }
    with pytest.raises(MalformedArtifactError, match=r"m/i.index.json: weight_map names `a`, which .*00001"):
        check_index(raw, "i.index.json", {SHARD1, SHARD2}, {SHARD1: set(), SHARD2: {"b"}}.get, model="m")


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("model.safetensors.index.json", True),
        ("pytorch_model.bin.index.json", True),
        ("model.safetensors.index.fp16.json", True),
        ("text_encoder/diffusion_pytorch_model.safetensors.index.json", True),
        ("unet/pytorch_model.bin.index.bf16.json", True),
        ("MODEL.SAFETENSORS.INDEX.JSON", True),
        ("model_index.json", False),  # a diffusers pipeline, not a weight map
        ("index.json", False),
        ("config.json", False),
        ("model.safetensors.index.json.bak", False),
    ],
)
def test_which_files_are_weight_indexes(name: str, index: bool) -> None:
    assert is_index_name(name) is index


def _write_index(path: Path, target: str, tensors: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(tensors, target)}))


def _tensors(model: Path) -> list[str]:
    return list(json.loads((model / INDEX_NAME).read_text())["weight_map"])


# (index file, target, error class, words in the refusal): each index at any depth and in any naming.
OTHER_INDEXES = [
    pytest.param("pytorch_model.bin.index.json", "/abs/pytorch_model.bin", MalformedArtifactError,
                 "is absolute", id="pickle-index-absolute"),
    pytest.param("pytorch_model.bin.index.json", "pytorch_model-00001.bin", PolicyViolationError,
                 "pickle format", id="pickle-index-pickle-shard"),
    pytest.param("text_encoder/model.safetensors.index.json", "/abs/other/model.safetensors",
                 MalformedArtifactError, "is absolute", id="subfolder-absolute"),
    pytest.param("text_encoder/model.safetensors.index.json", f"../{SHARD1}", MalformedArtifactError,
                 "'..' segment", id="subfolder-parent-shard"),
    pytest.param("model.safetensors.index.fp16.json", "../other/model.safetensors", MalformedArtifactError,
                 "'..' segment", id="variant-outside"),
    pytest.param("text_encoder/model.safetensors.index.fp16.json", "model.fp16.safetensors",
                 MalformedArtifactError, "not a signed file", id="variant-unsigned-shard"),
    pytest.param("sub/MODEL.SAFETENSORS.INDEX.JSON", "/abs/model.safetensors", MalformedArtifactError,
                 "is absolute", id="upper-case-name"),
    pytest.param("sub/x.index.json", "config.json", MalformedArtifactError, "not a weight file",
                 id="not-a-weight-file"),
]  # fmt: skip


@pytest.mark.parametrize(("index", "target", "error", "why"), OTHER_INDEXES)
def test_every_index_is_held_to_the_index_rules(
    tiny_model: Path, key_dir: Path, index: str, target: str, error: type[Exception], why: str
) -> None:
    _write_index(tiny_model / index, target, _tensors(tiny_model))
    with pytest.raises(error) as refused:
        sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True)
    assert f"{tiny_model}/{index}: weight_map[`" in str(refused.value) and why in str(refused.value)
    assert not (tiny_model / "model.sig").exists()

    sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=False)
    with pytest.raises(error) as verified:
        verify_model(tiny_model, key_policy(key_dir))
    assert str(refused.value).startswith(str(verified.value) + " (")


def test_a_pickle_index_passes_where_the_policy_allows_pickles(tiny_model: Path, key_dir: Path) -> None:
    (tiny_model / "pytorch_model-00001.bin").write_bytes(b"opaque")
    _write_index(tiny_model / "pytorch_model.bin.index.json", "pytorch_model-00001.bin", _tensors(tiny_model))
    sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=False)
    verify_model(tiny_model, dataclasses.replace(key_policy(key_dir), refuse_pickle=False))


def test_a_subfolder_index_naming_its_own_shard_verifies(tiny_model: Path, key_dir: Path) -> None:
    sub = tiny_model / "text_encoder"
    sub.mkdir()
    (sub / SHARD1).write_bytes((tiny_model / SHARD1).read_bytes())
    held = [
        t for t, s in json.loads((tiny_model / INDEX_NAME).read_text())["weight_map"].items() if s == SHARD1
    ]
    _write_index(sub / "model.safetensors.index.fp16.json", SHARD1, held)
    sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True)
    verify_model(tiny_model, key_policy(key_dir))
    # The same index naming a tensor its shard lacks is refused, as at the top level.
    _write_index(sub / "model.safetensors.index.fp16.json", SHARD1, [*held, "ghost"])
    with pytest.raises(
        MalformedArtifactError,
        match=r"text_encoder/model\.safetensors\.index\.fp16\.json: "
        r"weight_map names `ghost`, which 'text_encoder/model-00001",
    ):
        sign_model(tiny_model, [_signer(key_dir)], refuse_unverifiable=True, force=True)


def test_modelsec_verify_and_the_loader_refuse_a_subfolder_index_naming_another_model(
    tiny_model: Path, key_dir: Path, tmp_path: Path, cli: Any
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / SHARD1).write_bytes((tiny_model / SHARD1).read_bytes())
    _write_index(tiny_model / "text_encoder" / "model.safetensors.index.json", str(other / SHARD1), ["x"])
    sign_model(tiny_model, [_signer(key_dir)])
    r = cli("verify", tiny_model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem")
    assert r.returncode == 1
    assert f"text_encoder/model.safetensors.index.json: weight_map[`x`] -> '{other / SHARD1}'" in r.stderr
    assert "is absolute" in r.stderr
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from modelsec.verifier import load_model

    with pytest.raises(
        MalformedArtifactError, match=r"text_encoder/model\.safetensors\.index\.json: weight_map"
    ):
        load_model(tiny_model, key_policy(key_dir))
