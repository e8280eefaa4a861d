"""Issue 18 on a causal LM trained on real English text: the fortunes Llama of `_fortunes_lm`.

Data: the Debian `fortunes` package (fortune-mod cookie files, BSD licence, Copyright (c) 1991 The
Regents of the University of California). The model is shipped under `fixtures/fortunes-llama/` (made by
`fixtures/make_fixtures.py`; nothing trains here); the fortunes text gives the held-out perplexity.

What these tests hold (behaviour only):

* per-tensor strength grades from measured sensitivity lower the functional cost of the mark at the same
  margin; the default budget (every probe continuation identical, margin >= 1) cannot be met on this
  0.53M-parameter model and the embedding is refused saying so;
* the weakest mark `embed` tries on its own (margin 1.0, graded) is detected blind with its message, keeps
  the false-positive probability under 1e-6, and keeps held-out perplexity within issue 18's 0.5 %.

The research measurements that were tests here (the 20-key x 50-prompt identical-continuation matrix, the
strict xfail of issue 18's unmet >= 98 % target, and the near-tie/weight-noise evidence of why it is out of
reach) are `bench/bench_watermark_fidelity_lm.py`, which prints its figures.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from modelsec.errors import GateFailedError  # noqa: E402
from modelsec.watermark import WatermarkKey, detect, embed_model  # noqa: E402
from modelsec.watermark.budget import DEFAULT_MIN_KAPPA, embed_within_budget  # noqa: E402
from modelsec.watermark.fidelity import CausalLMProbe, auto_probe  # noqa: E402
from modelsec.watermark.grading import grades_from_sensitivities, probe_sensitivities  # noqa: E402
from modelsec.watermark.spread_spectrum import WatermarkParams  # noqa: E402
from tests.unit.watermark import _fortunes_lm as F  # noqa: E402

torch.set_num_threads(1)
KEY = WatermarkKey.from_bytes(bytes(range(32)))
#: Issue 18's held-out perplexity bound.
PPL_BOUND = 0.005
#: The weakest mark `embed_within_budget` tries on its own (margin `DEFAULT_MIN_KAPPA`, per-tensor grades).
WEAKEST = WatermarkParams(kappa=DEFAULT_MIN_KAPPA)


@pytest.fixture(scope="module")
def lm() -> Path:
    return F.model_dir()


@pytest.fixture(scope="module")
def probed(lm: Path) -> tuple[CausalLMProbe, dict[str, float]]:
    """The probe `embed` picks for this model, prepared, and the per-tensor grades from its sensitivities."""
    probe = auto_probe(lm)
    assert isinstance(probe, CausalLMProbe)
    probe.prepare(lm)
    sens = probe_sensitivities(probe, lm)
    assert sens is not None and "lm_head.weight" in sens
    return probe, grades_from_sensitivities(sens)


@pytest.mark.slow
def test_grades_lower_the_cost_at_the_same_margin(
    lm: Path, probed: tuple[CausalLMProbe, dict[str, float]], tmp_path: Path
) -> None:
    probe, grades = probed
    assert max(grades.values()) == 1.0 and grades["lm_head.weight"] < 0.1  # the output head is spared
    params = WatermarkParams(kappa=1.0)
    uniform = embed_model(lm, tmp_path / "uniform", KEY, b"F", params=params, careless=True)
    graded = embed_model(lm, tmp_path / "graded", KEY, b"F", params=params, grades=grades)
    lu, du = probe.loss(tmp_path / "uniform")
    lg, dg = probe.loss(tmp_path / "graded")
    print(f"WMFID|fortunes-llama|kappa=1|uniform loss={lu} drift={du:.4f}|graded loss={lg} drift={dg:.4f}")
    assert du is not None and dg is not None and dg < du
    for out, r in (("uniform", uniform), ("graded", graded)):
        blind = detect(tmp_path / out, KEY)
        assert r.detection.detected and blind.detected and blind.decoded_message == b"F"
        assert blind.false_positive_probability <= 1e-6


@pytest.mark.slow
def test_default_budget_refused_saying_which(lm: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(lm, src)
    with pytest.raises(GateFailedError, match="the fidelity budget cannot be met: 1-greedy-agreement") as e:
        embed_within_budget(src, tmp_path / "out", KEY, b"F", probe=CausalLMProbe(), steps=0)
    print(f"WMFID|fortunes-llama|refusal={e.value}")
    assert "graded" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.slow
@pytest.mark.skipif(not F.available(), reason="apt-get install -y fortunes (the held-out perplexity text)")
def test_weakest_mark_detected_blind_within_the_perplexity_bound(
    lm: Path, probed: tuple[CausalLMProbe, dict[str, float]], tmp_path: Path
) -> None:
    _, grades = probed
    key = WatermarkKey.from_bytes(hashlib.sha256(b"modelsec issue 18 key 0").digest())  # the bench's key 0
    r = embed_model(lm, tmp_path / "out", key, b"F", params=WEAKEST, grades=grades)
    assert r.detection.detected
    blind = detect(tmp_path / "out", key)  # the key only, default thresholds
    assert blind.detected and blind.decoded_message == b"F"
    assert blind.false_positive_probability <= 1e-6
    before, after = F.perplexity(lm), F.perplexity(tmp_path / "out")
    print(f"WMFID|fortunes-llama|kappa={WEAKEST.kappa:g} graded|ppl {before:.4f} -> {after:.4f}")
    assert after != before and abs(after / before - 1) <= PPL_BOUND
