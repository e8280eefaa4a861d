"""`modelsec watermark`: keygen, embed, detect (thin adapters over `modelsec.watermark`).

Only click is imported at module level; numpy and the watermark modules load inside the commands, so
`modelsec --help` stays fast. Exit codes: `detect` exits 0 when the mark is detected and 1 when it is not;
every command exits 1 with a one-line diagnostic (or `{"ok": false, ...}` with `--json`) on a modelsec
error, and 2 on usage errors.
"""

from __future__ import annotations

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
    progress_status,
    reply,
    report_path,
    write_key_file,
)
from modelsec.cli.values import (
    FiniteFloatRange,
    bad_options,
    message_syntax_value,
    message_value,
    usage_errors,
)

__all__ = ["watermark"]

_MESSAGE_HELP = "Message: UTF-8 text, or hex as hex:<digits> / 0x<digits> (at most 64 bytes)."


@click.group(name="watermark")
def watermark() -> None:
    """Embed and detect keyed parameter watermarks in safetensors models.

    `keygen` writes a secret watermark key (keep it like a private key); `embed` writes a marked copy of a
    model and, with --signing-key and --attestation, a signed attestation about it; `detect` needs only the
    watermark key and the suspect model (plus --reference to undo neuron permutation and scaling).
    """


@watermark.command(name="keygen")
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="Key file to write (mode 0600): 64 hex digits = 32 random bytes.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@json_option
def _keygen(out: Path, force: bool, as_json: bool) -> None:
    """Generate a watermark key file (the key itself is never printed)."""
    from modelsec.errors import KeyMaterialError
    from modelsec.watermark.spread_spectrum import generate_key_file_text

    try:
        write_key_file(out, generate_key_file_text(), 0o600, force=force)
    except KeyMaterialError as e:
        fail(e, as_json)
    if as_json:
        reply({"watermarkKey": str(out)})
    else:
        click.echo(f"wrote watermark key {out} (keep it secret: it can detect and forge the mark)")


_watermark_key_option = click.option(
    "--watermark-key",
    "key_file",
    type=click.Path(path_type=Path),
    required=True,
    metavar="PATH",
    help="Secret watermark key file (`modelsec watermark keygen`).",
)


