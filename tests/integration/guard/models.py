"""Small real Hugging Face model directories for the runtime guard tests, generated offline.

`write_tiny_decoder` trains a byte-level BPE tokenizer (`tokenizers`) on a few sentences and saves a 2-layer
Llama-architecture causal LM with transformers' own `save_pretrained` (sharded safetensors + index), its
tokenizer files, a chat template (`chat_template.jinja`) and a `generation_config.json`: the file set a
real chat model ships.
"""

from __future__ import annotations

from pathlib import Path

TEXT = [
    "modelsec verifies weights before they reach the GPU.",
    "Every byte a serving stack uses is a verified byte.",
    "The quick brown fox jumps over the lazy dog.",
    "Signatures, digests and policies decide what loads.",
] * 8
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_tiny_decoder(out: Path, *, seed: int = 0) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    torch.manual_seed(seed)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    tok.train_from_iterator(TEXT, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    config = transformers.LlamaConfig(
        vocab_size=fast.vocab_size + 4,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = transformers.LlamaForCausalLM(config)
    model.generation_config = transformers.GenerationConfig(
        max_new_tokens=8, do_sample=False, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="20KB")
    fast.save_pretrained(out)
    return out
