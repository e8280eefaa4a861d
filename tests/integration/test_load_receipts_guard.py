"""Load receipts (issue 33) from the runtime guard (a real transformers load) and from `open_model`.

The node is a real software TPM (`tests/support/tpm.py`); the model is the guard tests' small Llama
(the architecture of `tests/integration/guard/models.py`, without its tokenizer), signed here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from modelsec.errors import BackendUnavailableError
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import open_model
from modelsec.verifier.guard import hook
from modelsec.verifier.receipts import verify_receipt
from tests.integration.test_load_receipts import _closed_port, _policy, _receipts
from tests.support.tpm import SoftwareTpm

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def decoder_src(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Path:
    """A sharded 2-layer Llama saved by transformers itself (no tokenizer: `from_pretrained` of the model
    reads only its config and weights), signed."""
    torch.set_num_threads(1)
    torch.manual_seed(33)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("decoder") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(out, max_shard_size="20KB")
    sign_model(out, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return out


@pytest.fixture
def decoder(decoder_src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(decoder_src, tmp_path / "tiny-llama"))


def _tensor_count(model: Path) -> int:
    from safetensors import safe_open

    total = 0
    for shard in model.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            total += len(list(f.keys()))
    return total


def _root(model: Path, policies: PolicySet) -> str:
    from modelsec.verifier import verify_model

    return verify_model(model, policies).root_digest


def test_a_guarded_transformers_load_emits_a_receipt_that_verifies(
    tmp_path: Path, key_dir: Path, decoder: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    policies = PolicySet.from_file(_policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}))
    monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
    monkeypatch.setenv("POD_NAME", "chat-0")
    hook.install(policies)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(decoder))
    finally:
        hook.uninstall()
    assert model is not None
    (receipt,) = _receipts(tmp_path)
    req = policies.policies[0].load_receipt
    assert req is not None
    root = _root(decoder, policies)
    verified = verify_receipt(receipt.read_bytes(), req, expected_digest=root, node="node-a")
    assert verified.receipt.root_digest == root
    assert set(verified.receipt.files) == {p.name for p in decoder.glob("*.safetensors")}
    assert len(verified.receipt.files) > 1  # sharded: one receipt for the whole load, not one per shard
    assert verified.receipt.tensors == _tensor_count(decoder)
    assert verified.receipt.device == "cpu"
    assert verified.receipt.policy_digest == policies.digest
    assert dict(verified.receipt.workload) == {"pod": "chat-0"}


def test_a_guarded_load_fails_closed_when_a_required_receipt_cannot_be_emitted(
    tmp_path: Path, key_dir: Path, decoder: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    policy = _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}, required=True)
    policies = PolicySet.from_file(policy)
    monkeypatch.setenv("TPM2TOOLS_TCTI", f"swtpm:host=127.0.0.1,port={_closed_port()}")
    model = None
    hook.install(policies)
    try:
        with pytest.raises(BackendUnavailableError, match="TPM"):
            model = transformers.AutoModelForCausalLM.from_pretrained(str(decoder))
        assert model is None
        assert _receipts(tmp_path) == []
        # The refusal was not cached as a verified snapshot: with the TPM back, the load emits its receipt.
        monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(decoder))
    finally:
        hook.uninstall()
    assert model is not None
    (receipt,) = _receipts(tmp_path)
    req = policies.policies[0].load_receipt
    assert req is not None
    assert (
        verify_receipt(receipt.read_bytes(), req, expected_digest=_root(decoder, policies)).node == "node-a"
    )


def test_open_model_emits_a_receipt_and_fails_closed_without_the_tpm(
    tmp_path: Path, key_dir: Path, decoder: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    policies = PolicySet.from_file(
        _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}, required=True)
    )
    monkeypatch.setenv("TPM2TOOLS_TCTI", f"swtpm:host=127.0.0.1,port={_closed_port()}")
    opened = None
    with pytest.raises(BackendUnavailableError, match="TPM"):
        opened = open_model(decoder, policies)
    assert opened is None
    assert _receipts(tmp_path) == []
    monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
    with open_model(decoder, policies) as view:
        names = view.keys()
    (receipt,) = _receipts(tmp_path)
    req = policies.policies[0].load_receipt
    assert req is not None
    verified = verify_receipt(receipt.read_bytes(), req, expected_digest=_root(decoder, policies))
    assert verified.receipt.tensors == len(names) == _tensor_count(decoder)
