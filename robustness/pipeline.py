"""The release-stage entry point: verify the model, load the data, run the gate, sign the attestation.

`run_pgd_gate` is what the `modelsec gate pgd` command calls; the CLI only converts options and maps
errors. Order: (1) the model directory is verified under the policy and the classifier is built from the
verified bytes (`modelsec.robustness.model_loading`); no dataset is read and no attack runs unless that
succeeds; (2) the dataset is loaded and validated; (3) the gate runs (data-parallel under torchrun);
(4) rank 0 signs the statement (subject: the model root digest) and writes it when a path is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from modelsec.attestations import StatementSigner
from modelsec.attestations.predicates.run_by import RunBy
from modelsec.errors import PolicyError
from modelsec.policy import Policy
from modelsec.robustness.attestation import sign_gate_result, write_attestation
from modelsec.robustness.data import load_dataset
from modelsec.robustness.distributed import DistContext, from_environment
from modelsec.robustness.gate import GateConfig, GateProgress, GateResult, SanityConfig, run_gate
from modelsec.robustness.gate_config import default_step_size
from modelsec.robustness.model_loading import load_verified_model
from modelsec.robustness.stats import Accuracy
from modelsec.verifier.admission import ModelAdmission

__all__ = ["GateOutcome", "run_pgd_gate"]


@dataclass(frozen=True, slots=True)
class GateOutcome:
    """What `run_pgd_gate` produced.

    Attributes:
        result: The measurements and verdict.
        root_digest: The verified model root digest (the attestation subject).
        model_name: The model directory name.
        bundle: The signed attestation bundle (None without a signer, and on ranks other than 0).
        out: Where the bundle was written, or None.
        is_main: Whether this process is rank 0.
        sweep: `(eps, robust accuracy)` at each ε of the sweep and at the gate's ε, ascending (empty
            without a sweep). Displayed in reports, never signed: the attestation holds the gate's run.
    """

    result: GateResult
    root_digest: str
    model_name: str
    bundle: bytes | None
    out: Path | None
    is_main: bool = True
    sweep: tuple[tuple[float, Accuracy], ...] = ()


def run_pgd_gate(
    model_dir: Path,
    *,
    policy: Policy | ModelAdmission,
    architecture: str,
    data: str | Path,
    config: GateConfig,
    signer: StatementSigner | None = None,
    run_by: RunBy | None = None,
    out: Path | None = None,
    bundles: Sequence[Path] | None = None,
    progress: GateProgress | None = None,
    dist: DistContext | None = None,
    sweep: Sequence[float] = (),
) -> GateOutcome:
    """Verify `model_dir`, run the PGD gate on `data`, and sign the result.

    The attestation is signed and written whatever the verdict (a FAILED result is evidence too); the
    caller decides what a FAILED verdict means (the CLI exits 1; `outcome.result.raise_for_verdict()`
    raises `GateFailedError`).

    Args:
        model_dir: Signed model directory (safetensors weights).
        policy: Trusted keys for the weights signatures.
        architecture: Import path `package.module:factory`.
        data: Dataset file (safetensors or `.npz`) or loader import path.
        config: Attack parameters and rule.
        signer: Key backend that signs the attestation; None skips signing.
        run_by: Who runs the gate, recorded as `runBy`, when a modelsec server does (RunGate).
        out: Where to write the bundle (rank 0 only); None keeps it in memory.
        bundles: Explicit weights-signature bundles (default: found in `model_dir`).
        progress: Progress sink.
        dist: Data-parallel context; default: joined from the torchrun environment, else one process.
        sweep: Further ε values (> 0) to measure robust accuracy at, after the gate, with the same attack
            (the step size scaled with ε, sanity checks not repeated); for reports only.

    Returns:
        The outcome.

    Raises:
        SignatureError, DigestMismatchError, FileSetMismatchError, MalformedArtifactError,
        PolicyViolationError: The model must not be trusted (nothing was evaluated).
        MalformedArtifactError: The dataset is malformed or its labels exceed the model's classes.
        PolicyError: Bad configuration or architecture, or an ε of `sweep` that is not > 0.
        BackendUnavailableError: CUDA or the process group is unavailable.
        PolicyError: The bundle cannot be written to `out`.

    Example:
        >>> outcome = run_pgd_gate(Path("lenet"), policy=policy, architecture="lenet5:lenet5",
        ...     data="mnist.npz", config=cfg, signer=key, out=Path("gate.sig"))  # doctest: +SKIP
        >>> outcome.result.verdict  # doctest: +SKIP
        'PASSED'
    """
    if any(not eps > 0 for eps in sweep):
        raise PolicyError(f"every eps of the sweep must be > 0, got {', '.join(map(str, sweep))}")
    ctx = dist or from_environment(config.device)
    classifier = load_verified_model(model_dir, policy, architecture, bundles=bundles)
    dataset = load_dataset(data, clip=config.clip)
    result = run_gate(classifier.module, dataset, config, progress=progress, dist=ctx)
    bundle = None
    written = None
    if signer is not None and ctx.is_main:
        bundle = sign_gate_result(
            result,
            signer,
            root_digest=classifier.root_digest,
            model_name=classifier.model_name,
            architecture=architecture,
            weights=classifier.weights,
            run_by=run_by,
        )
        if out is not None:
            write_attestation(out, bundle)
            written = out
    points = {config.eps: result.robust}
    for eps in sorted(set(sweep) - {config.eps}):
        step = config.step_size * eps / config.eps if config.eps > 0 else default_step_size(eps, config.steps)
        scaled = replace(config, eps=eps, step_size=step, sanity=SanityConfig(enabled=False))
        points[eps] = run_gate(classifier.module, dataset, scaled, progress=progress, dist=ctx).robust
    return GateOutcome(
        result,
        classifier.root_digest,
        classifier.model_name,
        bundle,
        written,
        ctx.is_main,
        sweep=tuple(sorted(points.items())) if sweep else (),
    )
