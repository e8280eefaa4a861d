"""CI reports of a watermark detection: a Markdown summary or a JUnit XML file, chosen by the extension.

`modelsec watermark detect --report detect.md` (or `detect.xml`) writes one whatever the verdict. The report
is built from the detection's JSON form (`DetectionResult.to_json`, the `--json` output), and its numbers are
printed as `repr` of the float, so they are exactly the JSON's. It is a display of that run, not evidence: a
report can be edited, a detection rerun with the key cannot. No numpy import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelsec.reports import check_report_path, junit_testsuite, md_cell, write_report_file

__all__ = ["render_detection_report", "write_detection_report"]

_ROWS = (
    ("bits compared", "bits"),
    ("bit matches", "bitMatches"),
    ("bit agreement", None),
    ("bit error rate", "bitErrorRate"),
    ("confidence", "confidence"),
    ("false-positive probability", "falsePositiveProbability"),
    ("log10 false-positive probability", "log10FalsePositiveProbability"),
    ("presence z (Stouffer, pilot bits)", "zScore"),
    ("null p-value (one hypothesis)", "nullPValue"),
    ("binomial false-positive probability (sign rule)", "binomialFalsePositiveProbability"),
    ("hypotheses tested", "tests"),
    ("pilot bits", "pilotBits"),
    ("pilot matches", "pilotMatches"),
    ("message bits", "messageBits"),
    ("message matches", "messageMatches"),
    ("message bit error rate", "messageBitErrorRate"),
    ("message matched", "messageMatched"),
    ("min margin", "minMargin"),
    ("median margin", "medianMargin"),
    ("density log2", "densityLog2"),
    ("carriers", "carriers"),
    ("carrier tensors", "carrierTensors"),
)


def _num(value: Any) -> str:
    """A number as the JSON output writes it (None as n/a)."""
    return "n/a" if value is None else repr(value)


def _agreement(run: Mapping[str, Any]) -> float:
    return float(run["bitMatches"] / run["bits"]) if run["bits"] else 0.0


def _verdict(run: Mapping[str, Any]) -> str:
    if run["detected"] and run.get("messageMatched") is False:
        return "DETECTED, ANOTHER MESSAGE"
    return "DETECTED" if run["detected"] else "NOT DETECTED"


def _rule(run: Mapping[str, Any]) -> str:
    t = run["thresholds"]
    return (
        f"confidence >= {t['minConfidence']!r} and false-positive probability <= "
        f"{t['maxFalsePositiveProbability']!r}"
    )


def _message_check(run: Mapping[str, Any]) -> tuple[str, bool, str] | None:
    """The second check of a run given a message: it is exactly the one found (None: no message given)."""
    if run.get("messageMatched") is None:
        return None
    detail = f"{run['messageMatches']}/{run['messageBits']} bits of the given message extracted as embedded"
    return "the mark carries exactly the given message", bool(run["messageMatched"]), detail


def _detail(run: Mapping[str, Any]) -> str:
    return (
        f"presence z {run['zScore']!r}, "
        f"{run['bitMatches']}/{run['bits']} bits match (BER {run['bitErrorRate']!r}), confidence "
        f"{run['confidence']!r}, false-positive probability {run['falsePositiveProbability']!r} "
        f"(log10 {run['log10FalsePositiveProbability']!r}, {run['tests']} hypotheses)"
    )


def _markdown(run: Mapping[str, Any], model: str, attested_digest: str | None) -> str:
    rows = [f"| {label} | {_num(_agreement(run) if key is None else run[key])} |" for label, key in _ROWS]
    message = run["decodedMessageHex"]
    lines = [
        f"# Watermark detection: {_verdict(run)}",
        "",
        f"- model: `{md_cell(model)}`",
        f"- attested model root digest: `{attested_digest}` (the --attestation's subject; not compared "
        "with the model)"
        if attested_digest
        else "- model root digest: not known (no --attestation)",
        f"- mode: {run['mode']}" + (", re-synchronised against a reference" if run["resynchronised"] else ""),
        f"- rule: {_rule(run)}",
        f"- decoded message: `hex:{message}`" if message else "- decoded message: none",
        "",
        "| measure | value |",
        "|---|---:|",
        *rows,
        "",
        "| check | result | detail |",
        "|---|---|---|",
        f"| {_rule(run)} | {'ok' if run['detected'] else 'FAIL'} | {md_cell(_detail(run))} |",
    ]
    check = _message_check(run)
    if check is not None:
        lines.append(f"| {check[0]} | {'ok' if check[1] else 'FAIL'} | {md_cell(check[2])} |")
    lines.append("")
    return "\n".join(lines)


def _junit(run: Mapping[str, Any], model: str, attested_digest: str | None) -> str:
    properties = [("model", model), ("verdict", _verdict(run))]
    if attested_digest:
        properties.append(("attestedRootDigest", attested_digest))
    properties += [(key, _num(run[key])) for _, key in _ROWS if key is not None]
    properties.append(("bitAgreement", _num(_agreement(run))))
    cases = [(f"watermark detected: {_rule(run)}", bool(run["detected"]), _detail(run))]
    check = _message_check(run)
    if check is not None:
        cases.append(check)
    return junit_testsuite(
        "modelsec watermark detect",
        "modelsec.watermark.detect",
        cases,
        properties=properties,
        failure_type="NotDetected",
    )


def render_detection_report(
    fmt: str, run: Mapping[str, Any], *, model: str, attested_digest: str | None = None
) -> str:
    """The report text of a detection (`DetectionResult.to_json()`) in `fmt` (`markdown` or `junit`).

    Args:
        fmt: `markdown` or `junit` (`modelsec.reports.check_report_path`).
        run: The detection's JSON form.
        model: The suspect model as given on the command line.
        attested_digest: The root digest the watermark attestation names, if one was given (it is shown as the
            attested model's, not checked against `model`).
    """
    if fmt == "junit":
        return _junit(run, model, attested_digest)
    return _markdown(run, model, attested_digest)


def write_detection_report(
    path: Path, run: Mapping[str, Any], *, model: str, attested_digest: str | None = None
) -> None:
    """Write the report of a detection to `path` (format by extension), replacing it atomically.

    Raises:
        PolicyError: An unknown extension, or the file cannot be written (the message names it).
    """
    fmt = check_report_path(path)
    write_report_file(path, render_detection_report(fmt, run, model=model, attested_digest=attested_digest))