@watermark.command(name="embed")
@click.argument("model_dir", type=click.Path(path_type=Path))
@_watermark_key_option
@click.option("--message", "-m", required=True, callback=message_value, help=_MESSAGE_HELP)
@click.option(
    "--out",
    "-o",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Output directory for the watermarked model (must not exist, or be empty).",
)
@click.option(
    "--signing-key",
    "sign_key",
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="Private key PEM that signs the watermark attestation (with --attestation; an encrypted key's "
    "password: see --key-password).",
)
@key_password_option
@click.option(
    "--attestation",
    type=click.Path(path_type=Path),
    help="Where to write the signed attestation bundle (outside OUT_DIR).",
)
@click.option(
    "--kappa",
    type=FiniteFloatRange(0, 100, min_open=True),
    default=None,
    help="Margin of the pilot bits, in standard deviations of the host correlation (the error-corrected "
    "message bits get a fixed fraction of it, recorded as codeMargin) [default: 1 for the careful mark "
    "of a causal LM, 3 otherwise; with a fidelity budget: the largest margin tried].",
)
@click.option(
    "--max-relative-change",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=0.25,
    show_default=True,
    help="Largest allowed |w' - w| / |w| of any weight.",
)
@click.option(
    "--max-fidelity-loss",
    type=FiniteFloatRange(0, 1),
    default=1e-4,
    show_default=True,
    help="Fidelity budget for transformers models (config.json with model_type) and --arch classifiers: the "
    "largest loss on the probe set (1 - worst cosine for encoders, changed greedy continuations for causal "
    "LMs, changed predictions for classifiers); the strongest mark within it is chosen, or the embedding is "
    "refused.",
)
@click.option(
    "--arch",
    "architecture",
    metavar="PKG.MOD:FACTORY",
    help="Classifier architecture (as for `gate pgd --arch`; from the environment, never the model dir): "
    "measure fidelity as the fraction of changed predictions on --probe-data.",
)
@click.option(
    "--probe-data",
    metavar="FILE|PKG.MOD:FN",
    help="Probe inputs for --arch: safetensors or .npz with `inputs` (N,...) and `labels` (N,), as for "
    "`gate pgd --data` (labels unused), or a loader.",
)
@click.option(
    "--min-unchanged",
    type=FiniteFloatRange(0, 1, min_open=True),
    default=0.98,
    show_default=True,
    help="Causal LMs: the bar of the careful mark: the 95 % Clopper-Pearson bound on the fraction of probe "
    "continuations changed at a top-2 gap over 0.05 nats must leave at least this unchanged (also: "
    "teacher-forced flips and KL no larger than bf16 inference's, perplexity within 0.5 %).",
)
@click.option(
    "--weakest-mark",
    is_flag=True,
    help="Causal LMs: write the careful (weakest detectable, graded) mark even if it misses the bar; its "
    "figures are reported and attested as measured.",
)
@click.option(
    "--no-fidelity-check",
    is_flag=True,
    help="The careless mark: fixed margin (--kappa, default 3), ungraded, nothing measured or attested "
    "about fidelity.",
)
@json_option
def _embed(
    model_dir: Path,
    key_file: Path,
    message: str,
    out_dir: Path,
    sign_key: Path | None,
    key_passwords: tuple[str, ...],
    attestation: Path | None,
    kappa: float,
    max_relative_change: float,
    max_fidelity_loss: float,
    architecture: str | None,
    probe_data: str | None,
    min_unchanged: float,
    weakest_mark: bool,
    no_fidelity_check: bool,
    as_json: bool,
) -> None:
    """Write a watermarked copy of MODEL_DIR to --out (dtype, shapes and side files kept).

    A causal LM gets the careful mark by default (graded, weakest detectable, grades cached under
    $XDG_CACHE_HOME/modelsec/grades, measured on 240 probe prompts against --min-unchanged; refused with
    the figures when it misses the bar); other transformers models the strongest mark within
    --max-fidelity-loss; --no-fidelity-check the fixed mark.
    """
    from modelsec.errors import Error
    from modelsec.watermark.embed import embed_model
    from modelsec.watermark.spread_spectrum import WatermarkParams, load_key_file, parse_message

    if (sign_key is None) != (attestation is None):
        raise click.UsageError("--signing-key and --attestation must be given together")
    if (architecture is None) != (probe_data is None):
        raise click.UsageError("--arch and --probe-data must be given together")
    if architecture is not None and no_fidelity_check:
        raise click.UsageError("--arch measures fidelity: do not combine it with --no-fidelity-check")
    if weakest_mark and no_fidelity_check:
        raise click.UsageError(
            "--weakest-mark is the careful mark: do not combine it with --no-fidelity-check"
        )
    sources = key_password_sources(key_passwords, [sign_key] if sign_key else [])
    from modelsec.watermark.careful import CAREFUL_KAPPA

    causal = not no_fidelity_check and architecture is None and _is_causal_lm(model_dir)
    with usage_errors("--kappa", "--max-relative-change"):
        params = WatermarkParams(
            kappa=kappa if kappa is not None else (CAREFUL_KAPPA if causal else 3.0),
            max_relative_change=max_relative_change,
        )
    try:
        key = load_key_file(key_file)
        payload = parse_message(message)
        signer = None
        if sign_key is not None:
            signer = open_signing_key(sign_key, sources)
        with progress_status(f"watermark embed: {model_dir}", not as_json):
            from modelsec.watermark.fidelity import auto_probe

            if architecture is not None and probe_data is not None:
                probe: Any = _classifier_probe(model_dir, architecture, probe_data)
            else:
                probe = None if no_fidelity_check else auto_probe(model_dir)
            if causal:
                from modelsec.watermark.careful import embed_careful

                result = embed_careful(
                    model_dir,
                    out_dir,
                    key,
                    payload,
                    params=params,
                    min_unchanged=min_unchanged,
                    weakest_anyway=weakest_mark,
                )
            elif probe is None:
                result = embed_model(model_dir, out_dir, key, payload, params=params, careless=True)
            else:
                from modelsec.watermark.budget import embed_within_budget

                result = embed_within_budget(
                    model_dir,
                    out_dir,
                    key,
                    payload,
                    probe=probe,
                    max_fidelity_loss=max_fidelity_loss,
                    params=params,
                )
        digest = None
        if signer is not None and attestation is not None:
            from modelsec.watermark.attestation import write_watermark_attestation

            digest, _ = write_watermark_attestation(result, signer, attestation)
    except Error as e:
        fail(e, as_json)
    d = result.detection
    if as_json:
        reply(
            {
                "out": str(result.out_dir),
                "rootDigest": None if digest is None else digest_str(digest),
                "attestation": None if attestation is None else str(attestation),
                "messageBits": result.message_bits,
                "codeBits": result.code_bits,
                "messageCode": result.params.message_code,
                "carriers": result.carriers,
                "carrierTensors": len(result.tensors),
                "densityLog2": result.density_log2,
                "maxRelativeChange": result.max_relative_change,
                "meanRelativeChange": result.mean_relative_change,
                "relativeL2Change": result.relative_l2_change,
                "keyCommitment": result.key_commitment,
                "kappa": result.params.kappa,
                "codeMargin": result.params.code_margin,
                "carrierSet": result.params.carrier_set,
                "fidelity": None if result.fidelity is None else result.fidelity.to_json(),
                "griddedTensors": [
                    {"name": g.name, "kind": g.kind, "carriers": g.carriers, "candidates": g.candidates}
                    for g in result.gridded
                ],
                "gridMark": None if result.grid_mark is None else result.grid_mark.to_json(),
                "survivesRequantisation": result.survives_requantisation,
                "requantisationNotice": result.requantisation_notice(),
                "detection": d.to_json(),
            }
        )
        return
    coding = (
        "no error correction: the model cannot carry the longer crc32-conv7 code word"
        if result.params.message_code == "none"
        else f"{result.params.message_code}: {result.code_bits - result.params.pilot_bits} code bits"
    )
    click.echo(
        f"watermarked {result.message_bits} message bits ({coding}; +{result.params.pilot_bits} pilot) "
        f"into {result.carriers} weights of {len(result.tensors)} tensors -> {result.out_dir}"
    )
    click.echo(
        f"  max relative change {result.max_relative_change:.2%}, mean {result.mean_relative_change:.2%}, "
        f"relative L2 {result.relative_l2_change:.2%}"
    )
    click.echo(
        f"  check on written weights: {d.bit_matches}/{d.bits} pilot bits, message "
        f"{'matched' if d.message_matched else 'NOT matched'}, confidence {d.confidence:.3f}, "
        f"false-positive probability {d.false_positive_probability:.3g} "
        f"(log10 {d.log10_false_positive_probability:.1f})"
    )
    greedy = None if result.fidelity is None else result.fidelity.greedy
    if result.fidelity is not None and greedy is not None:
        f = result.fidelity
        click.echo(
            f"  fidelity ({'meets' if f.met else 'MISSES'} the bar: changed rate <= {f.budget:.2%}; kappa "
            f"{result.params.kappa:g}, graded, grades "
            f"{'from the cache' if f.grades_cached else 'computed'}): "
            f"{greedy.summary()}"
        )
    elif result.fidelity is not None:
        f = result.fidelity
        click.echo(
            f"  fidelity {f.metric} = {f.value:.3g} <= budget {f.budget:g} on {f.probes} probes "
            f"(kappa {result.params.kappa:g}, carriers: {result.params.carrier_set})"
        )
    notice = result.requantisation_notice()
    if notice is not None:
        click.echo(f"  {'' if result.survives_requantisation else 'WARNING: '}{notice}")
    if digest is not None:
        click.echo(f"  attestation {attestation} for model root digest sha256:{digest}")


