"""SLSA v1 provenance statements for tests, in the shape `modelsec release` writes (issue 29, item 2).

`provenance_statement` builds an in-toto statement (predicateType `https://slsa.dev/provenance/v1`) about a
model root digest, whose `buildDefinition.resolvedDependencies` name the training code (a git commit), the
datasets (sha256) and, optionally, the base model as `{"name": "base-model", "digest": {"sha256": ROOT}}`;
`signed_provenance` signs it as a DSSE bundle with the existing signing API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.attestations.bundle import StatementSigner

SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
GITHUB_BUILDER = "https://github.com/actions/runner/github-hosted"
GITHUB_BUILD_TYPE = "https://actions.github.io/buildtypes/workflow/v1"


def provenance_statement(
    root: str,
    *,
    builder: str = GITHUB_BUILDER,
    repository: str = "https://github.com/acme/models",
    commit: str = "a" * 40,
    datasets: Sequence[str] = ("d" * 64,),
    base: str | None = None,
) -> Statement:
    """An unsigned SLSA v1 provenance statement about model `root` (hex SHA-256)."""
    deps: list[dict[str, Any]] = [
        {
            "uri": f"git+{repository}@refs/heads/main",
            "digest": {"gitCommit": commit},
            "name": "training-code",
        },
        *({"name": "dataset", "digest": {"sha256": d}} for d in datasets),
    ]
    if base is not None:
        deps.append({"name": "base-model", "digest": {"sha256": base}, "annotations": {"role": "base-model"}})
    predicate = {
        "buildDefinition": {
            "buildType": GITHUB_BUILD_TYPE,
            "externalParameters": {
                "workflow": {
                    "repository": repository,
                    "ref": "refs/heads/main",
                    "path": ".github/workflows/release.yml",
                }
            },
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": builder},
            "metadata": {
                "invocationId": f"{repository}/actions/runs/1/attempts/1",
                "startedOn": "2025-01-01T00:00:00Z",
            },
        },
    }
    return Statement((Subject("model", {"sha256": root}),), SLSA_PROVENANCE_V1, predicate)


def signed_provenance(root: str, signer: StatementSigner, **fields: Any) -> bytes:
    """`provenance_statement(root, **fields)` signed as a DSSE bundle by `signer`."""
    return sign_statement(provenance_statement(root, **fields), signer)
