"""`verify` and the loader apply every policy that matches a model, as admission does (issue 17 item 3).

Before, `PolicySet.for_model` took the first match: a second policy naming the same models (another key, a
required algorithm, stricter refusals) was silently ignored.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from modelsec.errors import PolicyViolationError, SignatureError
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model

TWO_POLICIES = """
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: ci
    match: ["file://ROOT/**"]
    keys: [KEYS/ecdsa-p256.pub.pem]
  - name: release-board
    match: ["file://ROOT/tiny-*"]
    keys: [KEYS/sm2.pub.pem]
    requireAlgorithms: [sm2]
noMatch: deny
"""


def _policies(tmp_path: Path, key_dir: Path, model: Path, extra: str = "") -> PolicySet:
    path = tmp_path / "policy.yaml"
    body = TWO_POLICIES.replace("KEYS", str(key_dir)).replace("ROOT", os.path.realpath(model.parent))
    path.write_text(body + extra)
    return PolicySet.from_file(path)


def _sign(model: Path, key_dir: Path, *algs: str) -> None:
    sign_model(model, [load_private_key_file(key_dir / f"{a}.key.pem") for a in algs])


def test_a_second_matching_policy_must_pass_too(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    ps = _policies(tmp_path, key_dir, tiny_model)
    _sign(tiny_model, key_dir, "ecdsa-p256")  # what the first policy asks for, not the second
    with pytest.raises(SignatureError):
        verify_model(tiny_model, ps.for_model(tiny_model))
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    result = verify_model(tiny_model, ps.for_model(tiny_model))
    assert {b.algorithm.value for b in result.bundles} == {"ecdsa-p256"}  # the first policy's bundles hash
    # A model only the first policy matches is verified under that one alone.
    other = tiny_model.parent / "other-model"
    tiny_model.rename(other)
    _sign(other, key_dir, "ecdsa-p256")
    assert verify_model(other, ps.for_model(other)).root_digest


def test_the_strictest_local_rules_apply(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    ps = _policies(tmp_path, key_dir, tiny_model)
    relaxed = ps.entries[0].policy
    assert ps.for_model(tiny_model.parent / "other").also == ()
    text = (tmp_path / "policy.yaml").read_text()
    (tmp_path / "policy.yaml").write_text(
        text.replace("  - name: ci\n", "  - name: ci\n    allowRemoteCode: true\n    limits: {maxFiles: 8}\n")
    )
    ps = PolicySet.from_file(tmp_path / "policy.yaml")
    both = ps.for_model(tiny_model)
    assert ps.entries[0].policy.allow_remote_code and not both.allow_remote_code
    assert both.limits.max_files == 8 and both.limits.max_depth == relaxed.limits.max_depth
    (tiny_model / "modeling.py").write_text("print('remote code')\n")
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    verify_model(tiny_model, ps.entries[0].policy)  # the first policy alone allows it
    with pytest.raises(PolicyViolationError, match=r"remote code|\.py"):
        verify_model(tiny_model, both)


def test_loader_and_cli_apply_every_matching_policy(
    tiny_model: Path, key_dir: Path, tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from modelsec.verifier import load_model, open_model

    ps = _policies(tmp_path, key_dir, tiny_model)
    _sign(tiny_model, key_dir, "ecdsa-p256")
    with pytest.raises(SignatureError):
        load_model(tiny_model, ps)
    with pytest.raises(SignatureError):
        open_model(tiny_model, ps)
    out = cli("verify", tiny_model, "--policy", tmp_path / "policy.yaml")
    assert out.returncode == 1, out.stdout + out.stderr
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    assert load_model(tiny_model, ps)
    out = cli("verify", tiny_model, "--policy", tmp_path / "policy.yaml")
    assert out.returncode == 0, out.stderr
