"""Re-synchronisation of every function-preserving transform of issue 30 (item 4) on a real transformers
Llama: each attack keeps the logits, the mark is found with the registered reference (and blind where the
untouched tensors still carry it), and an unmarked model under the same attack stays absent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from modelsec.errors import MalformedArtifactError
from modelsec.watermark import AttentionLayout, WatermarkKey, detect, embed_fixed

from . import _llama
from ._helpers import load_state

pytestmark = pytest.mark.slow  # builds transformers models (the import alone is seconds on a busy machine)

KEY = WatermarkKey.from_bytes(bytes(range(40, 72)))
MSG = b"ACME-llama"

#: Whether blind detection still finds the mark after the attack (True: the tensors it leaves in place carry
#: enough of the evidence; False: the reference is needed). Asserted, so the matrix in bench/README.md and
#: the module docstring of `modelsec.watermark.resync` cannot drift from the behaviour.
BLIND = {
    "MLP neurons permuted + scaled": True,
    "attention heads/KV groups permuted, RoPE pairs rotated, value/output scaled": True,
    "residual stream permuted": False,
    "dummy MLP neurons added": True,
    "all of them at once": False,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("llama")
    ref = _llama.save(_llama.llama_state(), root / "ref")
    embed_fixed(ref, root / "marked", KEY, MSG)
    return ref, root / "marked"


@pytest.mark.parametrize(("name", "attack"), _llama.TRANSFORMS, ids=[n for n, _ in _llama.TRANSFORMS])
def test_transform_is_undone_with_the_reference(
    name: str, attack: Callable[[_llama.Arrays], _llama.Arrays], models: tuple[Path, Path]
) -> None:
    ref, marked_dir = models
    marked = load_state(marked_dir)
    attacked = attack(marked)
    # Function-preserving: the real transformers forward gives the same logits.
    assert np.allclose(_llama.logits(attacked), _llama.logits(marked), atol=1e-4)
    assert any(
        attacked[k].shape != marked[k].shape or not np.array_equal(attacked[k], marked[k]) for k in marked
    )
    found = detect(attacked, KEY, message=MSG, reference=ref)
    assert found.detected and found.message_matched and found.bit_error_rate == 0 and found.resynchronised
    assert found.false_positive_probability <= 1e-9
    assert found.resync is not None and not found.resync.skipped
    # The tensors the attack changed, read alone: the attack defeats them blind, the reference restores them.
    changed = [
        k for k in marked if attacked[k].shape != marked[k].shape or not np.allclose(attacked[k], marked[k])
    ]
    assert not detect(attacked, KEY, tensors=changed).detected
    alone = detect(attacked, KEY, tensors=changed, reference=ref)
    assert alone.detected and alone.false_positive_probability <= 1e-9
    blind = detect(attacked, KEY, message=MSG)
    assert blind.detected is BLIND[name] and not blind.resynchronised
    # An unmarked model under the same attack: absent, with the unmarked reference and with the marked release
    # as the reference (re-synchronisation cannot carry the mark over).
    unmarked = attack(_llama.llama_state())
    for reference in (ref, marked_dir):
        r = detect(unmarked, KEY, message=MSG, reference=reference)
        assert not r.detected and not r.message_matched and r.log10_false_positive_probability > -6


#: SmolLM2-135M's attention in miniature: 9 query heads in 3 KV groups, a tied output head, and no
#: `head_dim` in the config (a real config may omit it: then it is hidden / heads).
GQA_TIED: dict[str, object] = {
    "vocab_size": 256,
    "hidden_size": 72,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


@pytest.mark.parametrize(("name", "attack"), _llama.TRANSFORMS, ids=[n for n, _ in _llama.TRANSFORMS])
def test_transforms_keep_the_function_of_a_gqa_model_with_a_tied_head(
    name: str, attack: Callable[..., _llama.Arrays]
) -> None:
    """The robustness bench runs these transforms on SmolLM2 with its own config.json: they must stay
    function-preserving there, not assume the small model's head geometry."""
    import torch
    import transformers

    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**GQA_TIED))
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    attacked = attack(state, cfg=GQA_TIED)
    assert "lm_head.weight" not in attacked
    assert any(
        attacked[k].shape != state[k].shape or not np.array_equal(attacked[k], state[k]) for k in state
    )
    before, after = _llama.logits(state, cfg=GQA_TIED), _llama.logits(attacked, cfg=GQA_TIED)
    assert np.allclose(after, before, atol=1e-4), name


def test_each_transform_is_reported(models: tuple[Path, Path]) -> None:
    ref, marked_dir = models
    marked = load_state(marked_dir)
    report = detect(_llama.everything(marked), KEY, reference=ref).resync
    assert report is not None and report.residual_permuted and report.attention_layers == _llama.LAYERS
    assert report.permuted == _llama.LAYERS and report.rescaled == _llama.LAYERS
    assert report.dropped_neurons == 64 * _llama.LAYERS and report.dropped_max_out_weight == 0.0
    # Without the head geometry, attention is not re-synchronised (and the mark in q/k is then lost).
    no_layout = detect(_llama.permute_attention(marked), KEY, reference=load_state(ref)).resync
    assert no_layout is not None and no_layout.attention_layers == 0


def test_unmarked_llamas_are_absent_for_several_keys() -> None:
    rng = np.random.default_rng(7)
    for seed in range(3):
        state = _llama.llama_state(seed)
        for _ in range(4):
            r = detect(state, WatermarkKey.from_bytes(rng.bytes(32)))
            assert not r.detected and r.log10_false_positive_probability > -6


@pytest.mark.parametrize(
    "config",
    [
        b"{not json",
        b"[1, 2]",
        b'{"hidden_size": 128, "num_attention_heads": "4"}',
        b'{"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 3}',
        b'{"hidden_size": 128, "num_attention_heads": 4, "head_dim": 33}',
        b'{"hidden_size": 128, "num_attention_heads": true}',
    ],
)
def test_a_malformed_reference_config_is_refused(
    config: bytes, tmp_path: Path, models: tuple[Path, Path]
) -> None:
    ref, marked_dir = models
    bad = tmp_path / "ref"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((ref / "model.safetensors").read_bytes())
    (bad / "config.json").write_bytes(config)
    with pytest.raises(MalformedArtifactError, match=r"config\.json"):
        detect(marked_dir, KEY, reference=bad)
    assert AttentionLayout.from_config(ref) == AttentionLayout(heads=4, kv_heads=2, head_dim=32)


def test_non_finite_weights_do_not_break_resynchronisation(models: tuple[Path, Path]) -> None:
    """NaN and infinities in the suspect (or the reference) read as 0 for matching, as for extraction."""
    ref, marked_dir = models
    attacked = _llama.everything(load_state(marked_dir))
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
        attacked[name][0, :3] = [np.nan, np.inf, -np.inf]
    attacked["model.layers.1.mlp.gate_proj.weight"][:] = np.nan
    found = detect(attacked, KEY, message=MSG, reference=ref)
    assert found.detected and found.false_positive_probability <= 1e-9 and found.resynchronised
