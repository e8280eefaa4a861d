"""`model.safetensors.index.json`: sign refuses the broken index that every verify would refuse.

The rules live once in `modelsec.modelformat.shard_index`; the signer (before hashing) and the verifier (on
the signed bytes) both call it, so sign's refusal is verify's, word for word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import MalformedArtifactError
from modelsec.modelformat.shard_index import INDEX_NAME, check_index
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
    assert check_index(raw, {SHARD1, SHARD2}, held.get, "m/index") == {"a": SHARD1, "b": SHARD2}
    with pytest.raises(MalformedArtifactError, match=r"m/index: weight_map names `a`, which .*00001"):
        check_index(raw, {SHARD1, SHARD2}, {SHARD1: set(), SHARD2: {"b"}}.get, "m/index")
