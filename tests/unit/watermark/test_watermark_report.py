"""`watermark detect --report`: Markdown and JUnit XML reports whose numbers are the `--json` output's."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelsec.algorithms import SignatureAlgorithm
from modelsec.cli.main import main
from modelsec.signer import generate_private_key_pem, load_private_key
from modelsec.watermark import WatermarkKey, embed_model, write_watermark_attestation

MSG = b"ACME-clf"

# Markdown table label -> field of the --json output.
FIELDS = {
    "bits compared": "bits",
    "bit matches": "bitMatches",
    "bit error rate": "bitErrorRate",
    "confidence": "confidence",
    "false-positive probability": "falsePositiveProbability",
    "log10 false-positive probability": "log10FalsePositiveProbability",
    "hypotheses tested": "tests",
    "pilot bits": "pilotBits",
    "pilot matches": "pilotMatches",
    "min margin": "minMargin",
    "median margin": "medianMargin",
    "density log2": "densityLog2",
    "carriers": "carriers",
    "carrier tensors": "carrierTensors",
}


@pytest.fixture
def key_file(tmp_path: Path, wm_key: WatermarkKey) -> Path:
    path = tmp_path / "wm.key"
    path.write_text(bytes(range(1, 33)).hex() + "\n")
    return path


@pytest.fixture
def marked(toy_model: Path, tmp_path: Path, wm_key: WatermarkKey) -> Path:
    return embed_model(toy_model, tmp_path / "marked", wm_key, MSG).out_dir


def _detect(model: Path, key_file: Path, report: Path, *extra: str) -> tuple[int, dict[str, object]]:
    r = CliRunner().invoke(
        main,
        [
            "watermark",
            "detect",
            str(model),
            "--watermark-key",
            str(key_file),
            "--report",
            str(report),
            "--json",
            *extra,
        ],
    )
    return r.exit_code, json.loads(r.output)


def _table(markdown: str) -> dict[str, str]:
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.parametrize("which", ["marked", "unmarked"])
def test_markdown_numbers_are_the_json_output(
    which: str, marked: Path, toy_model: Path, key_file: Path, tmp_path: Path
) -> None:
    model = marked if which == "marked" else toy_model
    report = tmp_path / "detect.md"
    code, out = _detect(model, key_file, report)
    detected = which == "marked"
    assert code == (0 if detected else 1) and out["detected"] is detected
    text = report.read_text(encoding="utf-8")
    assert text.startswith(f"# Watermark detection: {'DETECTED' if detected else 'NOT DETECTED'}\n")
    table = _table(text)
    for label, field in FIELDS.items():
        assert float(table[label]) == out[field], label
    assert float(table["bit agreement"]) == out["bitMatches"] / out["bits"]  # type: ignore[operator]
    thresholds = out["thresholds"]
    assert isinstance(thresholds, dict)
    assert f"confidence >= {thresholds['minConfidence']!r}" in text
    assert f"false-positive probability <= {thresholds['maxFalsePositiveProbability']!r}" in text
    assert "model root digest: not known" in text
    assert f"| {'ok' if detected else 'FAIL'} |" in text


@pytest.mark.parametrize("which", ["marked", "unmarked"])
def test_junit_has_a_failure_iff_not_detected(
    which: str, marked: Path, toy_model: Path, key_file: Path, tmp_path: Path
) -> None:
    model = marked if which == "marked" else toy_model
    report = tmp_path / "detect.xml"
    code, out = _detect(model, key_file, report, "--message", MSG.decode())
    suite = ET.parse(report).getroot()
    assert suite.tag == "testsuite"
    failures = suite.findall("testcase/failure")
    # Two checks with a message given: the mark is present, and it carries exactly that message.
    assert len(suite.findall("testcase")) == 2 and out["messageMatched"] is out["detected"]
    assert len(failures) == (0 if out["detected"] else 2) and int(suite.get("failures", "")) == len(failures)
    assert code == (1 if failures else 0)
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props["verdict"] == ("DETECTED" if out["detected"] else "NOT DETECTED")
    for field in ("bits", "bitMatches", "confidence", "falsePositiveProbability", "messageBits"):
        assert float(props[field] or "nan") == out[field], field


def test_report_names_the_attested_root_digest(
    toy_model: Path, tmp_path: Path, wm_key: WatermarkKey, key_file: Path
) -> None:
    result = embed_model(toy_model, tmp_path / "marked", wm_key, MSG)
    signer = load_private_key(generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)[0], name="ci")
    digest, attestation = write_watermark_attestation(result, signer, tmp_path / "marked.watermark.json")
    report = tmp_path / "detect.md"
    code, _ = _detect(result.out_dir, key_file, report, "--attestation", str(attestation))
    assert code == 0
    assert f"attested model root digest: `sha256:{digest.removeprefix('sha256:')}`" in report.read_text()


def test_wrong_extension_is_a_usage_error_before_any_work(tmp_path: Path) -> None:
    report = tmp_path / "detect.txt"
    r = CliRunner().invoke(
        main,
        [
            "watermark",
            "detect",
            str(tmp_path / "absent"),
            "--watermark-key",
            str(tmp_path / "absent.key"),
            "--report",
            str(report),
        ],
    )
    assert r.exit_code == 2 and ".md (Markdown) or .xml (JUnit XML)" in r.output
    assert not report.exists()


def test_a_present_mark_with_another_message_fails_only_the_message_check(
    marked: Path, key_file: Path, tmp_path: Path
) -> None:
    report = tmp_path / "detect.xml"
    other = bytes([MSG[0] ^ 1]) + MSG[1:]  # one message bit differs
    code, out = _detect(marked, key_file, report, "--message", "hex:" + other.hex())
    assert code == 1 and out["detected"] is True and out["messageMatched"] is False
    suite = ET.parse(report).getroot()
    failures = suite.findall("testcase/failure")
    assert len(failures) == 1 and "63/64 bits of the given message" in report.read_text(encoding="utf-8")
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props["verdict"] == "DETECTED, ANOTHER MESSAGE" and props["messageMatched"] == "False"
    md = tmp_path / "detect.md"
    _detect(marked, key_file, md, "--message", "hex:" + other.hex())
    assert md.read_text(encoding="utf-8").startswith("# Watermark detection: DETECTED, ANOTHER MESSAGE\n")
