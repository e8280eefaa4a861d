"""What `modelsec verify` says it checked (user trial 12, 13): counts, shard mode, unsigned weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def _verify(model: Path, key_dir: Path, *args: str | Path) -> tuple[int, str, str]:
    r = run_cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", *args)
    return r.returncode, r.stdout, r.stderr


def test_counts_are_singular_for_one(tmp_path: Path, key_dir: Path) -> None:
    model = tmp_path / "one"
    model.mkdir()
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(model / "model.safetensors"))
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    rc, out, err = _verify(model, key_dir)
    assert rc == 0, err
    assert ": 1 signed file, 1 tensor (1 with per-tensor digests); signed by ecdsa-p256" in out
    assert err == ""


def test_shard_verify_does_not_claim_the_root_digest(tiny_model: Path, key_dir: Path) -> None:
    root = sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]).root_digest
    rc, out, err = _verify(tiny_model, key_dir)
    assert rc == 0 and out.startswith(f"OK sha256:{root}: 6 signed files, 6 tensors"), out + err
    shard = tiny_model / "model-00002-of-00002.safetensors"
    for model, args in ((shard, ()), (tiny_model, ("--shard", shard.name))):
        rc, out, err = _verify(model, key_dir, *args)
        assert rc == 0, err
        assert root not in out
        assert out.startswith(f"OK {shard.name} (1 of 6 signed files; the others and the model root digest")
        assert "not checked): 3 tensors" in out
    rc, out, _ = _verify(shard, key_dir, "--json")
    assert rc == 0 and json.loads(out)["wholeModel"] is False
    rc, out, _ = _verify(tiny_model, key_dir, "--json")
    reply = json.loads(out)
    assert rc == 0 and reply["wholeModel"] is True and reply["warnings"] == []


def test_a_bundle_that_signs_no_weights_file_is_warned_about(tiny_model: Path, key_dir: Path) -> None:
    weights = [p.name for p in tiny_model.glob("*.safetensors")] + ["model.safetensors.index.json"]
    sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], ignore_paths=weights)
    rc, out, err = _verify(tiny_model, key_dir)
    assert rc == 0 and out.startswith("OK sha256:") and ": 3 signed files, 0 tensors" in out
    assert "warning: the verified bundle signs no weights file" in err and "unsigned" in err
    rc, out, _ = _verify(tiny_model, key_dir, "--json")
    reply = json.loads(out)
    assert rc == 0 and reply["ok"] and len(reply["warnings"]) == 1
    assert "signs no weights file" in reply["warnings"][0]
