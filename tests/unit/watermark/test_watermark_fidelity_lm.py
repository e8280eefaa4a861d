"""Issue 18 on a causal LM trained on real English text: the fortunes Llama of `_fortunes_lm`.

Data: the Debian `fortunes` package (fortune-mod cookie files, BSD licence, Copyright (c) 1991 The
Regents of the University of California); the model is trained by the test set-up (about 125-160 s on 2 busy
cores) and cached under the virtual environment.

What holds today (measured on this shared 2-core machine; `WMFID|...` lines print the figures):

* per-tensor strength grades from measured sensitivity lower the functional cost of the mark at the same
  margin; the default budget (every probe continuation identical, margin >= 1) cannot be met on this
  0.53M-parameter model and the embedding is refused saying so;
* the weakest mark `embed` tries on its own (margin 1.0, graded), over 20 keys x the 50 held-out prompts
  (16 greedy tokens each): 796 / 1000 prompt x key pairs identical (issue 18 asks >= 980: not met, the test
  of that target is a strict xfail), held-out perplexity 75.347 -> 75.344..75.402 (largest change 0.072 %,
  within the 0.5 % asked), every key detected blind with its message, false-positive probability 3.5e-18
  (bound 1e-9; the issue asks <= 1e-6). The changed pairs are listed by the slow test's `WMFID` line; prompt
  0 and 15 change for most keys (prompt 15 changes under relative weight noise of 1e-4 already);
* why no mark that keeps the false-positive bound can reach 98 % on this model (the last test): 6 of the 50
  held-out prompts have a top-1/top-2 logit gap under 1e-3 nats somewhere in their 16 greedy tokens (the
  smallest 4.5e-5), and relative Gaussian noise of 1e-3 per weight (relative L2 change 0.001) already changes
  13 / 250 prompt x seed pairs (5.2 %), while the weakest mark's relative L2 change is 0.021 (about 0.010 even
  at margin 0: 72 code bits over 0.53M weights, each moved by about one host standard deviation).
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from modelsec.errors import GateFailedError, PolicyError  # noqa: E402
from modelsec.watermark import WatermarkKey, detect, embed_model  # noqa: E402
from modelsec.watermark.budget import DEFAULT_MIN_KAPPA, embed_within_budget  # noqa: E402
from modelsec.watermark.fidelity import CausalLMProbe, auto_probe  # noqa: E402
from modelsec.watermark.grading import grades_from_sensitivities, probe_sensitivities  # noqa: E402
from modelsec.watermark.spread_spectrum import WatermarkParams  # noqa: E402
from tests.unit.watermark import _fortunes_lm as F  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(
    not F.available(), reason="apt-get install -y fortunes (the Makefile's .test target installs it)"
)
KEY = WatermarkKey.from_bytes(bytes(range(32)))
#: Regression floor under the measured 79.6 % (20 keys) / 84 % (2 keys) identical pairs at the weakest mark.
MEASURED_IDENTICAL_FLOOR = 0.75
#: Issue 18's perplexity bound (measured: 0.072 % at most over 20 keys).
PPL_BOUND = 0.005
NOT_MET = (
    "issue 18 asks >= 980 / 1000 identical prompt x key pairs; measured 796 / 1000 at margin 1.0 graded (and "
    "about 85 % at margin 0.25): greedy decoding of this 0.53M-parameter model has near-ties that any mark "
    "keeping the false-positive bound crosses (relative weight noise 20x smaller than the weakest mark "
    "already changes 5 % of the pairs; see test_the_target_is_below_what_tiny_weight_noise_keeps)"
)


@pytest.fixture(scope="module")
def lm() -> Path:
    path, seconds = F.trained_model()
    print(f"WMFID|fortunes-llama|trained_s={seconds:.1f}|dir={path}")
    assert seconds <= 180  # issue 18: at most 3 minutes on 2 cores (0 when cached)
    return path


def test_grades_lower_the_cost_at_the_same_margin(lm: Path, tmp_path: Path) -> None:
    probe = auto_probe(lm)
    assert isinstance(probe, CausalLMProbe)
    probe.prepare(lm)
    sens = probe_sensitivities(probe, lm)
    assert sens is not None and "lm_head.weight" in sens
    grades = grades_from_sensitivities(sens)
    assert max(grades.values()) == 1.0 and grades["lm_head.weight"] < 0.1  # the output head is spared
    params = WatermarkParams(kappa=1.0)
    uniform = embed_model(lm, tmp_path / "uniform", KEY, b"F", params=params)
    graded = embed_model(lm, tmp_path / "graded", KEY, b"F", params=params, grades=grades)
    lu, du = probe.loss(tmp_path / "uniform")
    lg, dg = probe.loss(tmp_path / "graded")
    print(f"WMFID|fortunes-llama|kappa=1|uniform loss={lu} drift={du:.4f}|graded loss={lg} drift={dg:.4f}")
    assert du is not None and dg is not None and dg < du
    for out, r in (("uniform", uniform), ("graded", graded)):
        blind = detect(tmp_path / out, KEY)
        assert r.detection.detected and blind.detected and blind.decoded_message == b"F"
        assert blind.false_positive_probability <= 1e-6


def test_default_budget_refused_saying_which(lm: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(lm, src)
    with pytest.raises(GateFailedError, match="the fidelity budget cannot be met: 1-greedy-agreement") as e:
        embed_within_budget(src, tmp_path / "out", KEY, b"F", probe=CausalLMProbe(), steps=0)
    print(f"WMFID|fortunes-llama|refusal={e.value}")
    assert "graded" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# --- the issue's fidelity matrix: held-out prompts x random keys --------------------------------------------

#: Prompts the marked model is evaluated on: the first 6 words of 50 held-out fortunes (never in the training
#: text, and not the probe set `embed` budgets with, which is `fidelity.DEFAULT_PROBE_TEXTS`).
EVAL_PROMPTS = F.held_out_prompts(50) if F.available() else []
EVAL_NEW_TOKENS = 16
#: The weakest mark `embed_within_budget` tries on its own (margin `DEFAULT_MIN_KAPPA`, per-tensor grades).
WEAKEST = WatermarkParams(kappa=DEFAULT_MIN_KAPPA)


def _key(i: int) -> WatermarkKey:
    return WatermarkKey.from_bytes(hashlib.sha256(b"modelsec issue 18 key %d" % i).digest())


@dataclass
class _Matrix:
    keys: int
    changed: list[tuple[int, int]]  # (prompt index, key index) whose continuation changed
    ppl_before: float
    ppl_after: list[float]
    max_fpr: float
    detected: int
    decoded: int
    # keys whose graded mark exceeded the relative-change cap (embedded ungraded, as the search would)
    ungraded: list[int] = field(default_factory=list)

    @property
    def identical(self) -> int:
        return self.keys * len(EVAL_PROMPTS) - len(self.changed)

    @property
    def max_ppl_change(self) -> float:
        return max(abs(p / self.ppl_before - 1) for p in self.ppl_after)

    def summary(self) -> str:
        return (
            f"WMFID|fortunes-llama|kappa={WEAKEST.kappa:g} graded|pairs identical={self.identical}/"
            f"{self.keys * len(EVAL_PROMPTS)}|changed (prompt,key)={self.changed}|ppl before="
            f"{self.ppl_before:.4f} after={min(self.ppl_after):.4f}..{max(self.ppl_after):.4f} max rel "
            f"change={self.max_ppl_change:.4%}|detected={self.detected}/{self.keys} message={self.decoded}/"
            f"{self.keys}|max FPR={self.max_fpr:.3g}|ungraded keys={self.ungraded}"
        )


def _matrix(lm: Path, work: Path, keys: int) -> _Matrix:
    probe = CausalLMProbe()  # the probe set `embed` budgets with, not the evaluation prompts
    probe.prepare(lm)
    sens = probe_sensitivities(probe, lm)
    assert sens is not None
    grades = grades_from_sensitivities(sens)
    held_out = CausalLMProbe(EVAL_PROMPTS, new_tokens=EVAL_NEW_TOKENS)
    held_out.prepare(lm)
    m = _Matrix(keys, [], F.perplexity(lm), [], 0.0, 0, 0)
    for i in range(keys):
        out = work / f"key{i}"
        try:
            embed_model(lm, out, _key(i), b"F", params=WEAKEST, grades=grades)
        except PolicyError:  # a bit would move its top-graded carriers > 25 %: the search tries ungraded
            m.ungraded.append(i)
            embed_model(lm, out, _key(i), b"F", params=WEAKEST)
        changed, _ = held_out.compare(out)
        m.changed.extend((p, i) for p in changed)
        m.ppl_after.append(F.perplexity(out))
        blind = detect(out, _key(i))  # blind: the key only, default thresholds (false positives <= 1e-9)
        m.detected += blind.detected
        m.decoded += blind.decoded_message == b"F"
        m.max_fpr = max(m.max_fpr, blind.false_positive_probability)
        shutil.rmtree(out)
    print(m.summary())
    return m


def test_held_out_fidelity_two_keys(lm: Path, tmp_path: Path) -> None:
    """Default-suite slice of the matrix (2 keys): detected blind, perplexity within 0.5 %, no regression."""
    m = _matrix(lm, tmp_path, 2)
    assert m.detected == m.decoded == 2 and m.max_fpr <= 1e-6
    assert m.identical >= MEASURED_IDENTICAL_FLOOR * 2 * len(EVAL_PROMPTS)
    assert m.max_ppl_change <= PPL_BOUND


@pytest.fixture(scope="module")
def matrix(lm: Path, tmp_path_factory: pytest.TempPathFactory) -> _Matrix:
    return _matrix(lm, tmp_path_factory.mktemp("matrix"), 20)


@pytest.mark.slow
def test_twenty_keys_detected_with_false_positives_below_1e6(matrix: _Matrix) -> None:
    assert matrix.detected == matrix.decoded == 20 and matrix.max_fpr <= 1e-6
    assert matrix.identical >= MEASURED_IDENTICAL_FLOOR * 20 * len(EVAL_PROMPTS)
    assert matrix.max_ppl_change <= PPL_BOUND


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=NOT_MET)
def test_twenty_keys_issue_target(matrix: _Matrix) -> None:
    """Issue 18's target: >= 98 % of prompt x key pairs identical (perplexity is checked above)."""
    assert matrix.identical >= 0.98 * 20 * len(EVAL_PROMPTS)


