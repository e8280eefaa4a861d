"""`modelsec gate ...`: release gates that measure a verified model and sign the result.

Only click is imported here at module level; torch and the robustness package load inside the command,
so `modelsec --help` stays fast. The command converts options, calls `modelsec.robustness.run_pgd_gate`,
prints, and maps errors: exit 0 PASSED, exit 1 FAILED or refused (diagnostic on stderr, or one JSON object
on stdout with `--json`), exit 2 usage. Under `torchrun` every rank evaluates its share; rank 0 signs,
writes and prints.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from modelsec.cli.common import (
    digest_str,
    fail,
    json_option,
    key_password_option,
    key_password_sources,
    open_signing_key,
    quiet_option,
    reply,
    report_path,
    signatures_option,
    trusted_keys_option,
)
from modelsec.cli.values import FiniteFloatRange, bad_options, device_value, usage_errors

__all__ = ["gate"]

_CLIP = ("--clip-min", "--clip-max")


@click.group(name="gate")
def gate() -> None:
    """Release gates: evaluate a verified model and sign the result as an attestation."""


class _RichProgress:
    """One rich progress bar per evaluation pass, on stderr."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._task: Any = None

    def start(self, description: str, total: int) -> None:
        if self._task is not None:
            self._bar.update(self._task, completed=self._bar.tasks[-1].total)
        self._task = self._bar.add_task(description, total=total)

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, n)


