"""`sign` refuses to write a bundle that verifiers refuse by default (user trial 2: a 93,696-tensor MoE signed
with exit 0 into a 22.8 MB bundle that `verify` then refused at its 16 MiB limit)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.policy import Policy
from modelsec.signer import generate_private_key_pem, load_private_key, sign_model
from modelsec.verifier import verify_model


def _many_tensors(root: Path, n: int) -> Path:
    root.mkdir()
    save_file({f"model.layers.{i}.mlp.experts.weight": np.zeros(2, np.float32) for i in range(n)},
              str(root / "model.safetensors"))  # fmt: skip
    return root


def test_a_bundle_over_the_limit_is_not_written_and_says_what_shrinks_it(tmp_path: Path) -> None:
    model = _many_tensors(tmp_path / "m", 2000)  # ~0.5 MB of per-tensor digests
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    key = load_private_key(private, name="ci")
    small = Limits(max_bundle_bytes=256 * 1024)
    with pytest.raises(MalformedArtifactError) as refused:
        sign_model(model, [key], limits=small)
    message = str(refused.value)
    assert message.startswith(f"{model / 'model.sig'}: the bundle would be ")
    assert "over the 262144 bytes verifiers accept by default (limits.maxBundleBytes)" in message
    assert "per-tensor digests of 2000 tensors take most of it: sign with --tensor-digest none" in message
    assert not (model / "model.sig").exists()
    # Without per-tensor digests the same model fits; signed with a larger limit, a verifier at the small
    # one names the policy field that raises it.
    assert sign_model(model, [key], limits=small, tensor_hash=None).files == 1  # tensors: not recorded
    sign_model(model, [key], force=True)
    (tmp_path / "ci.pub.pem").write_bytes(public)
    policy = Policy.from_key_files([tmp_path / "ci.pub.pem"])
    with pytest.raises(
        MalformedArtifactError, match=r"exceeds 262144 bytes \(limits\.maxBundleBytes of the policy"
    ):
        verify_model(model, dataclasses.replace(policy, limits=small))
    assert verify_model(model, policy).tensors == 2000
