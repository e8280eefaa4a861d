"""`modelsec release`: watermark -> sign -> PGD gate -> attest -> verify, in one command.

Registered on the root group by `modelsec.cli.main`; `modelsec.release` (torch) loads inside the command.
"""

from __future__ import annotations

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
    progress_status,
    provenance_inputs,
    provenance_options,
    reply,
    report_path,
    signing_keys_option,
    timestamp_option,
    timestamper,
)
from modelsec.cli.values import message_value, usage_errors
from modelsec.errors import Error

__all__ = ["release"]


@click.command(name="release")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "-o",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Where the released model is written (must not exist or be empty).",
)
@signing_keys_option(
    "Private key PEM that signs the weights (repeatable: ECDSA and/or SM2); the "
    "first also signs the attestations unless --attestation-signing-key is given.",
    required=True,
)
@click.option(
    "--attestation-signing-key",
    "attestation_key",
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="Private key PEM that signs the watermark and gate attestations.",
)
@key_password_option
@click.option(
    "--watermark-key",
    type=click.Path(path_type=Path),
    required=True,
    metavar="PATH",
    help="The owner's secret watermark key file (`modelsec watermark keygen`).",
)
@click.option(
    "--message",
    "-m",
    required=True,
    callback=message_value,
    help="Watermark message: UTF-8 text, or hex as hex:<digits> / 0x<digits> (at most 64 bytes).",
)
@click.option(
    "--gate-config",
    type=click.Path(path_type=Path),
    required=True,
    help="PGD gate configuration (YAML/JSON: architecture, data, eps, stepSize, steps, ...).",
)
@timestamp_option
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    callback=report_path,
    help="Gate report: .md (Markdown) or .xml (JUnit).",
)
@provenance_options
@json_option
def release(
    model_dir: Path,
    out_dir: Path,
    keys: tuple[Path, ...],
    attestation_key: Path | None,
    key_passwords: tuple[str, ...],
    watermark_key: Path,
    message: str,
    gate_config: Path,
    timestamp_url: str | None,
    report: Path | None,
    source_repo: str | None,
    source_commit: str | None,
    source_dir: Path | None,
    datasets: list[Any],
    base_models: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Release MODEL_DIR: watermark -> sign -> PGD gate -> attest -> verify, into OUT.

    Fails fast with the stage named (exit 1); the result verifies under a policy requiring every
    signature algorithm used, the watermark and the gate. SLSA v1 provenance (builder from the CI
    environment: GitHub Actions, GitLab CI or MODELSEC_BUILDER_ID; a local build otherwise) is written to
    OUT/model.attestations/slsa.dev-provenance-v1.sig, naming the code, the gate's dataset and base models.
    """
    from modelsec.release import check_release_report, load_gate_spec, release_model
    from modelsec.watermark import load_key_file, parse_message

    if report is not None:
        with usage_errors("--report", "--out"):
            check_release_report(report, out_dir)
    sources = key_password_sources(key_passwords, [*keys, *([attestation_key] if attestation_key else [])])
    try:
        signers = [open_signing_key(k, sources) for k in keys]
        attester = open_signing_key(attestation_key, sources) if attestation_key else None
        provenance = provenance_inputs(source_repo, source_commit, source_dir, datasets, base_models)
        with progress_status("release: starting", not as_json):
            result = release_model(
                model_dir,
                out_dir,
                signers=signers,
                watermark_key=load_key_file(watermark_key),
                message=parse_message(message),
                gate=load_gate_spec(gate_config),
                attestation_signer=attester,
                timestamper=timestamper(timestamp_url),
                report=report,
                provenance=provenance,
            )
    except Error as e:
        fail(e, as_json)
    if as_json:
        reply(
            {
                "out": str(result.out_dir),
                "rootDigest": digest_str(result.root_digest),
                "bundles": [str(b) for b in result.bundles],
                "watermarkAttestation": str(result.watermark_attestation),
                "gateAttestation": str(result.gate_attestation),
                "robustAccuracy": result.robust_accuracy,
                "provenanceAttestation": str(result.provenance_attestation),
            }
        )
        return
    click.echo(f"released {result.out_dir}: model root digest sha256:{result.root_digest}")
    for b in result.bundles:
        click.echo(f"  signature   {b}")
    click.echo(f"  watermark   {result.watermark_attestation}")
    click.echo(f"  gate        {result.gate_attestation} (robust accuracy {result.robust_accuracy:.4f})")
    click.echo("  verified under a policy requiring all of them")
