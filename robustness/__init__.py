"""The PGD L-infinity robustness gate (Madry et al. 2018) and its signed attestation.

Public verbs: `run_pgd_gate` (verify, load, evaluate, sign: the CLI's `modelsec gate pgd`), `run_gate`
(evaluate an already loaded classifier), `pgd_attack` / `fgsm_attack` (one batch), `load_dataset`,
`load_verified_model`, `sign_gate_result`; values: `GateConfig`, `SanityConfig`, `FastPaths`, `GateResult`,
`Accuracy`, `Dataset`; helpers: `wilson_interval`, `batch_seed`; the predicate type `PREDICATE_TYPE`.

Importing this package does not import torch (names resolve on first use, PEP 562), so the CLI starts
fast; everything except `wilson_interval`, `Accuracy` and `PREDICATE_TYPE` needs torch (the `torch`
extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelsec.attestations.predicates.gate import GATE_PREDICATE_TYPE
from modelsec.lazy import lazy_exports

if TYPE_CHECKING:
    from modelsec.robustness.attestation import gate_statement, sign_gate_result, write_attestation
    from modelsec.robustness.data import Dataset, dataset_from_tensors, load_dataset
    from modelsec.robustness.distributed import DistContext, from_environment
    from modelsec.robustness.gate import (
        GateConfig,
        GateProgress,
        GateResult,
        SanityCheck,
        SanityConfig,
        run_gate,
    )
    from modelsec.robustness.model_loading import VerifiedClassifier, load_verified_model
    from modelsec.robustness.pgd import FastPaths, batch_seed, fgsm_attack, pgd_attack
    from modelsec.robustness.pipeline import GateOutcome, run_pgd_gate
    from modelsec.robustness.stats import Accuracy, wilson_interval

__all__ = [
    "PREDICATE_TYPE",
    "Accuracy",
    "Dataset",
    "DistContext",
    "FastPaths",
    "GateConfig",
    "GateOutcome",
    "GateProgress",
    "GateResult",
    "SanityCheck",
    "SanityConfig",
    "VerifiedClassifier",
    "batch_seed",
    "dataset_from_tensors",
    "fgsm_attack",
    "from_environment",
    "gate_statement",
    "load_dataset",
    "load_verified_model",
    "pgd_attack",
    "run_gate",
    "run_pgd_gate",
    "sign_gate_result",
    "wilson_interval",
    "write_attestation",
]

PREDICATE_TYPE = GATE_PREDICATE_TYPE

_WHERE = {
    "Accuracy": "stats",
    "wilson_interval": "stats",
    "Dataset": "data",
    "dataset_from_tensors": "data",
    "load_dataset": "data",
    "DistContext": "distributed",
    "from_environment": "distributed",
    "FastPaths": "pgd",
    "batch_seed": "pgd",
    "fgsm_attack": "pgd",
    "pgd_attack": "pgd",
    "GateConfig": "gate",
    "GateProgress": "gate",
    "GateResult": "gate",
    "SanityCheck": "gate",
    "SanityConfig": "gate",
    "run_gate": "gate",
    "VerifiedClassifier": "model_loading",
    "load_verified_model": "model_loading",
    "gate_statement": "attestation",
    "sign_gate_result": "attestation",
    "write_attestation": "attestation",
    "GateOutcome": "pipeline",
    "run_pgd_gate": "pipeline",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals(), __all__)
