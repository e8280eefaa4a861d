"""A small causal language model trained on real English text from a Debian package, shipped as a fixture.

Data: the `fortunes` Debian package (fortune-mod 1.99.1 cookie files under /usr/share/games/fortunes,
installed by the Makefile's `.test` target), BSD licence (3-clause: Copyright (c) 1991 The Regents of the
University of California; see /usr/share/doc/fortunes/copyright). Only prose files are used (no ASCII art,
no offensive set). Every 10th fortune is held out: the prompts and the perplexity text come from those.

Model: a byte-level BPE tokenizer (1024 tokens, trained on the training fortunes with `tokenizers`) and a
3-layer `LlamaForCausalLM` (hidden 96, 0.53M parameters) trained with AdamW for a fixed number of steps on
one thread (deterministic for a given torch build). Nothing trains in a test: `fixtures/make_fixtures.py`
ran `_train` once and the result is committed under `fixtures/fortunes-llama/` (2.1 MB; digests in
`fixtures/SHA256SUMS`). The fortunes text is still read for the held-out prompts and the perplexity.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tests.unit.watermark._helpers import fixture_dir

FORTUNES = Path("/usr/share/games/fortunes")
FILES = (
    "fortunes", "wisdom", "literature", "people", "humorists", "science", "education", "work",
    "love", "platitudes", "politics", "law", "food", "medicine", "sports", "pets", "men-women",
)  # fmt: skip
VOCAB = 1024
SEQ = 96
BATCH = 16
STEPS = 300
SEED = 1234


def available() -> bool:
    return all((FORTUNES / f).is_file() for f in FILES)


def fortunes() -> tuple[list[str], list[str]]:
    """(training fortunes, held-out fortunes): every 10th is held out."""
    texts: list[str] = []
    for name in FILES:
        raw = (FORTUNES / name).read_text("utf-8", errors="replace")
        for chunk in raw.split("\n%\n"):
            t = " ".join(chunk.replace("\t", " ").split())
            if 40 <= len(t) <= 600 and t.isascii():
                texts.append(t)
    return [t for i, t in enumerate(texts) if i % 10], [t for i, t in enumerate(texts) if not i % 10]


def held_out_prompts(n: int = 50, words: int = 6) -> list[str]:
    """The first `words` words of `n` held-out fortunes long enough to continue."""
    _, held = fortunes()
    out = [" ".join(t.split()[:words]) for t in held if len(t.split()) >= words + 8]
    return out[:n]


def _train(dst: Path, steps: int = STEPS) -> None:
    """Train the model and write it to `dst` (run by `fixtures/make_fixtures.py`, never by a test)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    train, _ = fortunes()
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    eos = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for t in train:
        ids.extend(tok.encode(t).ids)
        ids.append(eos)
    data = torch.tensor(ids, dtype=torch.long)

    torch.manual_seed(SEED)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=256,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=gen)
        batch = torch.stack([data[s : s + SEQ] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    model.generation_config.pad_token_id = eos
    model.save_pretrained(str(dst), safe_serialization=True)
    fast.save_pretrained(str(dst))


def model_dir() -> Path:
    """The shipped model directory (config, safetensors weights, tokenizer), its digests checked."""
    return fixture_dir("fortunes-llama")


def perplexity(model_dir: Path, texts: list[str] | None = None) -> float:
    """Token-level perplexity of the model on the held-out fortunes (float32, no gradient)."""
    import torch
    import transformers

    if texts is None:
        texts = fortunes()[1]
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), use_safetensors=True, dtype=torch.float32
    )
    model.eval()
    ids: list[int] = []
    for t in texts:
        ids.extend(tok(t)["input_ids"])
        ids.append(tok.eos_token_id)
    data = torch.tensor(ids[: (len(ids) // SEQ) * SEQ]).view(-1, SEQ)
    total = 0.0
    with torch.no_grad():
        for chunk in data.split(64):
            total += float(model(input_ids=chunk, labels=chunk).loss) * chunk.shape[0]
    return math.exp(total / data.shape[0])
