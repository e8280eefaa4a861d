"""The robustness-gate attestation: an in-toto Statement v1, DSSE-signed into a sigstore bundle.

The subject is the model root digest (the OMS SHA-256 subject digest of the weights manifest, the identity
every policy and admission decision uses; DESIGN.md decision 1), named after the model directory (the name
is informational). Predicate type `https://modelsec.dev/robustness-gate/v1`; the predicate
(`GateResult.to_json()` plus the model fields) reads:

```json
{"attack": "pgd-linf",
 "parameters": {"norm": "Linf", "eps": 0.3, "stepSize": 0.01, "steps": 40, "restarts": 1,
                "randomStart": true, "loss": "cross-entropy", "seed": 0, "inputRange": [0.0, 1.0],
                "batchSize": 256},
 "dataset": {"digest": {"sha256": "<hex>"}, "samples": 5000, "source": "mnist.npz", "format": "npz"},
 "results": {"clean":  {"correct": 4950, "total": 5000, "accuracy": 0.99, "wilson95": [0.987, 0.992]},
             "robust": {"correct": 4700, "total": 5000, "accuracy": 0.94, "wilson95": [0.933, 0.946]}},
 "gate": {"metric": "robustAccuracy", "threshold": 0.85, "rule": "point", "minSamples": 100,
          "value": 0.94, "verdict": "PASSED", "reasons": []},
 "sanity": {"enabled": true, "samples": 256, "tolerance": 0.02, "largeEps": null,
            "largeEpsMaxAccuracy": 0.05, "checks": [{"name": "eps_zero", "passed": true, "detail": "..."}]},
 "environment": {"device": "cpu", "deviceName": "cpu", "worldSize": 1, "backend": null,
                 "dtypes": {"inputs": "float32", "parameters": "float32", "compute": "float32",
                            "projection": "float32"},
                 "fastPaths": {"channelsLast": false, "bf16Autocast": false, "torchCompile": false},
                 "torch": "2.13.0+cpu", "deterministic": true},
 "model": {"architecture": "lenet5:lenet5", "weights": ["model.safetensors"]},
 "elapsedSeconds": 12.345,
 "finishedAt": "2025-01-31T12:00:00Z",
 "runBy": {"server": "signer.example.org", "requester": "spiffe://example.org/ci/release"}}
```

`runBy` is recorded only when a modelsec server ran the gate (RunGate;
`modelsec.attestations.predicates.run_by`).

A FAILED run is attested too (the verdict is part of the signed statement): a policy that requires the
robustness attestation checks `gate.verdict`, `attack`, `parameters.eps` and the threshold itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelsec.attestations import Statement, StatementSigner, sign_statement
from modelsec.attestations.predicates.gate import gate_statement as build_statement
from modelsec.attestations.predicates.run_by import RunBy
from modelsec.robustness import PREDICATE_TYPE
from modelsec.robustness.gate import GateResult
from modelsec.signer.layout import write_bundle_file

__all__ = ["PREDICATE_TYPE", "gate_statement", "sign_gate_result", "write_attestation"]


def gate_statement(
    result: GateResult,
    *,
    root_digest: str,
    model_name: str,
    architecture: str | None = None,
    weights: Sequence[str] = (),
    run_by: RunBy | None = None,
) -> Statement:
    """Build the gate statement for the model whose root digest is `root_digest`.

    Args:
        result: The gate result.
        root_digest: Hex SHA-256 model root digest (from `verify_model` / `load_verified_model`).
        model_name: The subject name (the model directory name; informational).
        architecture: The factory import path, recorded for reproduction.
        weights: The safetensors files the classifier was built from.
        run_by: Who ran the gate, when a modelsec server did (recorded as `runBy`).

    Returns:
        The unsigned statement.

    Raises:
        MalformedArtifactError: `root_digest` is not 64 lowercase hex characters, or a number of the
            result is out of its field's range (`modelsec.attestations.predicates.gate`).
    """
    predicate = result.to_json()
    predicate["model"] = {"architecture": architecture, "weights": list(weights)}
    return build_statement(predicate, root_digest=root_digest, model_name=model_name, run_by=run_by)


def sign_gate_result(
    result: GateResult,
    signer: StatementSigner,
    *,
    root_digest: str,
    model_name: str,
    architecture: str | None = None,
    weights: Sequence[str] = (),
    run_by: RunBy | None = None,
) -> bytes:
    """Build and DSSE-sign the gate statement; returns the sigstore bundle JSON (`sign_statement`).

    Args:
        result: The gate result.
        signer: A key backend (`modelsec.signer.load_private_key_file`); a policy key with the `gate` role
            must verify it.
        root_digest: Hex SHA-256 model root digest.
        model_name: Subject name.
        architecture: Factory import path.
        weights: Safetensors files used.
        run_by: Who ran the gate, when a modelsec server did (recorded as `runBy`).

    Returns:
        The bundle bytes.

    Raises:
        MalformedArtifactError: `root_digest` is malformed.
    """
    statement = gate_statement(
        result,
        root_digest=root_digest,
        model_name=model_name,
        architecture=architecture,
        weights=weights,
        run_by=run_by,
    )
    return sign_statement(statement, signer)


def write_attestation(path: Path, bundle: bytes) -> None:
    """Write `bundle` to `path` atomically (`modelsec.signer.layout.write_bundle_file`).

    Raises:
        PolicyError: `path` is a symlink or cannot be written (named in the message).
    """
    write_bundle_file(path, bundle, what="gate attestation")
