"""Who ran a gate or an embed (`runBy`), and how the gate was run, judged by policy (issue 14, item 1).

A gate's steps, restarts and dataset are the caller's choice in RunGate: before, no policy could pin them, so
a weak run (1 PGD step on an unlisted dataset) produced an honest PASSED that every policy accepted; and no
predicate said whether a server ran the gate at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelsec.attestations.predicates.gate import check_gate_run, gate_statement, parse_gate_predicate
from modelsec.attestations.predicates.run_by import RunBy, parse_run_by
from modelsec.attestations.predicates.watermark import (
    check_watermark_run,
    parse_watermark_predicate,
    watermark_statement,
)
from modelsec.errors import AttestationError, MalformedArtifactError, PolicyError
from modelsec.policy import PolicySet, RobustnessRequirement
from tests.unit.verifier.test_joint_verification import gate_predicate, watermark_predicate

RUN_BY = {"server": "signer.example.org", "requester": "spiffe://example.org/ci/release"}
DATASET = "ab" * 32  # gate_predicate()'s dataset digest


def test_run_by_round_trips_through_the_gate_and_watermark_builders() -> None:
    who = RunBy(**RUN_BY)
    gate = gate_statement(gate_predicate(), root_digest="c" * 64, model_name="m", run_by=who)
    assert gate.predicate["runBy"] == RUN_BY
    assert parse_gate_predicate(gate.predicate, what="g").run_by == who
    wm = watermark_statement(watermark_predicate(), {"sha256": "c" * 64}, name="m", run_by=who)
    assert parse_watermark_predicate(wm.predicate, what="w").run_by == who
    # Runs not performed by a server record nothing.
    assert parse_gate_predicate(gate_predicate(), what="g").run_by is None


@pytest.mark.parametrize(
    "value",
    [
        "server",
        [],
        {"server": "s"},
        {"server": "s", "requester": "r", "extra": 1},
        {"server": "", "requester": "r"},
        {"server": "s", "requester": 7},
        {"server": "s\n", "requester": "r"},
        {"server": "s", "requester": "r" * 1025},
    ],
)
def test_malformed_run_by_is_refused_by_name(value: Any) -> None:
    with pytest.raises(MalformedArtifactError, match="g: predicate runBy"):
        parse_run_by({"runBy": value}, what="g")
    with pytest.raises(MalformedArtifactError, match="runBy"):
        parse_gate_predicate({**gate_predicate(), "runBy": value}, what="g")
    with pytest.raises(MalformedArtifactError, match="runBy"):
        parse_watermark_predicate({**watermark_predicate(), "runBy": value}, what="w")


def test_dataset_digest_must_be_a_sha256() -> None:
    with pytest.raises(MalformedArtifactError, match=r"dataset\.digest\.sha256"):
        parse_gate_predicate(gate_predicate(**{"dataset.digest": {"sha256": "AB" * 32}}), what="g")


def _check(pred: dict[str, Any], **req: Any) -> str:
    return check_gate_run(parse_gate_predicate(pred, what="g"), RobustnessRequirement(**req), what="g")


def test_an_unconstrained_requirement_accepts_any_run() -> None:
    assert _check(gate_predicate(**{"parameters.steps": 1})) == ""


@pytest.mark.parametrize(
    ("pred", "req", "mentions"),
    [
        (
            gate_predicate(**{"parameters.steps": 5}),
            {"min_steps": 40},
            "ran 5 PGD steps, the policy needs at least 40",
        ),
        (gate_predicate(), {"min_restarts": 2}, "ran 1 PGD restarts, the policy needs at least 2"),
        (
            gate_predicate(**{"parameters": {"eps": 0.3}}),
            {"min_steps": 2},
            "ran unrecorded PGD steps",
        ),
        (gate_predicate(), {"datasets": frozenset({"cd" * 32})}, f"dataset sha256:{DATASET} is not among"),
        (gate_predicate(**{"dataset": {}}), {"datasets": frozenset({DATASET})}, "sha256:unrecorded"),
        (gate_predicate(), {"require_server_run": True}, "records no server run"),
    ],
)
def test_weak_or_unlisted_or_client_runs_are_refused(
    pred: dict[str, Any], req: dict[str, Any], mentions: str
) -> None:
    with pytest.raises(AttestationError, match=mentions):
        _check(pred, **req)


def test_a_run_meeting_every_setting_is_summarised() -> None:
    pred = {**gate_predicate(**{"parameters.restarts": 3}), "runBy": RUN_BY}
    summary = _check(
        pred, min_steps=40, min_restarts=3, datasets=frozenset({DATASET}), require_server_run=True
    )
    assert summary == (
        f"steps 40 >= 40, restarts 3 >= 3, dataset sha256:{DATASET[:12]}, "
        "run by signer.example.org for spiffe://example.org/ci/release"
    )


def test_watermark_server_run_requirement() -> None:
    plain = parse_watermark_predicate(watermark_predicate(), what="w")
    assert check_watermark_run(plain, require_server_run=False, what="w") == ""
    with pytest.raises(AttestationError, match="w: the watermark records no server run"):
        check_watermark_run(plain, require_server_run=True, what="w")
    served = parse_watermark_predicate({**watermark_predicate(), "runBy": RUN_BY}, what="w")
    assert "embedded by signer.example.org" in check_watermark_run(served, require_server_run=True, what="w")


def _policy_file(tmp_path: Path, key_dir: Path, robustness: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: p\n    match: ['**']\n    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
        f"    attestations:\n      robustness: {robustness}\n"
    )
    return path


def test_policy_file_fields(tmp_path: Path, key_dir: Path) -> None:
    path = _policy_file(
        tmp_path,
        key_dir,
        f"{{minSteps: 40, minRestarts: 2, datasetDigests: [{DATASET}], requireServerRun: true}}",
    )
    req = PolicySet.from_file(path).policies[0].robustness
    assert req is not None
    assert (req.min_steps, req.min_restarts, req.datasets, req.require_server_run) == (
        40,
        2,
        frozenset({DATASET}),
        True,
    )


@pytest.mark.parametrize(
    ("robustness", "mentions"),
    [
        ("{minSteps: 0}", "minSteps"),
        ("{minSteps: 100000000000}", "minSteps"),
        ("{minRestarts: -1}", "minRestarts"),
        ("{datasetDigests: []}", "datasetDigests"),
        ("{datasetDigests: [ABC]}", "datasetDigests"),
        ("{requireServerRun: maybe}", "requireServerRun"),
    ],
)
def test_policy_file_refuses_bad_run_settings(
    tmp_path: Path, key_dir: Path, robustness: str, mentions: str
) -> None:
    with pytest.raises(PolicyError, match=mentions):
        PolicySet.from_file(_policy_file(tmp_path, key_dir, robustness))
