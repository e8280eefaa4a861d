"""The gate's classifier: verified first, built from the hashed bytes, architecture never from the dir."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from modelsec.errors import (  # noqa: E402
    DigestMismatchError,
    FileSetMismatchError,
    PolicyError,
    PolicyViolationError,
    SignatureError,
)
from modelsec.robustness import load_verified_model  # noqa: E402
from modelsec.verifier import verify_model  # noqa: E402
from tests.support.policies import key_policy  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402


@pytest.fixture
def signed_mlp(tmp_path: Path, key_dir: Path) -> Path:
    return h.signed_model_dir(
        tmp_path / "digits-mlp", h.trained_mlp().state_dict(), key_dir / "ecdsa-p256.key.pem"
    )


def test_loads_verified_weights_into_the_factory(signed_mlp: Path, key_dir: Path) -> None:
    loaded = load_verified_model(signed_mlp, key_policy(key_dir), "digits_models:digits_mlp")
    assert loaded.root_digest == verify_model(signed_mlp, key_policy(key_dir)).root_digest
    assert loaded.model_name == "digits-mlp" and loaded.weights == ("model.safetensors",)
    assert not loaded.module.training
    assert all(not p.requires_grad for p in loaded.module.parameters())
    ref = h.trained_mlp()
    assert all(
        torch.equal(a, b)
        for a, b in zip(ref.state_dict().values(), loaded.module.state_dict().values(), strict=True)
    )


def test_sharded_weights_are_merged(tmp_path: Path, key_dir: Path) -> None:
    state = h.trained_mlp().state_dict()
    root = tmp_path / "sharded"
    root.mkdir()
    names = list(state)
    save_file({k: state[k].contiguous() for k in names[:2]}, str(root / "model-00001-of-00002.safetensors"))
    save_file({k: state[k].contiguous() for k in names[2:]}, str(root / "model-00002-of-00002.safetensors"))
    from modelsec.signer import load_private_key_file, sign_model

    sign_model(root, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    loaded = load_verified_model(root, key_policy(key_dir), "digits_models:digits_mlp")
    assert loaded.weights == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def test_tampered_weights_are_refused_before_loading(signed_mlp: Path, key_dir: Path) -> None:
    path = signed_mlp / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match=r"model\.safetensors"):
        load_verified_model(signed_mlp, key_policy(key_dir), "digits_models:digits_mlp")


def test_weights_swapped_after_verification_are_caught_at_load(signed_mlp: Path, key_dir: Path) -> None:
    """The TOCTOU case: the bytes loaded are the bytes hashed and compared with the signed digest."""
    verify_model(signed_mlp, key_policy(key_dir))
    other = h.trained_mlp().state_dict()
    save_file({k: (v + 1).contiguous() for k, v in other.items()}, str(signed_mlp / "model.safetensors"))
    with pytest.raises(DigestMismatchError):
        load_verified_model(signed_mlp, key_policy(key_dir), "digits_models:digits_mlp")


def test_untrusted_key_and_extra_files_are_refused(signed_mlp: Path, key_dir: Path) -> None:
    with pytest.raises(SignatureError):
        load_verified_model(signed_mlp, key_policy(key_dir, "other"), "digits_models:digits_mlp")
    (signed_mlp / "evil.safetensors").write_bytes(b"x")
    with pytest.raises(FileSetMismatchError):
        load_verified_model(signed_mlp, key_policy(key_dir), "digits_models:digits_mlp")


def test_architecture_mismatch_is_a_setup_error(signed_mlp: Path, key_dir: Path) -> None:
    with pytest.raises(PolicyError, match="does not match the verified weights"):
        load_verified_model(signed_mlp, key_policy(key_dir), "digits_models:digits_cnn")
    with pytest.raises(PolicyError, match="import path"):
        load_verified_model(signed_mlp, key_policy(key_dir), "not an import path")
    with pytest.raises(PolicyError, match="cannot import"):
        load_verified_model(signed_mlp, key_policy(key_dir), "no_such_pkg_abc:factory")


def test_architecture_code_inside_the_model_dir_is_never_imported(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "m"
    h.signed_model_dir(model, h.trained_mlp().state_dict(), key_dir / "ecdsa-p256.key.pem")
    # A module next to the weights (unsigned, so verification would refuse the directory anyway) ...
    outside = tmp_path / "copy"
    shutil.copytree(model, outside)
    (outside / "evil_arch_mod.py").write_text(
        "import pathlib\npathlib.Path('MARKER').write_text('ran')\ndef f():\n    raise SystemExit\n"
    )
    monkeypatch.syspath_prepend(str(outside))
    monkeypatch.chdir(tmp_path)
    from modelsec.robustness.model_loading import build_classifier

    with pytest.raises(PolicyViolationError, match="model directory"):
        build_classifier("evil_arch_mod:f", {}, forbid_under=outside)
    assert not (tmp_path / "MARKER").exists()