def _is_causal_lm(model_dir: Path) -> bool:
    """Whether `embed` gives MODEL_DIR the careful mark (a transformers causal LM); errors come later."""
    from modelsec.errors import Error
    from modelsec.watermark.fidelity import CausalLMProbe, auto_probe

    try:
        return isinstance(auto_probe(model_dir), CausalLMProbe)
    except Error:
        return False  # reported by the embedding itself, with the model named


@watermark.command(name="detect")
@click.argument("model_dir", type=click.Path(path_type=Path))
@_watermark_key_option
@click.option(
    "--message",
    "-m",
    default=None,
    callback=message_syntax_value,
    help="The expected message: exit 0 only if the mark is present (decided as without -m) and carries "
    "exactly this message (every bit; messageMatched in --json). " + _MESSAGE_HELP,
)
@click.option(
    "--message-bits",
    type=click.IntRange(min=8),
    default=None,
    callback=lambda _ctx, _param, value: _whole_bytes(value),
    help="The message length in bits, if known (a multiple of 8).",
)
@click.option(
    "--reference",
    type=click.Path(path_type=Path),
    default=None,
    help="Registered reference model: undo neuron permutation and scaling before extraction.",
)
@click.option(
    "--attestation",
    type=click.Path(path_type=Path),
    default=None,
    help="Watermark attestation of the release: take the density, message length and carrier tensors "
    "from it (parameters only; its signature is checked by the verifier, not here).",
)
@click.option(
    "--min-confidence",
    type=FiniteFloatRange(-1, 1),
    default=0.0,
    show_default=True,
    help="Detected only if the cosine of extracted and embedded pilot bits is at least this (an extra "
    "requirement: presence is decided by the false-positive bound of the Stouffer statistic; 0.92 gives the "
    "rule before issue 30).",
)
@click.option(
    "--max-false-positive",
    type=FiniteFloatRange(0, 1, min_open=True),
    default=1e-9,
    show_default=True,
    help="Detected only if the false-positive probability is at most this.",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    callback=report_path,
    help="Also write a CI report of the detection, whatever the verdict: .md (Markdown) or .xml (JUnit XML).",
)
@json_option
def _detect(
    model_dir: Path,
    key_file: Path,
    message: str | None,
    message_bits: int | None,
    reference: Path | None,
    attestation: Path | None,
    min_confidence: float,
    max_false_positive: float,
    report: Path | None,
    as_json: bool,
) -> None:
    """Detect the watermark of --watermark-key in MODEL_DIR (exit 0 when detected, 1 when not).

    With --message, exit 0 only when the mark is present and carries exactly that message; a present mark
    with another message exits 1 saying so. With --json, `ok` is true only for exit 0; otherwise
    `error.kind` is GateFailedError, and `detected` (the mark is present) and `messageMatched` tell which.
    """
    from modelsec.errors import Error, GateFailedError
    from modelsec.watermark.detection import DetectionThresholds, detect
    from modelsec.watermark.spread_spectrum import WatermarkParams, load_key_file, parse_message

    if message is not None and message_bits is not None:
        raise click.UsageError("give --message or --message-bits, not both")
    with usage_errors("--min-confidence", "--max-false-positive"):
        thresholds = DetectionThresholds(min_confidence=min_confidence, max_false_positive=max_false_positive)
    if attestation is None:
        _check_message_length(message, message_bits, WatermarkParams())
    try:
        key = load_key_file(key_file)
        payload = parse_message(message) if message is not None else None
        params = tensors = None
        if attestation is not None:
            from modelsec.watermark.attestation import check_key_commitment, read_detection_hints

            hints = read_detection_hints(attestation)
            check_key_commitment(hints, key, key_name=str(key_file), attestation=attestation)
            params, tensors = hints.params, hints.tensors
            _check_message_length(message, message_bits, params)
            if payload is None and message_bits is None:
                message_bits = hints.message_bits
        with progress_status(f"watermark detect: {model_dir}", not as_json):
            result = detect(
                model_dir,
                key,
                message=payload,
                message_length=message_bits,
                reference=reference,
                tensors=tensors,
                params=params,
                thresholds=thresholds,
            )
        if report is not None:
            from modelsec.watermark.report import write_detection_report

            attested_digest = None if attestation is None else _attested_digest(attestation)
            write_detection_report(
                report, result.to_json(), model=str(model_dir), attested_digest=attested_digest
            )
    except Error as e:
        fail(e, as_json)
    refusal = _detect_refusal(result)
    if as_json:
        if refusal is not None:
            fail(GateFailedError(refusal), as_json, fields=result.to_json())
        reply(result.to_json())
        sys.exit(0)
    verdict = "DETECTED" if result.detected else "NOT DETECTED"
    click.echo(
        f"{verdict}: {result.bit_matches}/{result.bits} pilot bits match (BER {result.bit_error_rate:.2%}), "
        f"presence z {result.z_score:.1f}, confidence {result.confidence:.3f}, false-positive probability "
        f"{result.false_positive_probability:.3g} (log10 {result.log10_false_positive_probability:.1f}, "
        f"{result.tests} hypotheses)"
    )
    if result.detected and result.decoded_message is not None:
        text = _printable(result.decoded_message)
        checked = " (CRC-32 checked)" if result.message_decoded else " (no error correction: unchecked)"
        click.echo(
            f"  message ({8 * len(result.decoded_message)} bits): hex:{result.decoded_message.hex()}"
            + (f" ({text!r})" if text else "")
            + checked
        )
    elif result.detected and result.message_decoded is False:
        click.echo(
            f"  message NOT DECODED: the {result.message_bits}-bit message's {result.message_code} code word "
            "has too many errors (its CRC-32 fails); no message is reported"
        )
    if result.message_matched is not None:
        click.echo(
            f"  given message {'MATCHED' if result.message_matched else 'NOT MATCHED'}: "
            f"{result.message_matches}/{result.message_bits} of its bits decoded as embedded"
            + (
                f" ({result.code_bit_error_rate:.2%} of its code bits wrong before correction)"
                if result.code_bit_error_rate is not None
                else ""
            )
        )
    if result.resync is not None:
        click.echo(
            f"  re-synchronised {result.resync.permuted} permuted / {result.resync.rescaled} rescaled "
            f"of {result.resync.groups} neuron groups against {reference}"
        )
    if refusal is not None:
        fail(GateFailedError(refusal), as_json)
    sys.exit(0)


