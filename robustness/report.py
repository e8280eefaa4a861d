"""CI reports of a PGD gate run: a Markdown summary or a JUnit XML file, chosen by the file's extension.

CI systems show reports, not logs: `modelsec gate pgd --report gate.md` (or `gate.xml`) writes one beside the
signed attestation, whatever the verdict. The report is built from the run's JSON form (`GateResult.to_json`,
the attestation's predicate), so its numbers are the attestation's. It is a display of that run, not
evidence: the signed attestation is what a verifier checks. No torch import here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modelsec.errors import BackendUnavailableError, PolicyError
from modelsec.reports import REPORT_FORMATS, check_report_path, junit_testsuite, md_cell, write_report_file

__all__ = [
    "PLOT_SIZE_PX",
    "REPORT_FORMATS",
    "SweepPoint",
    "check_report_path",
    "plot_sweep",
    "render_gate_report",
    "require_plotting",
    "write_gate_report",
]

SweepPoint = tuple[float, int, int, float, float]
"""One point of an ε sweep: (eps, correct, total, Wilson 95% low, Wilson 95% high)."""

PLOT_SIZE_PX = (800, 500)
"""Width and height of the ε-sweep PNG in pixels."""


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def _cases(run: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """JUnit test cases: the threshold, then each sanity check (name, passed, detail)."""
    gate = run["gate"]
    robust = run["results"]["robust"]
    threshold = (
        f"robust accuracy ({gate['rule']} rule) >= {gate['threshold']:g} at eps={run['parameters']['eps']:g}"
    )
    detail = (
        f"{robust['correct']}/{robust['total']} = {_fmt(robust['accuracy'])}, 95% Wilson "
        f"[{_fmt(robust['wilson95'][0])}, {_fmt(robust['wilson95'][1])}]; value {_fmt(gate['value'])}"
    )
    if gate["reasons"]:
        detail += "; " + "; ".join(gate["reasons"])
    cases = [(threshold, gate["verdict"] == "PASSED", detail)]
    cases += [(f"sanity: {c['name']}", bool(c["passed"]), str(c["detail"])) for c in run["sanity"]["checks"]]
    return cases


def _sweep_markdown(sweep: Sequence[SweepPoint], plot: str | None) -> list[str]:
    if not sweep:
        return []
    lines = [
        "## Robust accuracy against ε",
        "",
        "| eps | correct | total | robust accuracy | Wilson 95% low | Wilson 95% high |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {eps:g} | {c} | {n} | {_fmt(c / n if n else 0.0)} | {_fmt(lo)} | {_fmt(hi)} |"
            for eps, c, n, lo, hi in sweep
        ),
        "",
    ]
    if plot:
        lines += [f"![robust accuracy against eps]({plot})", ""]
    return lines


def _markdown(
    run: Mapping[str, Any],
    root_digest: str,
    attestation: str | None,
    sweep: Sequence[SweepPoint] = (),
    plot: str | None = None,
) -> str:
    gate, params, results = run["gate"], run["parameters"], run["results"]
    rows = []
    for name in ("clean", "robust"):
        r = results[name]
        lo, hi = r["wilson95"]
        rows.append(
            f"| {name} | {r['correct']} | {r['total']} | {_fmt(r['accuracy'])} | {_fmt(lo)} | {_fmt(hi)} |"
        )
    lines = [
        f"# PGD robustness gate: {gate['verdict']}",
        "",
        f"- model: `{root_digest}`",
        f"- dataset: `sha256:{run['dataset']['digest']['sha256']}` ({run['dataset']['samples']} samples)",
        f"- attack: PGD L∞, eps={params['eps']:g}, step size {params['stepSize']:g}, "
        f"{params['steps']} steps, {params['restarts']} restart(s), seed {params['seed']}",
        f"- rule: {gate['rule']}, threshold {gate['threshold']:g}, value {_fmt(gate['value'])}",
        f"- attestation: `{attestation}`" if attestation else "- attestation: none written",
        "",
        "| accuracy | correct | total | value | Wilson 95% low | Wilson 95% high |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {name} | {'ok' if ok else 'FAIL'} | {md_cell(detail)} |" for name, ok, detail in _cases(run)),
        "",
        *_sweep_markdown(sweep, plot),
    ]
    return "\n".join(lines)


def _junit(run: Mapping[str, Any], root_digest: str) -> str:
    return junit_testsuite(
        "modelsec gate pgd",
        "modelsec.gate.pgd",
        _cases(run),
        properties=[("rootDigest", root_digest), ("verdict", run["gate"]["verdict"])],
        time=run["elapsedSeconds"],
        timestamp=str(run["finishedAt"]),
    )


def render_gate_report(
    fmt: str,
    run: Mapping[str, Any],
    *,
    root_digest: str,
    attestation: str | None = None,
    sweep: Sequence[SweepPoint] = (),
    plot: str | None = None,
) -> str:
    """The report text of a gate run (`GateResult.to_json()`) in `fmt` (`markdown` or `junit`).

    A Markdown report also tabulates the ε sweep and links the plot (`plot`, relative to the report).
    """
    if fmt == "junit":
        return _junit(run, root_digest)
    return _markdown(run, root_digest, attestation, sweep, plot)


def require_plotting() -> None:
    """Check that the ε-sweep plot can be drawn, before a run whose results it would draw.

    Raises:
        BackendUnavailableError: matplotlib is not installed (`pip install 'modelsec[reports]'`).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BackendUnavailableError(
            "the ε-sweep plot needs matplotlib: pip install 'modelsec[reports]'"
        ) from None


