"""Property: every gate, watermark and OMS statement parser raises only modelsec errors on extreme numbers.

Random predicates put huge integers (beyond 64 bits, up to 10**400), float edge values (±0, subnormals,
1e308, NaN, ±Infinity), booleans, strings and nulls into every field the parsers read; the statement goes
through the exact bytes path (JSON text → `parse_statement`) and then every consumer: the range checks,
the verifier's policy checks, `detection_hints`, `parse_manifest` and `admit_to_store`'s baseline (issue 14).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelsec.attestations.predicates import check_predicate_numbers
from modelsec.attestations.predicates.gate import GATE_PREDICATE_TYPE
from modelsec.attestations.predicates.oms import OMS_PREDICATE_TYPE, parse_manifest
from modelsec.attestations.predicates.watermark import WATERMARK_PREDICATE_TYPE
from modelsec.attestations.statement import parse_statement
from modelsec.errors import Error
from modelsec.policy import RobustnessRequirement, WatermarkRequirement
from modelsec.verifier._statement_checks import check_gate, check_watermark
from modelsec.watermark.attestation import detection_hints
from tests.unit.verifier.test_joint_verification import gate_predicate

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EXTREME = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 2**63, 2**64, 2**64 - 1, -(2**63) - 1, 0, -1, 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1e308, -1e308, 1.0 + 2**-52, float("nan"), float("inf")]),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2026-01-01T00:00:00Z"]),
    st.lists(st.integers(min_value=-(10**30), max_value=10**30) | st.floats(), max_size=3),
)

GATE_PATHS = [
    "parameters.eps", "parameters.stepSize", "parameters.steps", "parameters.restarts", "parameters.seed",
    "dataset.samples", "results.clean.correct", "results.clean.total", "results.robust.correct",
    "results.robust.total", "results.robust.accuracy", "results.robust.wilson95", "gate.threshold",
    "gate.value", "finishedAt", "runBy.server", "runBy.requester", "dataset.digest.sha256",
]  # fmt: skip
WM_PATHS = [
    "parameters.kappa", "parameters.pilotBits", "parameters.blockSize", "parameters.targetCarriersLog2",
    "parameters.densityLog2", "parameters.minTensorElements", "parameters.maxRelativeChange",
    "parameters.maxMessageBits", "parameters.minCarriersPerBit", "parameters.messageBits",
    "detection.confidence", "detection.falsePositiveProbability", "detection.bitMatches", "embeddedAt",
    "runBy.server",
]  # fmt: skip
RUN_BY = {"server": "signer.test", "requester": "ci"}


def _wm() -> dict[str, Any]:
    return {
        "scheme": {"name": "modelsec-ss-v1"},
        "parameters": {
            "kappa": 3.0,
            "pilotBits": 32,
            "blockSize": 64,
            "targetCarriersLog2": 16,
            "densityLog2": 4,
            "minTensorElements": 1024,
            "maxRelativeChange": 0.05,
            "maxMessageBits": 256,
            "minCarriersPerBit": 64,
            "messageBits": 64,
        },
        "carriers": {"tensors": [{"name": "w", "carriers": 10}]},
        "keyCommitment": {"algorithm": "hmac-sha256", "value": "00" * 32},
        "messageCommitment": {"algorithm": "hmac-sha256", "value": "11" * 32},
        "detection": {"detected": True, "confidence": 1.0, "falsePositiveProbability": 1e-30},
        "embeddedAt": "2026-01-01T00:00:00Z",
        "runBy": dict(RUN_BY),
    }


def _set(doc: dict[str, Any], path: str, value: object) -> None:
    *parents, last = path.split(".")
    for p in parents:
        doc = doc[p]
    doc[last] = value


def _oms() -> dict[str, Any]:
    tensor = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "digest": "cd" * 32}
    return {
        "serialization": {
            "method": "files",
            "hash_type": "sha256",
            "allow_symlinks": False,
            "ignore_paths": [],
        },
        "resources": [{"name": "a.safetensors", "algorithm": "sha256", "digest": "ab" * 32}],
        "modelsec": {"version": 1, "tensors": {"a.safetensors": {"w": tensor}}},
    }


OMS_PATHS = [
    "modelsec.version",
    "modelsec.tensors.a.safetensors.w.shape",
    "modelsec.tensors.a.safetensors.w.data_offsets",
    "serialization.allow_symlinks",
]


def _payload(ptype: str, predicate: dict[str, Any]) -> bytes:
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "m", "digest": {"sha256": "a" * 64}}],
        "predicateType": ptype,
        "predicate": predicate,
    }
    # allow_nan writes NaN/Infinity tokens and Python writes 10**400 in full: the raw-bytes path sees both.
    return json.dumps(doc, allow_nan=True).encode()


def _only_modelsec_errors(*steps: Any) -> None:
    for step in steps:
        try:
            step()
        except Error:
            return


def _set_oms(doc: dict[str, Any], path: str, value: object) -> None:
    if path.startswith("modelsec.tensors"):
        doc["modelsec"]["tensors"]["a.safetensors"]["w"][path.rsplit(".", 1)[1]] = value
    else:
        _set(doc, path, value)


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(GATE_PATHS), EXTREME, min_size=1, max_size=4))
def test_gate_statements(changes: dict[str, object]) -> None:
    predicate = {**gate_predicate(), "runBy": dict(RUN_BY)}
    for path, value in changes.items():
        _set(predicate, path, value)
    now = datetime(2026, 11, 29, tzinfo=UTC)
    holder: dict[str, Any] = {}

    def parse() -> None:
        holder["s"] = parse_statement(_payload(GATE_PREDICATE_TYPE, predicate), what="gate")

    for rule in ("point", "strict"):
        req = RobustnessRequirement(
            min_eps=0.03,
            rule=rule,
            max_age_seconds=86400.0,
            min_steps=10,
            min_restarts=1,
            datasets=frozenset({"ab" * 32}),
            require_server_run=True,
        )
        _only_modelsec_errors(
            parse,
            lambda: check_predicate_numbers(holder["s"], what="gate"),
            lambda: check_gate(holder["s"].predicate, req, "gate", now),  # noqa: B023
        )


@pytest.mark.slow
@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(WM_PATHS), EXTREME, min_size=1, max_size=4))
def test_watermark_statements(changes: dict[str, object]) -> None:
    predicate = _wm()
    for path, value in changes.items():
        _set(predicate, path, value)
    holder: dict[str, Any] = {}

    def parse() -> None:
        holder["s"] = parse_statement(_payload(WATERMARK_PREDICATE_TYPE, predicate), what="wm")

    _only_modelsec_errors(
        parse,
        lambda: check_predicate_numbers(holder["s"], what="wm"),
        lambda: check_watermark(holder["s"].predicate, WatermarkRequirement(require_server_run=True), "wm"),
    )
    _only_modelsec_errors(parse, lambda: detection_hints(holder["s"].predicate, what="wm"))


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(OMS_PATHS), EXTREME, min_size=1, max_size=3))
def test_oms_statements(changes: dict[str, object]) -> None:
    predicate = _oms()
    for path, value in changes.items():
        _set_oms(predicate, path, value)
    holder: dict[str, Any] = {}

    def parse() -> None:
        holder["s"] = parse_statement(_payload(OMS_PREDICATE_TYPE, predicate), what="oms")

    _only_modelsec_errors(parse, lambda: parse_manifest(holder["s"], what="oms"))