@gate.command(name="pgd")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--arch",
    "architecture",
    required=True,
    metavar="PKG.MOD:FACTORY",
    help="Import path of a function returning the nn.Module (from the environment, never the model dir).",
)
@click.option(
    "--data",
    required=True,
    metavar="FILE|PKG.MOD:FN",
    help="Dataset: safetensors or .npz with `inputs` (N,...) float and `labels` (N,) int, or a loader.",
)
@click.option(
    "--eps", type=FiniteFloatRange(min=0), required=True, help="L-infinity radius in input units (e.g. 0.03)."
)
@click.option(
    "--step-size",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="PGD step size [default: 2.5 * eps / steps].",
)
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True, help="PGD iterations.")
@click.option(
    "--restarts",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Random restarts (worst case kept).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random starts.")
@click.option(
    "--min-robust-accuracy", type=FiniteFloatRange(0, 1), required=True, help="Release threshold in [0, 1]."
)
@click.option(
    "--rule",
    type=click.Choice(["point", "strict"]),
    default="point",
    show_default=True,
    help="point: robust accuracy >= threshold; strict: 95% Wilson lower bound >= threshold.",
)
@click.option(
    "--min-samples",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Fewest examples a pass needs.",
)
@click.option(
    "--clip-min", type=FiniteFloatRange(), default=0.0, show_default=True, help="Lowest valid input value."
)
@click.option(
    "--clip-max",
    type=FiniteFloatRange(),
    default=1.0,
    show_default=True,
    help="Highest valid input value (above --clip-min).",
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Examples per batch."
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    metavar="cpu|cuda|cuda:K",
    callback=device_value,
    help="Where to evaluate.",
)
@click.option(
    "--channels-last/--no-channels-last",
    default=None,
    help="NHWC memory format [default: on for CUDA, off for CPU].",
)
@click.option(
    "--bf16", is_flag=True, help="bf16 autocast for the attack's forward/backward (fp32 projection)."
)
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the model's forward.")
@click.option(
    "--sanity-samples",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Examples used by the attack-based sanity checks.",
)
@click.option(
    "--no-sanity", is_flag=True, help="Skip the attack-based sanity checks (recorded in the attestation)."
)
@click.option(
    "--signing-key",
    "key",
    type=click.Path(path_type=Path),
    required=True,
    metavar="PATH",
    help="Private key PEM that signs the attestation (an encrypted key's password: "
    "see --key-password).",
)
@key_password_option
@trusted_keys_option(
    "Trusted public key PEM for the weights signatures (repeatable, at least one).",
    required=True,
)
@signatures_option("Weights signature bundle (repeatable; default: found in MODEL_DIR).")
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="Where to write the signed attestation bundle (outside MODEL_DIR, or a signed-ignored name).",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    callback=report_path,
    help="Also write a CI report of the run, whatever the verdict: .md (Markdown) or .xml (JUnit XML).",
)
@click.option(
    "--eps-sweep",
    callback=lambda _ctx, _param, value: _eps_list(value),
    metavar="EPS[,EPS...]",
    help="Also measure robust accuracy at these eps (after the gate; not signed) and draw it with its Wilson "
    "intervals as a PNG beside --report (needs modelsec[reports]).",
)
@json_option
@quiet_option
def _pgd(
    model_dir: Path,
    architecture: str,
    data: str,
    eps: float,
    step_size: float | None,
    steps: int,
    restarts: int,
    seed: int,
    min_robust_accuracy: float,
    rule: str,
    min_samples: int,
    clip_min: float,
    clip_max: float,
    batch_size: int,
    device: str,
    channels_last: bool | None,
    bf16: bool,
    compile_: bool,
    sanity_samples: int,
    no_sanity: bool,
    key: Path,
    key_passwords: tuple[str, ...],
    keys: tuple[Path, ...],
    signatures: tuple[Path, ...],
    out: Path,
    report: Path | None,
    eps_sweep: tuple[float, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Verify MODEL_DIR, measure its accuracy under PGD L-infinity, sign the result (exit 1 unless PASSED).

    The model directory is verified with the --trusted-key keys before any weight is loaded; the weights are
    built from the verified bytes. The attestation (subject: the model root digest) is written to --out
    whatever the verdict.
    """
    from modelsec.errors import Error, GateFailedError

    sources = key_password_sources(key_passwords, [key])
    if eps_sweep and report is None:
        raise click.UsageError("--eps-sweep needs --report (the sweep is a picture in the report)")
    if not clip_min < clip_max:
        bad_options(f"the valid input range needs min < max, got [{clip_min}, {clip_max}]", *_CLIP)
    from modelsec.robustness.gate_config import GateConfig, SanityConfig, default_step_size
    from modelsec.robustness.pgd import FastPaths

    on_cuda = device.startswith("cuda")
    with usage_errors("--eps", "--step-size", "--steps", "--min-robust-accuracy", *_CLIP):
        config = GateConfig(
            eps=eps,
            step_size=step_size if step_size is not None else default_step_size(eps, steps),
            steps=steps,
            restarts=restarts,
            seed=seed,
            min_robust_accuracy=min_robust_accuracy,
            rule=rule,
            min_samples=min_samples,
            clip=(clip_min, clip_max),
            batch_size=batch_size,
            device=device,
            fast=FastPaths(
                channels_last=on_cuda if channels_last is None else channels_last,
                bf16_autocast=bf16,
                compile=compile_,
            ),
            sanity=SanityConfig(enabled=not no_sanity, samples=sanity_samples),
        )
    try:
        if eps_sweep:
            from modelsec.robustness.report import require_plotting

            require_plotting()
        from modelsec.policy import Policy
        from modelsec.robustness import run_pgd_gate

        signer = open_signing_key(key, sources)
        policy = Policy.from_key_files(keys)
        # Under torchrun only rank 0 draws a bar (every rank reports its own share of the work).
        show = not (quiet or as_json) and sys.stderr.isatty() and os.environ.get("RANK", "0") == "0"
        with contextlib.ExitStack() as stack:
            progress = None
            if show:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

                bar = stack.enter_context(
                    Progress(
                        "[progress.description]{task.description}",
                        BarColumn(),
                        MofNCompleteColumn(),
                        TimeElapsedColumn(),
                        console=Console(stderr=True),
                        transient=True,
                    )
                )
                progress = _RichProgress(bar)
            outcome = run_pgd_gate(
                model_dir,
                policy=policy,
                architecture=architecture,
                data=data,
                config=config,
                signer=signer,
                out=out,
                bundles=list(signatures) or None,
                progress=progress,
                sweep=eps_sweep,
            )
    except Error as e:
        fail(e, as_json)
    if not outcome.is_main:
        sys.exit(0 if outcome.result.passed else 1)
    result = outcome.result
    if report is not None:
        from modelsec.robustness.report import write_gate_report

        try:
            write_gate_report(
                report,
                result.to_json(),
                root_digest=digest_str(outcome.root_digest),
                attestation=str(outcome.out) if outcome.out else None,
                sweep=[(e, a.correct, a.total, *a.wilson95) for e, a in outcome.sweep],
            )
        except Error as e:
            fail(e, as_json)
    if as_json:
        fields: dict[str, Any] = {
            "verdict": result.verdict,
            "rootDigest": digest_str(outcome.root_digest),
            "attestation": str(outcome.out) if outcome.out else None,
            "result": result.to_json(),
        }
        if outcome.sweep:
            fields["epsSweep"] = [{"eps": e, "robust": a.to_json()} for e, a in outcome.sweep]
        if not result.passed:
            fail(GateFailedError(_failed(result)), as_json, fields=fields)
        reply(fields)
    else:
        click.echo(f"{result.summary()}")
        click.echo(
            f"  model sha256:{outcome.root_digest}; dataset sha256:{result.dataset_digest} "
            f"({result.clean.total} samples); {result.elapsed_s:.1f} s on {result.environment['deviceName']}"
        )
        for check in result.checks:
            click.echo(f"  [{'ok' if check.passed else 'FAIL'}] {check.name}: {check.detail}")
        for reason in result.reasons:
            click.echo(f"  reason: {reason}", err=True)
        click.echo(f"  attestation -> {outcome.out}")
    if not result.passed:
        sys.exit(1)


def _eps_list(value: str | None) -> tuple[float, ...]:
    """Parse --eps-sweep: comma-separated finite numbers > 0 (a usage error otherwise, before any run)."""
    if not value:
        return ()
    try:
        values = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give numbers separated by commas, e.g. 0.1,0.2,0.3") from None
    if not all(0 < v < float("inf") for v in values):
        raise click.BadParameter(f"{value!r}: every eps must be a finite number > 0")
    return values


def _failed(result: Any) -> str:
    """The message of a FAILED verdict: the summary line and the gate's reasons."""
    return "; ".join([result.summary(), *result.reasons])
