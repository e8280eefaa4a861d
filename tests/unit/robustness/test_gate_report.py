"""`modelsec gate pgd --report`: Markdown or JUnit XML with the run's numbers, whatever the verdict."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from modelsec.cli.main import main  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402
from tests.unit.robustness.test_cli_gate import _args, _replace  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gate-report")
    model = h.signed_model_dir(root / "cnn", h.trained_cnn().state_dict(), key_dir / "ecdsa-p256.key.pem")
    _, _, x, y = h.digits()
    np.savez(root / "d.npz", inputs=x[:30].numpy(), labels=y[:30].numpy())
    return model, root / "d.npz"


def _gate(args: list[str]) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(main, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_markdown_report_has_the_runs_numbers(
    setup: tuple[Path, Path], key_dir: Path, tmp_path: Path
) -> None:
    model, data = setup
    report = tmp_path / "gate.md"
    code, doc = _gate([*_args(model, data, key_dir, tmp_path / "a.sig"), "--report", str(report)])
    assert code == 0, doc
    run = doc["result"]["results"]  # type: ignore[index]
    text = report.read_text()
    assert text.startswith("# PGD robustness gate: PASSED\n")
    assert doc["rootDigest"] in text and str(tmp_path / "a.sig") in text
    for name in ("clean", "robust"):
        r = run[name]
        row = re.search(rf"^\| {name} \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
        assert row is not None, text
        assert (int(row[1]), int(row[2])) == (r["correct"], r["total"])
        assert float(row[3]) == pytest.approx(r["accuracy"], abs=5e-5)
        assert float(row[4]) == pytest.approx(r["wilson95"][0], abs=5e-5)
        assert float(row[5]) == pytest.approx(r["wilson95"][1], abs=5e-5)
    assert "| sanity: " in text and "| ok |" in text


def test_junit_report_of_a_failed_gate(setup: tuple[Path, Path], key_dir: Path, tmp_path: Path) -> None:
    model, data = setup
    report = tmp_path / "gate.xml"
    args = _replace(_args(model, data, key_dir, tmp_path / "f.sig"), "--min-robust-accuracy", "1.0")
    code, doc = _gate([*args, "--report", str(report)])
    assert code == 1 and doc["verdict"] == "FAILED"
    suite = ET.parse(report).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert int(suite.get("tests", "0")) == len(cases) >= 2
    first = cases[0]
    assert first.get("name", "").startswith("robust accuracy (point rule) >= 1 at eps=0.03")
    failure = first.find("failure")
    robust = doc["result"]["results"]["robust"]  # type: ignore[index]
    assert failure is not None and f"{robust['correct']}/{robust['total']}" in failure.get("message", "")
    assert all(c.find("failure") is None for c in cases[1:])  # the sanity checks passed
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"rootDigest": doc["rootDigest"], "verdict": "FAILED"}


def test_unknown_report_extension_is_a_usage_error_before_the_run(
    setup: tuple[Path, Path], key_dir: Path, tmp_path: Path
) -> None:
    model, data = setup
    out = tmp_path / "x.sig"
    result = CliRunner().invoke(
        main, [*_args(model, data, key_dir, out), "--report", str(tmp_path / "r.txt")]
    )
    assert result.exit_code == 2 and ".md (Markdown) or .xml (JUnit XML)" in result.output
    assert not out.exists() and not (tmp_path / "r.txt").exists()


def test_eps_sweep_plot_and_table_match_the_run(
    setup: tuple[Path, Path], key_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib", reason="pip install 'modelsec[reports]'")
    image = pytest.importorskip("PIL.Image")
    model, data = setup
    report = tmp_path / "gate.md"
    args = [
        *_args(model, data, key_dir, tmp_path / "s.sig"),
        "--report",
        str(report),
        "--eps-sweep",
        "0.1,0.01",
    ]
    code, doc = _gate(args)
    assert code == 0, doc
    sweep = doc["epsSweep"]
    assert [p["eps"] for p in sweep] == [0.01, 0.03, 0.1]  # type: ignore[index]
    # The gate's own eps is the gate's result, not a rerun.
    assert sweep[1]["robust"] == doc["result"]["results"]["robust"]  # type: ignore[index]
    text = report.read_text()
    rows = re.findall(r"^\| ([\d.]+) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
    assert [float(r[0]) for r in rows] == [0.01, 0.03, 0.1]
    for row, point in zip(rows, sweep, strict=True):  # type: ignore[call-overload]
        robust = point["robust"]
        assert (int(row[1]), int(row[2])) == (robust["correct"], robust["total"])
        assert float(row[3]) == pytest.approx(robust["accuracy"], abs=5e-5)
        assert [float(row[4]), float(row[5])] == pytest.approx(robust["wilson95"], abs=5e-5)
    assert "![robust accuracy against eps](gate.png)" in text
    # A stronger attack cannot find fewer adversarial examples here: accuracy falls with eps.
    accuracies = [p["robust"]["accuracy"] for p in sweep]  # type: ignore[index]
    assert accuracies[0] >= accuracies[-1]
    with image.open(tmp_path / "gate.png") as png:
        png.load()
        assert png.format == "PNG" and png.size == (800, 500)
        plotted = json.loads(png.text["Description"])
    assert plotted == [
        [p["eps"], p["robust"]["correct"], p["robust"]["total"], *p["robust"]["wilson95"]]  # type: ignore[index]
        for p in sweep  # type: ignore[union-attr]
    ]


def test_eps_sweep_needs_a_report_and_positive_numbers(
    setup: tuple[Path, Path], key_dir: Path, tmp_path: Path
) -> None:
    model, data = setup
    base = _args(model, data, key_dir, tmp_path / "n.sig")
    for extra, message in (
        (["--eps-sweep", "0.1"], "--eps-sweep needs --report"),
        (["--eps-sweep", "0.1,x", "--report", str(tmp_path / "r.md")], "numbers separated by commas"),
        (["--eps-sweep", "0,0.1", "--report", str(tmp_path / "r.md")], "finite number > 0"),
    ):
        result = CliRunner().invoke(main, [*base, *extra])
        assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "n.sig").exists()


def test_eps_sweep_without_matplotlib_is_one_line_before_the_run(
    setup: tuple[Path, Path], key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the extra sees
    model, data = setup
    out = tmp_path / "m.sig"
    args = [*_args(model, data, key_dir, out), "--report", str(tmp_path / "r.md"), "--eps-sweep", "0.1"]
    code, doc = _gate(args)
    assert code == 1 and doc["error"]["kind"] == "BackendUnavailableError"  # type: ignore[index]
    assert "pip install 'modelsec[reports]'" in doc["error"]["message"]  # type: ignore[index]
    assert not out.exists() and not (tmp_path / "r.md").exists()
