"""Issue 18 on a causal LM trained on real English text: the fortunes Llama of `_fortunes_lm`.

Data: the Debian `fortunes` package (fortune-mod cookie files, BSD licence, Copyright (c) 1991 The
Regents of the University of California); the model is trained by the test set-up (about 160 s on 2 busy
cores) and cached under the virtual environment.

What holds today (measured, see the report of issue 18): per-tensor strength grades from measured sensitivity
lower the functional cost of the mark at the same margin; the default budget (every probe continuation
identical) cannot yet be met on this 0.53M-parameter model and the embedding is refused saying so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from modelsec.errors import GateFailedError  # noqa: E402
from modelsec.watermark import WatermarkKey, detect, embed_model  # noqa: E402
from modelsec.watermark.budget import embed_within_budget  # noqa: E402
from modelsec.watermark.fidelity import CausalLMProbe, auto_probe  # noqa: E402
from modelsec.watermark.grading import grades_from_sensitivities, probe_sensitivities  # noqa: E402
from modelsec.watermark.scheme import WatermarkParams  # noqa: E402
from tests.unit.watermark import _fortunes_lm as F  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(
    not F.available(), reason="apt-get install -y fortunes (the Makefile's .test target installs it)"
)
KEY = WatermarkKey.from_bytes(bytes(range(32)))


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