def plot_sweep(path: Path, sweep: Sequence[SweepPoint], *, eps: float, threshold: float) -> None:
    """Draw robust accuracy against ε with its Wilson 95% intervals as a PNG (`PLOT_SIZE_PX`).

    The points are also written into the PNG's `Description` text chunk as JSON
    (`[[eps, correct, total, low, high], ...]`), so a reader can check the picture against the report.

    Raises:
        BackendUnavailableError: matplotlib is not installed (`pip install 'modelsec[reports]'`).
        PolicyError: The file cannot be written.
    """
    try:
        import matplotlib
    except ImportError:
        raise BackendUnavailableError(
            "the ε-sweep plot needs matplotlib: pip install 'modelsec[reports]'"
        ) from None
    matplotlib.use("Agg")  # headless: CI runners have no display
    from matplotlib.figure import Figure

    xs = [p[0] for p in sweep]
    ys = [p[1] / p[2] if p[2] else 0.0 for p in sweep]
    lows = [y - p[3] for y, p in zip(ys, sweep, strict=True)]
    highs = [p[4] - y for y, p in zip(ys, sweep, strict=True)]
    dpi = 100
    fig = Figure(figsize=(PLOT_SIZE_PX[0] / dpi, PLOT_SIZE_PX[1] / dpi), dpi=dpi)
    ax = fig.add_subplot()
    ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=4, label="robust accuracy (Wilson 95%)")
    ax.axhline(threshold, color="tab:red", linestyle="--", label=f"threshold {threshold:g}")
    ax.axvline(eps, color="grey", linestyle=":", label=f"gate eps {eps:g}")
    ax.set(
        xlabel="eps (L∞)", ylabel="robust accuracy", ylim=(0.0, 1.02), title="PGD robust accuracy against eps"
    )
    ax.legend(loc="lower left")
    fig.tight_layout()
    description = json.dumps([list(p) for p in sweep])
    try:
        fig.savefig(path, format="png", dpi=dpi, metadata={"Description": description})
    except OSError as e:
        raise PolicyError(f"{path}: cannot write the plot: {e.strerror}") from None


def write_gate_report(
    path: Path,
    run: Mapping[str, Any],
    *,
    root_digest: str,
    attestation: str | None = None,
    sweep: Sequence[SweepPoint] = (),
) -> Path | None:
    """Write the report of a gate run to `path` (format by extension), replacing it atomically.

    With a `sweep`, the plot is written beside the report (`path` with the suffix `.png`) and linked from a
    Markdown report.

    Returns:
        The plot's path, or None without a sweep.

    Raises:
        PolicyError: An unknown extension, or a file cannot be written (the message names it).
        BackendUnavailableError: A sweep is given and matplotlib is not installed.
    """
    fmt = check_report_path(path)
    plot = None
    if sweep:
        plot = path.with_suffix(".png")
        plot_sweep(plot, sweep, eps=run["parameters"]["eps"], threshold=run["gate"]["threshold"])
    text = render_gate_report(
        fmt,
        run,
        root_digest=root_digest,
        attestation=attestation,
        sweep=sweep,
        plot=plot.name if plot else None,
    )
    write_report_file(path, text)
    return plot
