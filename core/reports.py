"""The generic parts of CI reports (`--report PATH` of `gate pgd`, `watermark detect` and `release`).

A report is Markdown or JUnit XML, chosen by the file's extension; this module checks the extension, escapes
Markdown table cells, writes a JUnit `testsuite` and replaces the file atomically. What a report says is up to
its command (`modelsec.robustness.report`, `modelsec.watermark.report`). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from modelsec.errors import PolicyError

__all__ = [
    "REPORT_FORMATS",
    "JUnitCase",
    "check_report_path",
    "junit_testsuite",
    "md_cell",
    "write_report_file",
]

REPORT_FORMATS = {".md": "markdown", ".markdown": "markdown", ".xml": "junit"}
"""Report file extensions and the format each selects."""

JUnitCase = tuple[str, bool, str]
"""One JUnit test case: (name, passed, detail)."""


def check_report_path(path: Path) -> str:
    """The report format `path`'s extension selects (checked before the run, so a typo costs no run).

    Raises:
        PolicyError: The extension is neither `.md`/`.markdown` (Markdown) nor `.xml` (JUnit XML).
    """
    fmt = REPORT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise PolicyError(f"{path}: a report must end in .md (Markdown) or .xml (JUnit XML)")
    return fmt


def md_cell(text: str) -> str:
    """Text for a Markdown table cell (a `|` would end the cell, a newline the row)."""
    return text.replace("|", "\\|").replace("\n", " ")


def junit_testsuite(
    name: str,
    classname: str,
    cases: Sequence[JUnitCase],
    *,
    properties: Sequence[tuple[str, str]] = (),
    time: float | None = None,
    timestamp: str | None = None,
    failure_type: str = "GateFailed",
) -> str:
    """A JUnit XML document of one `testsuite` (cases in order, numbers as given).

    A passed case carries its detail as `system-out`, a failed one as a `failure` of `failure_type`.
    """
    attrs = {
        "name": name,
        "tests": str(len(cases)),
        "failures": str(sum(not ok for _, ok, _ in cases)),
        "errors": "0",
    }
    if time is not None:
        attrs["time"] = f"{time:.3f}"
    if timestamp is not None:
        attrs["timestamp"] = timestamp
    suite = ET.Element("testsuite", attrs)
    if properties:
        props = ET.SubElement(suite, "properties")
        for key, value in properties:
            ET.SubElement(props, "property", name=key, value=value)
    for case_name, ok, detail in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=case_name)
        if ok:
            ET.SubElement(case, "system-out").text = detail
        else:
            ET.SubElement(case, "failure", message=detail, type=failure_type).text = detail
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_report_file(path: Path, text: str) -> None:
    """Write `text` to `path` (UTF-8) through a temporary file beside it and one rename.

    Raises:
        PolicyError: The file cannot be written (the message names it).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise PolicyError(f"{path}: cannot write the report: {e.strerror}") from None