# --- why the 98 % target is out of reach on this model for any mark that keeps the false-positive bound ---

NOISE_SEEDS = 5
NOISE_RELATIVE = 1e-3


def _top2_margins(lm: Path) -> list[float]:
    """Per held-out prompt, the smallest top-1 minus top-2 logit gap (nats) along its greedy continuation."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(lm))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(lm), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in EVAL_PROMPTS:
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            gaps = []
            for _ in range(EVAL_NEW_TOKENS):
                top = model(input_ids=ids).logits[0, -1].topk(2)
                gaps.append(float(top.values[0] - top.values[1]))
                ids = torch.cat([ids, top.indices[:1].view(1, 1)], dim=1)
            out.append(min(gaps))
    return out


def _noisy_copy(lm: Path, out: Path, seed: int) -> None:
    """`lm` with every eligible weight times (1 + N(0, NOISE_RELATIVE**2)), written as float32."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(lm, out)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(lm / "model.safetensors"))
    for name, w in weights.items():
        if w.dim() >= 2:
            weights[name] = w * (1 + NOISE_RELATIVE * torch.randn(w.shape, generator=gen))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.slow
def test_the_target_is_below_what_tiny_weight_noise_keeps(lm: Path, tmp_path: Path) -> None:
    """Issue 18's >= 98 % cannot be met on this model by a mark that moves the weights at all (evidence).

    The held-out continuations contain near-ties: several prompts have a top-2 logit gap under 1e-3 nats
    somewhere in their 16 greedy tokens (one is an exact tie in float32). Relative Gaussian noise of 1e-3
    per weight (relative L2 change 1e-3) already changes more than 2 % of the prompt x seed pairs, while the
    weakest mark that keeps the false-positive bound needs a relative L2 change several times larger (the
    informed embedding must move each of the 72 code bits' correlations by about one host standard
    deviation). Measured: 6 prompts under 1e-3 nats; see the `WMFID|...|noise` line for the rest.
    """
    margins = _top2_margins(lm)
    near_ties = sorted(i for i, m in enumerate(margins) if m < 1e-3)
    held_out = CausalLMProbe(EVAL_PROMPTS, new_tokens=EVAL_NEW_TOKENS)
    held_out.prepare(lm)
    changed = 0
    for seed in range(NOISE_SEEDS):
        _noisy_copy(lm, tmp_path / f"noise{seed}", seed)
        changed += len(held_out.compare(tmp_path / f"noise{seed}")[0])
    mark = embed_model(lm, tmp_path / "mark", KEY, b"F", params=WEAKEST)
    print(
        f"WMFID|fortunes-llama|noise relative {NOISE_RELATIVE:g}: {changed}/"
        f"{NOISE_SEEDS * len(EVAL_PROMPTS)} pairs changed|prompts with a top-2 gap < 1e-3 nats: "
        f"{near_ties} (smallest {min(margins):.2g})|"
        f"weakest mark relative L2 change {mark.relative_l2_change:.4f}"
    )
    assert len(near_ties) >= 2
    assert changed > 0.02 * NOISE_SEEDS * len(EVAL_PROMPTS)
    assert mark.relative_l2_change > 2 * NOISE_RELATIVE and mark.detection.detected
