"""The release pipeline of the CI signing stage: watermark -> sign -> gate -> attest -> verify, failing fast.

`release_model` runs, in order, each stage only if every earlier one succeeded (an error names the stage):

1. `watermark`: embed the owner's mark into a copy of the model (`modelsec.watermark.embed_model`); the
   embed-time detection must succeed.
2. `sign`: sign the marked copy with every given key (ECDSA and/or SM2; `modelsec.signer.sign_model`).
   With a timestamper (`release --timestamp-url`), every weights bundle and, once the gate passed, both
   attestations (stage `timestamp-attestations`) carry an RFC 3161 timestamp over their signature.
3. `attest-watermark`: sign the watermark statement about the marked model's root digest, written as
   `model.watermark.sig` (a reserved name every manifest ignores).
4. `gate`: verify the signed copy and run the PGD L∞ gate on it (`modelsec.robustness.run_pgd_gate`); the
   statement is signed and written as `model.gate.sig` whatever the verdict, and a FAILED gate stops the
   release (`GateFailedError`).
5. `provenance`: sign SLSA v1 provenance about the released root digest (builder and invocation from the
   CI environment, the training code, the gate's dataset digest and any others, the base models), written as
   `model.attestations/slsa.dev-provenance-v1.sig` (`modelsec.attestations.predicates.provenance`).
6. `verify`: the released directory is verified end to end under a policy that requires every signature
   algorithm used, the watermark and the gate (`modelsec.verifier.verify_model`), as a deployment would.

A release is all or nothing: every stage works in a staging directory beside `--out`
(`.<name>.release-<random>`), renamed to `--out` only after the final verification. A release that fails at
any stage leaves `--out` as it was (absent or empty) and removes the staging directory, so a rerun works.

The gate configuration file (`--gate-config`, `kind: GateSpec`) is read by `modelsec.release.gate_spec`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelsec.errors import Error, GateFailedError, PolicyError
from modelsec.policy import Policy, RobustnessRequirement, WatermarkRequirement
from modelsec.progress import step
from modelsec.release.gate_spec import GateSpec
from modelsec.signer.keys import KeyBackend, TrustedKey, load_trusted_key
from modelsec.signer.layout import STATEMENTS_DIR_NAME

PROVENANCE_FILE_NAME = "slsa.dev-provenance-v1.sig"  # `predicate_slug` of https://slsa.dev/provenance/v1

__all__ = ["ProvenanceInputs", "ReleaseResult", "check_release_report", "release_model"]


@dataclass(frozen=True, slots=True)
class ProvenanceInputs:
    """What the release's SLSA provenance names besides the model and the gate's dataset.

    Attributes:
        environment: The builder and invocation
            (`modelsec.attestations.predicates.provenance.build_environment`).
        sources: The training code (empty: the CI environment's checkout, if it names one).
        datasets: Datasets by digest (the gate's own dataset is added by the release).
        base_models: Base models with their signature bundles' digests
            (`modelsec.signer.statements.base_model_of`).
    """

    environment: Any
    sources: tuple[Any, ...] = ()
    datasets: tuple[Any, ...] = ()
    base_models: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """What `release_model` produced.

    Attributes:
        out_dir: The released (marked, signed, attested) model directory.
        root_digest: Its model root digest.
        bundles: Weights signature bundles written.
        watermark_attestation: Path of `model.watermark.sig`.
        gate_attestation: Path of `model.gate.sig`.
        robust_accuracy: The gate's measured robust accuracy.
        policy: The policy the release was verified under (keys of the signers, everything required).
        provenance_attestation: Path of the SLSA provenance (`model.attestations/slsa.dev-provenance-v1.sig`).
    """

    out_dir: Path
    root_digest: str
    bundles: tuple[Path, ...]
    watermark_attestation: Path
    gate_attestation: Path
    robust_accuracy: float
    policy: Policy
    provenance_attestation: Path | None = None


def _trusted(signer: KeyBackend, name: str, roles: frozenset[str]) -> TrustedKey:
    return load_trusted_key(signer.public_key_pem(), name=name, roles=roles)


def _timestamp_attestation(path: Path, timestamper: Callable[[bytes], Sequence[bytes]]) -> None:
    """Add RFC 3161 timestamps over the signature of the attestation at `path` (rewritten atomically)."""
    from modelsec.attestations.bundle import add_timestamps, parse_bundle
    from modelsec.signer.layout import write_bundle_file

    try:
        data = path.read_bytes()
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the attestation to timestamp it: {e.strerror}") from e
    tokens = timestamper(parse_bundle(data, source=str(path)).signature.sig)
    write_bundle_file(path, add_timestamps(data, tokens, source=str(path)), what="attestation")


def check_release_report(report: Path, out_dir: Path) -> None:
    """Refuse a `--report` path the release cannot write: a bad extension, or inside `out_dir`.

    Raises:
        PolicyError: The extension is neither `.md`/`.markdown` nor `.xml`, or the report lies in
            the release directory (which is replaced as a whole).
    """
    from modelsec.robustness.report import check_report_path

    check_report_path(report)
    dst = out_dir.resolve()
    if dst == report.resolve() or dst in report.resolve().parents:
        raise PolicyError(f"{report}: the report must be written outside the release directory {out_dir}")


@contextlib.contextmanager
def _staging(out_dir: Path) -> Iterator[Path]:
    """A fresh, not yet created path beside `out_dir`; whatever is left there is removed on exit."""
    staging = out_dir.parent / f".{out_dir.name}.release-{secrets.token_hex(6)}"
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, out_dir: Path) -> None:
    """Rename the finished release to `out_dir` (replacing an empty directory; never a non-empty one)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(out_dir)
        os.rename(staging, out_dir)
    except OSError as e:
        raise PolicyError(f"{out_dir}: cannot move the release into place: {e.strerror}") from None


def release_model(
    model_dir: Path,
    out_dir: Path,
    *,
    signers: Sequence[KeyBackend],
    watermark_key: Any,
    message: bytes,
    gate: GateSpec,
    attestation_signer: KeyBackend | None = None,
    timestamper: Callable[[bytes], Sequence[bytes]] | None = None,
    report: Path | None = None,
    provenance: ProvenanceInputs | None = None,
) -> ReleaseResult:
    """Watermark, sign, gate and attest a model, then verify the result as a deployment would.

    Args:
        model_dir: The unmarked model (safetensors shards and side files); it is not modified.
        out_dir: Where the released model is written (must not exist or be empty); nothing is written
            there unless every stage succeeds.
        signers: Weights signing keys (ECDSA P-256/P-384, SM2); each algorithm becomes required.
        watermark_key: The owner's `modelsec.watermark.WatermarkKey` (never written anywhere).
        message: The watermark message (1-64 bytes).
        gate: The PGD gate configuration.
        attestation_signer: Signs the watermark and gate statements (default: the first signer).
        timestamper: Timestamps the signature of each weights bundle (RFC 3161; see `sign_model`) and of
            the watermark and gate attestations, or None.
        report: Where to write the gate's CI report (`.md` Markdown or `.xml` JUnit XML,
            `modelsec.robustness.report`) as soon as the gate has run, whatever its verdict; outside
            `out_dir`.
        provenance: What the SLSA provenance names (builder from the CI environment, code, datasets, base
            models); None reads the builder from the environment (`build_environment(os.environ)`) and names
            no code, base model or dataset but the gate's. Written after the gate passed (stage
            `provenance`) as `model.attestations/slsa.dev-provenance-v1.sig`, signed by the attestation
            signer, and timestamped with the other attestations.

    Returns:
        The release: root digest, bundle paths, gate figure, and the verifying policy.

    Raises:
        PolicyError: `out_dir` exists and is not empty, is a symlink, is inside `model_dir`, or the finished
            release cannot be renamed into place; `report` has an unknown extension or is inside `out_dir`.
        GateFailedError: The watermark was not detected after embedding, or the gate FAILED (stage named).
        Error: Any modelsec error of a stage, with the stage named in its diagnostics.
    """
    if not signers:
        raise PolicyError("release needs at least one signing key")
    attester = attestation_signer or signers[0]
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    from modelsec.watermark.output import check_out_dir

    check_out_dir(model_dir, out_dir)
    if report is not None:
        check_release_report(report, out_dir)
    with _staging(out_dir) as staging:
        if provenance is None:
            from modelsec.attestations.predicates.provenance import build_environment

            provenance = ProvenanceInputs(build_environment(os.environ))
        result = _release_into(
            model_dir,
            staging,
            signers,
            attester,
            watermark_key,
            message,
            gate,
            report,
            out_dir,
            timestamper,
            provenance,
        )
        _publish(staging, out_dir)
    return ReleaseResult(
        out_dir=out_dir,
        root_digest=result.root_digest,
        bundles=tuple(out_dir / p.name for p in result.bundles),
        watermark_attestation=out_dir / result.watermark_attestation.name,
        gate_attestation=out_dir / result.gate_attestation.name,
        robust_accuracy=result.robust_accuracy,
        policy=result.policy,
        provenance_attestation=out_dir / STATEMENTS_DIR_NAME / PROVENANCE_FILE_NAME,
    )


def _release_into(
    model_dir: Path,
    out_dir: Path,
    signers: Sequence[KeyBackend],
    attester: KeyBackend,
    watermark_key: Any,
    message: bytes,
    gate: GateSpec,
    report: Path | None,
    final_dir: Path,
    timestamper: Callable[[bytes], Sequence[bytes]] | None,
    provenance: ProvenanceInputs,
) -> ReleaseResult:
    """Run every stage with `out_dir` as the (staging) output; see `release_model`."""
    from modelsec.robustness import GateConfig, run_pgd_gate
    from modelsec.signer import sign_model
    from modelsec.signer.layout import GATE_BUNDLE_NAME, WATERMARK_BUNDLE_NAME
    from modelsec.verifier import verify_model
    from modelsec.watermark import embed_model, write_watermark_attestation

    watermark_path, gate_path = out_dir / WATERMARK_BUNDLE_NAME, out_dir / GATE_BUNDLE_NAME
    stage = "watermark"
    try:
        step(f"release: {stage}")
        embedded = embed_model(model_dir, out_dir, watermark_key, message)
        if not (embedded.detection.detected and embedded.detection.message_matched):
            raise GateFailedError(
                f"{out_dir}: the watermark or its message is not detected in the written weights"
            )
        stage = "sign"
        step(f"release: {stage}")
        signed = sign_model(out_dir, signers, timestamper=timestamper)
        stage = "attest-watermark"
        step(f"release: {stage}")
        # The SHA-256 root was just computed by signing; an SM2 attester also records the SM3 root (hashed).
        write_watermark_attestation(
            embedded, attester, watermark_path, digests={"sha256": signed.root_digest}
        )
        stage = "gate"
        step(f"release: {stage}")
        weights_keys = tuple(
            _trusted(s, f"release-{s.algorithm.value}", frozenset({"weights"})) for s in signers
        )
        outcome = run_pgd_gate(
            out_dir,
            policy=Policy(keys=weights_keys),
            architecture=gate.architecture,
            data=gate.data,
            config=GateConfig(
                eps=gate.eps,
                step_size=gate.step_size,
                steps=gate.steps,
                min_robust_accuracy=gate.min_robust_accuracy,
                restarts=gate.restarts,
                seed=gate.seed,
                rule=gate.rule,
                min_samples=gate.min_samples,
                batch_size=gate.batch_size,
                device=gate.device,
            ),
            signer=attester,
            out=gate_path,
        )
        if report is not None:
            from modelsec.robustness.report import write_gate_report

            write_gate_report(
                report,
                outcome.result.to_json(),
                root_digest=f"sha256:{outcome.root_digest}",
                attestation=str(final_dir / gate_path.name) if outcome.result.passed else None,
            )
        outcome.result.raise_for_verdict()
        stage = "provenance"
        step(f"release: {stage}")
        provenance_path = _write_provenance(
            out_dir, final_dir, signed.root_digest, provenance, outcome.result.dataset_digest, attester
        )
        if timestamper is not None:
            stage = "timestamp-attestations"
            step(f"release: {stage}")
            for path in (watermark_path, gate_path, provenance_path):
                _timestamp_attestation(path, timestamper)
        stage = "verify"
        step(f"release: {stage}")
        attest_roles = frozenset({"watermark", "gate"})
        policy = Policy(
            keys=(*weights_keys, _trusted(attester, "release-attestations", attest_roles)),
            require_algorithms=frozenset(s.algorithm for s in signers),
            robustness=RobustnessRequirement(
                min_eps=gate.eps,
                min_robust_accuracy=gate.min_robust_accuracy,
                rule=gate.rule,
                min_samples=gate.min_samples,
            ),
            watermark=WatermarkRequirement(),
            name="release",
        )
        verified = verify_model(out_dir, policy)
    except Error as e:
        raise e.add_context(f"release stage {stage!r}") from e
    return ReleaseResult(
        out_dir=out_dir,
        root_digest=verified.root_digest,
        bundles=tuple(b.path for b in signed.bundles),
        watermark_attestation=watermark_path,
        gate_attestation=gate_path,
        robust_accuracy=outcome.result.robust.accuracy,
        policy=policy,
        provenance_attestation=provenance_path,
    )


def _write_provenance(
    out_dir: Path,
    final_dir: Path,
    root_digest: str,
    inputs: ProvenanceInputs,
    gate_dataset: str,
    attester: KeyBackend,
) -> Path:
    """Sign the SLSA provenance of the release and write it into `out_dir/model.attestations/`."""
    from modelsec.attestations.bundle import sign_statement
    from modelsec.attestations.predicates.provenance import Dataset, provenance_statement
    from modelsec.signer.layout import write_bundle_file

    datasets = [*inputs.datasets]
    if all(d.sha256 != gate_dataset for d in datasets):
        datasets.append(Dataset("robustness-gate", gate_dataset))
    statement = provenance_statement(
        root_digest,
        name=final_dir.name,
        environment=inputs.environment,
        sources=inputs.sources,
        datasets=datasets,
        base_models=inputs.base_models,
    )
    folder = out_dir / STATEMENTS_DIR_NAME
    folder.mkdir(exist_ok=True)
    return write_bundle_file(
        folder / PROVENANCE_FILE_NAME, sign_statement(statement, attester), what="provenance", replace=False
    )
