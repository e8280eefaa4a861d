"""The robustness-gate attestation: an in-toto Statement v1, DSSE-signed into a sigstore bundle.

The subject is the model root digest (the OMS SHA-256 subject digest of the weights manifest, the identity
every policy and admission decision uses; DESIGN.md decision 1), named after the model directory (the name
is informational). Predicate type `https://modelsec.dev/robustness-gate/v1`; the predicate is built, parsed
and checked by `modelsec.attestations.predicates.gate` (its one home, where its fields are shown) from the
run's `GateResult.to_json()` and the model fields.

A FAILED run is attested too (the verdict is part of the signed statement): a policy that requires the
robustness attestation checks `gate.verdict`, `attack`, `parameters.eps` and the threshold itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelsec.attestations import Statement, StatementSigner, sign_statement
from modelsec.attestations.predicates.gate import build_gate_predicate
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
    predicate = build_gate_predicate(result.to_json(), architecture=architecture, weights=weights)
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
