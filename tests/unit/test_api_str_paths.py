"""The public API takes `str` paths wherever it takes a path (`str | os.PathLike`), converted at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.policy import Policy, PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.keys import load_trusted_key_file
from modelsec.verifier import verify_model
from tests.support.policies import write_policy_file


def test_sign_verify_and_policies_take_str_paths(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    model, key, pub = (
        str(tiny_model),
        str(key_dir / "ecdsa-p256.key.pem"),
        str(key_dir / "ecdsa-p256.pub.pem"),
    )
    signer = load_private_key_file(key)
    assert load_trusted_key_file(pub).keyid == load_trusted_key_file(Path(pub)).keyid
    signed = sign_model(model, [signer])
    assert (tiny_model / "model.sig").is_file()
    policy = Policy.from_key_files([pub])
    assert verify_model(model, policy).root_digest == signed.root_digest
    policy_file = write_policy_file(tmp_path / "policy.json", match=[f"file://{tiny_model}"], keys=[pub])
    policies = PolicySet.from_file(str(policy_file))
    assert verify_model(model, policies).root_digest == signed.root_digest


def test_loaders_take_str_paths(tiny_model: Path, key_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from modelsec.verifier import load_model
    from modelsec.verifier.guard.snapshot import open_snapshot

    sign_model(str(tiny_model), [load_private_key_file(str(key_dir / "ecdsa-p256.key.pem"))])
    policy = Policy.from_key_files([str(key_dir / "ecdsa-p256.pub.pem")])
    assert load_model(str(tiny_model), policy)
    assert open_snapshot(str(tiny_model), policy).root_digest