def _whole_bytes(bits: int | None) -> int | None:
    """Check --message-bits: whole bytes (a usage error otherwise, before any work)."""
    if bits is not None and bits % 8:
        raise click.BadParameter(f"{bits} is not a multiple of 8")
    return bits


def _check_message_length(message: str | None, bits: int | None, params: Any) -> None:
    """Refuse a --message / --message-bits longer than the scheme's (or the attestation's) message limit."""
    from modelsec.watermark.spread_spectrum import parse_message

    limit = params.max_message_bits
    if message is not None and 8 * len(parse_message(message)) > limit:
        bad_options(f"the message has {8 * len(parse_message(message))} bits; at most {limit}", "--message")
    if bits is not None and bits > limit:
        bad_options(f"{bits} bits; at most {limit}", "--message-bits")


def _classifier_probe(model_dir: Path, architecture: str, probe_data: str) -> Any:
    """A `ClassifierProbe` of the operator's factory on the probe inputs (any finite range accepted)."""
    import math

    from modelsec.robustness.data import load_dataset
    from modelsec.robustness.imports import resolve_import_path
    from modelsec.watermark.fidelity import ClassifierProbe

    factory = resolve_import_path(architecture, what="architecture", forbid_under=model_dir)
    data = load_dataset(probe_data, clip=(-math.inf, math.inf))
    return ClassifierProbe(factory, data.inputs, name=architecture)


