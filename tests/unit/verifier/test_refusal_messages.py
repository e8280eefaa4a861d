"""Refusals say what is actually wrong (user trial, finding 8): each input below was refused before too, but
with a message naming another problem (a list that is a list, names called a digest, `\\udcff` for a byte,
a policy YAML error over seven lines)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations.bundle import sign_payload
from modelsec.errors import DigestMismatchError, MalformedArtifactError, PolicyError
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model
from tests.support.policies import key_policy

P256 = SignatureAlgorithm.ECDSA_P256.value


def _resigned(model: Path, key_dir: Path, mutate: Callable[[dict[str, Any]], None]) -> None:
    """Sign `model`, then change its statement and sign that with the same (trusted) key."""
    signer = load_private_key_file(key_dir / f"{P256}.key.pem")
    sign_model(model, [signer])
    bundle = json.loads((model / "model.sig").read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    mutate(statement)
    (model / "model.sig").write_bytes(sign_payload(json.dumps(statement).encode(), signer))


def test_too_many_ignore_paths_is_named_a_size_limit(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")

    def many(st: dict[str, Any]) -> None:
        st["predicate"]["serialization"]["ignore_paths"] += [f"x{i}" for i in range(5000)]

    _resigned(model, key_dir, many)
    with pytest.raises(MalformedArtifactError) as e:
        verify_model(model, key_policy(key_dir))
    assert "ignore_paths has 50" in str(e.value) and "more than the limit of 1024" in str(e.value)
    assert "must be a list" not in str(e.value)


def test_a_tensor_name_mismatch_is_not_called_a_digest(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m", shards=1)
    shard = "model-00001-of-00001.safetensors"

    def ghost(st: dict[str, Any]) -> None:
        tensors = st["predicate"]["modelsec"]["tensors"][shard]
        tensors["ghost"] = dict(next(iter(tensors.values())))

    _resigned(model, key_dir, ghost)
    with pytest.raises(DigestMismatchError) as e:
        verify_model(model, key_policy(key_dir))
    names = "layers.0.bias, layers.0.ids, layers.0.weight"
    assert str(e.value) == f"{model}/{shard}: expected tensor names ghost, {names}, got {names}"


@pytest.mark.parametrize(
    ("name", "shown", "problem"),
    [
        (b"model\xff.json", "b'model\\xff.json'", "is not valid UTF-8"),
        (b"a\x01b.json", "'a\\x01b.json'", "contains a NUL or control character"),
    ],
    ids=["non-utf8", "control"],
)
def test_an_odd_file_name_is_shown_as_its_bytes_with_the_real_reason(
    tmp_path: Path, key_dir: Path, name: bytes, shown: str, problem: str
) -> None:
    model = write_tiny_model(tmp_path / "m")
    with open(os.path.join(os.fsencode(model), name), "wb") as f:
        f.write(b"{}")
    signer = load_private_key_file(key_dir / f"{P256}.key.pem")
    with pytest.raises(MalformedArtifactError) as e:
        sign_model(model, [signer])
    message = str(e.value)
    assert f"file name {shown} {problem}" in message, message
    assert "\\udc" not in message and "must stay inside the model root" not in message


def test_a_policy_yaml_syntax_error_is_one_line_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(PolicyError) as e:
        PolicySet.from_file(path)
    assert e.value.diagnostics() == (
        f"{path}: line 2, column 1: not valid YAML/JSON: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence started at line 1, column 4)"
    )
