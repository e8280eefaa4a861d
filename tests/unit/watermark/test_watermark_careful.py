"""Issue 30: the careful mark is `embed`'s default for causal LMs, judged by the metric of item 1.

On the fortunes Llama (`_fortunes_lm`, shipped under `fixtures/fortunes-llama/`; nothing trains here) the
weakest detectable mark misses the bar (its teacher-forced KL exceeds bf16 inference's), so `embed` without
options refuses with the figures and names the options that embed anyway; the careless kappa-3 mark needs
`careless=True` / `--no-fidelity-check`. Grades are cached by root digest and settings; a damaged cache is
recomputed. A bar the probe cannot bound is refused before anything is computed.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from modelsec.errors import GateFailedError, PolicyError, PolicyViolationError  # noqa: E402
from modelsec.signer import load_trusted_key  # noqa: E402
from modelsec.watermark import WatermarkKey, detect, embed_model, verify_watermark_attestation  # noqa: E402
from modelsec.watermark.careful import CAREFUL_KAPPA, CAREFUL_PROMPTS, embed_careful  # noqa: E402
from modelsec.watermark.fidelity import (  # noqa: E402
    GreedyFidelityProbe,
    _binomial_cdf,
    clopper_pearson_upper,
)
from modelsec.watermark.grading import (  # noqa: E402
    cached_grades,
    grades_from_sensitivities,
    gradient_sensitivities,
    probe_sensitivities,
)
from tests.conftest import run_cli  # noqa: E402
from tests.unit.watermark import _fortunes_lm as F  # noqa: E402

torch.set_num_threads(1)
KEY = WatermarkKey.from_bytes(bytes(range(32)))


@pytest.fixture(scope="module")
def lm() -> Path:
    return F.model_dir()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("MODELSEC_GRADES_CACHE", raising=False)
    return tmp_path / "xdg" / "modelsec" / "grades"


def _siblings(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "xdg")


def test_clopper_pearson_bound() -> None:
    for n in (16, 50, 240):
        assert math.isclose(clopper_pearson_upper(0, n), 1 - 0.05 ** (1 / n), rel_tol=1e-9)
        for k in (1, 3):
            p = clopper_pearson_upper(k, n)
            assert k / n < p < 1 and math.isclose(_binomial_cdf(k, n, p), 0.05, rel_tol=1e-6)
    # The 16-prompt probe of issue 18 bounds nothing useful; the careful probe bounds 2 % with one change.
    assert clopper_pearson_upper(0, 16) > 0.17
    assert clopper_pearson_upper(1, len(CAREFUL_PROMPTS)) <= 0.02
    with pytest.raises(PolicyError):
        clopper_pearson_upper(3, 2)


@pytest.mark.slow
def test_default_embed_refuses_the_mark_that_misses_the_bar(lm: Path, tmp_path: Path, cache: Path) -> None:
    with pytest.raises(GateFailedError) as e:
        embed_model(lm, tmp_path / "out", KEY, b"F")
    msg = str(e.value)
    print(f"WMCAREFUL|fortunes|{msg}")
    assert "misses the fidelity bar" in msg and "bf16" in msg and "240 probe prompts" in msg
    assert "--weakest-mark" in msg and "--no-fidelity-check" in msg
    assert _siblings(tmp_path) == []  # nothing written, no candidate left behind
    assert len(list(cache.glob("*.json"))) == 1  # the grades were cached


@pytest.mark.slow
def test_weakest_anyway_and_the_grades_cache(lm: Path, tmp_path: Path, cache: Path) -> None:
    first = embed_model(lm, tmp_path / "a", KEY, b"F", weakest_anyway=True)
    f = first.fidelity
    assert f is not None and f.greedy is not None and f.grades_cached is False and not f.met
    g = f.greedy
    assert first.params.kappa == CAREFUL_KAPPA and g.pairs == len(CAREFUL_PROMPTS)
    assert g.exact_unchanged <= g.tie_unchanged <= g.gated_unchanged <= g.pairs
    assert g.mean_kl > g.bf16_mean_kl  # why the bar is missed on this model
    assert f.to_json()["greedy"]["bf16MeanKl"] == g.bf16_mean_kl and f.to_json()["met"] is False
    blind = detect(tmp_path / "a", KEY)
    assert blind.detected and blind.decoded_message == b"F"

    again = embed_model(lm, tmp_path / "b", KEY, b"F", weakest_anyway=True)
    assert again.fidelity is not None and again.fidelity.grades_cached is True
    weights = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == weights

    # A cache edited without its checksum, or not JSON, is recomputed (and rewritten), not used.
    (entry,) = cache.glob("*.json")
    doc = json.loads(entry.read_text())
    doc["grades"] = {name: 1.0 for name in doc["grades"]}
    entry.write_text(json.dumps(doc))
    tampered = embed_model(lm, tmp_path / "c", KEY, b"F", weakest_anyway=True)
    assert tampered.fidelity is not None and tampered.fidelity.grades_cached is False
    assert (tmp_path / "c" / "model.safetensors").read_bytes() == weights
    assert json.loads(entry.read_text())["grades"] != doc["grades"]


def test_grades_cache_refuses_damaged_and_foreign_files(tmp_path: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, float]:
        calls.append(1)
        return {"a": 1.0, "b": 0.5}

    def grades(root: str = "ab" * 32, names: tuple[str, ...] = ("a", "b")) -> tuple[dict[str, float], bool]:
        return cached_grades(root, {"probe": "p"}, names, compute, cache_dir=tmp_path)

    assert grades() == ({"a": 1.0, "b": 0.5}, False) and grades() == ({"a": 1.0, "b": 0.5}, True)
    (entry,) = tmp_path.glob("*.json")
    good = entry.read_text()
    for bad in ("{not json", "[]", good.replace('"b": 0.5', '"b": 0.25'), good.replace("0.5", "NaN")):
        entry.write_text(bad)
        assert grades() == ({"a": 1.0, "b": 0.5}, False)
    assert grades(root="cd" * 32)[1] is False  # another model: another entry
    assert grades(names=("a",)) == ({"a": 1.0}, False)  # the grades must cover exactly the tensors asked
    assert len(calls) == 7


def test_a_bar_the_probe_cannot_bound_is_refused_first(lm: Path, tmp_path: Path, cache: Path) -> None:
    bar = (
        r"240 probe prompts bound the changed rate at 1\.240% even with none changed .* at least 2995 prompts"
    )
    with pytest.raises(PolicyError, match=bar):
        embed_careful(lm, tmp_path / "out", KEY, b"F", min_unchanged=0.999)
    assert _siblings(tmp_path) == [] and not cache.exists()
    r = run_cli("watermark", "embed", lm, "--watermark-key", _key_file(tmp_path), "-m", "F", "-o",
                tmp_path / "o", "--min-unchanged", "0.999")  # fmt: skip
    assert r.returncode == 1 and "the fidelity bar cannot be met" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "wm.key"
    path.write_text(bytes(range(32)).hex() + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.slow
def test_cli_default_and_explicit_options(lm: Path, tmp_path: Path, cache: Path, key_dir: Path) -> None:
    key = _key_file(tmp_path)
    r = run_cli("watermark", "embed", lm, "--watermark-key", key, "-m", "F", "-o", tmp_path / "o", "--json")
    assert r.returncode == 1
    err = json.loads(r.stdout)
    assert err["ok"] is False and "--weakest-mark" in json.dumps(err), err
    assert not (tmp_path / "o").exists()

    att = tmp_path / "w.watermark.json"
    signing = key_dir / "ecdsa-p256.key.pem"
    r = run_cli("watermark", "embed", lm, "--watermark-key", key, "-m", "F", "-o", tmp_path / "w",
                "--weakest-mark", "--signing-key", signing, "--attestation", att)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "MISSES the bar" in r.stdout and "grades from the cache" in r.stdout and "bf16" in r.stdout
    trusted = load_trusted_key((key_dir / "ecdsa-p256.pub.pem").read_bytes(), name="ci")
    fidelity = verify_watermark_attestation(att, [trusted], model_dir=tmp_path / "w").predicate["fidelity"]
    assert fidelity["metric"] == "gated-greedy-changed-upper-bound" and fidelity["met"] is False
    assert fidelity["greedy"]["pairs"] == len(CAREFUL_PROMPTS) and fidelity["greedy"]["bf16MeanKl"] > 0

    r = run_cli("watermark", "embed", lm, "--watermark-key", key, "-m", "F", "-o", tmp_path / "c",
                "--no-fidelity-check", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kappa"] == 3.0 and out["fidelity"] is None
    assert detect(tmp_path / "c", KEY).detected


@pytest.mark.slow
def test_gradient_grades_match_the_perturbation_grades(lm: Path) -> None:
    from modelsec.watermark.fidelity import CausalLMProbe

    probe = GreedyFidelityProbe(CAREFUL_PROMPTS[:64])
    probe.prepare(lm)
    fast = grades_from_sensitivities(gradient_sensitivities(probe.model, probe.sequences()))
    old = CausalLMProbe(CAREFUL_PROMPTS[:64])
    old.prepare(lm)
    slow = probe_sensitivities(old, lm)
    assert slow is not None
    reference = grades_from_sensitivities(slow)
    assert set(fast) == set(reference)
    worst = max(abs(math.log(fast[n] / reference[n])) for n in fast)
    print(f"WMCAREFUL|fortunes|gradient vs perturbation grades: largest ratio {math.exp(worst):.2f}")
    assert worst < math.log(2.0)


@pytest.mark.slow
def test_the_metric_gates_and_measures_against_bf16(lm: Path, tmp_path: Path) -> None:
    probe = GreedyFidelityProbe(CAREFUL_PROMPTS[:48])
    probe.prepare(lm)
    same = probe.measure([lm])
    assert same.exact_unchanged == same.pairs == 48 and same.flip_rate == 0 and same.mean_kl == 0
    assert same.perplexity_change == (0.0,) and same.bf16_flip_rate > 0 and same.bf16_mean_kl > 0
    embed_model(lm, tmp_path / "careless", KEY, b"F", careless=True)
    shutil.copytree(tmp_path / "careless", tmp_path / "careless2")
    both = probe.measure([tmp_path / "careless", tmp_path / "careless2"])
    assert both.pairs == 96 and both.exact_unchanged < both.pairs
    assert both.exact_unchanged <= both.tie_unchanged <= both.gated_unchanged
    assert len(both.perplexity_change) == 2 and both.perplexity_change[0] != 0
    # The gate is the only difference between the counts: at 0 nats every differing pair counts.
    strict = GreedyFidelityProbe(CAREFUL_PROMPTS[:48], gate_nats=0.0)
    strict.prepare(lm)
    assert strict.measure([tmp_path / "careless"]).gated_unchanged == both.exact_unchanged // 2


def test_a_link_in_the_model_is_refused_before_anything_loads(lm: Path, tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(lm, src)
    (src / "extra.json").symlink_to("/etc/hostname")
    with pytest.raises(PolicyViolationError, match=r"extra\.json"):
        embed_model(src, tmp_path / "out", KEY, b"F")
    assert _siblings(tmp_path) == ["src"] and not cache.exists()