def _attested_digest(attestation: Path) -> str | None:
    """The sha256 root digest of the attestation's subject (read, not verified: the report only shows it)."""
    from modelsec.attestations.statement import parse_statement
    from modelsec.limits import Limits
    from modelsec.verifier.trust.bundles import read_bundle

    bundle = read_bundle(attestation, Limits())
    statement = parse_statement(bundle.envelope.payload, what=str(attestation))
    digest = statement.subjects[0].digest.get("sha256")
    return None if digest is None else digest_str(digest)


def _detect_refusal(result: Any) -> str | None:
    """Why `watermark detect` exits 1 (the mark absent, or present with another message), or None."""
    if not result.detected:
        return (
            f"watermark not detected: {result.bit_matches}/{result.bits} pilot bits match, confidence "
            f"{result.confidence:.3f}, false-positive probability {result.false_positive_probability:.3g}"
        )
    if result.message_matched is None or result.message_matched:
        return None
    present = (
        f"watermark present ({result.bit_matches}/{result.bits} pilot bits, false-positive probability "
        f"{result.false_positive_probability:.3g}) but it carries another message"
    )
    found = result.decoded_message
    if found is not None and 8 * len(found) != result.message_bits:
        return f"{present}: {8 * len(found)} message bits found, {result.message_bits} given"
    if result.message_decoded is False:
        return f"{present}: its message could not be decoded (CRC-32 fails after error correction)"
    differ = result.message_bits - result.message_matches
    return f"{present}: {differ}/{result.message_bits} message bits differ"


def _printable(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return text if text.isprintable() else ""
