"""One module per predicate: the verifier, the watermark package and the detector read the same rules.

Before, `modelsec.verifier.attestations` and `modelsec.watermark.attestation` each had their own list of
required watermark fields (the verifier did not require `scheme`, the watermark side did not require the
embed-time detection numbers), and the scheme name was written but never read back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelsec.attestations.predicates.gate import parse_gate_predicate
from modelsec.attestations.predicates.watermark import parse_recorded_parameters, parse_watermark_predicate
from modelsec.errors import AttestationError, MalformedArtifactError, UnsupportedAlgorithmError
from modelsec.verifier import verify_attestations
from modelsec.watermark.attestation import detection_hints, verify_watermark_attestation
from tests.unit.attestations.test_bounded_numbers import _wm_predicate
from tests.unit.verifier.test_joint_verification import (  # noqa: F401
    NOW,
    _bundles,
    gate_predicate,
    setup,
    watermark_predicate,
)


def _without(predicate: dict[str, Any], path: str) -> dict[str, Any]:
    node = predicate
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    del node[last]
    return predicate


@pytest.mark.parametrize(
    "missing", ["scheme", "scheme.name", "detection.confidence", "messageCommitment.value"]
)
def test_verifier_and_watermark_package_require_the_same_fields(
    setup: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    missing: str,
) -> None:
    """Old code: the verifier accepted a mark without `scheme`; the watermark side one without confidence."""
    wm = setup["attest"]("watermark", _without(watermark_predicate(), missing))
    verdict = verify_attestations(setup["root"], _bundles(setup, wm=wm), setup["policy"], now=NOW)
    # An unparseable statement is no evidence (ignored, with the reason): the watermark is then missing.
    assert verdict.missing == ("watermark: no watermark attestation",), verdict.reasons()
    assert any(missing.split(".")[0] in r for r in verdict.ignored), verdict.reasons()
    path = tmp_path / "model.watermark.sig"
    path.write_bytes(wm)
    with pytest.raises(AttestationError, match=missing.split(".")[0]):
        verify_watermark_attestation(path, setup["policy"].keys, root_digest=setup["root"])


def test_a_complete_watermark_predicate_verifies_both_ways(setup: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    wm = setup["attest"]("watermark", watermark_predicate())
    assert verify_attestations(setup["root"], _bundles(setup, wm=wm), setup["policy"], now=NOW).ok
    path = tmp_path / "model.watermark.sig"
    path.write_bytes(wm)
    verified = verify_watermark_attestation(path, setup["policy"].keys, root_digest=setup["root"])
    assert verified.scheme == "modelsec-ss-v1" and verified.detected_at_embedding


def test_the_scheme_name_is_read_back_by_the_detector() -> None:
    """Old code: a predicate of another scheme gave hints to this scheme's detector (a meaningless test)."""
    predicate = _wm_predicate()
    assert detection_hints(predicate, what="wm.sig").message_bits == 64
    predicate["scheme"] = {"name": "someone-else/v2"}
    with pytest.raises(UnsupportedAlgorithmError, match="someone-else/v2"):
        detection_hints(predicate, what="wm.sig")
    del predicate["scheme"]
    with pytest.raises(MalformedArtifactError, match="scheme"):
        detection_hints(predicate, what="wm.sig")


def test_parsed_predicates_are_typed() -> None:
    gate = parse_gate_predicate(gate_predicate(), what="g")
    assert (gate.attack, gate.eps, gate.verdict, gate.robust_total) == ("pgd-linf", 0.3, "PASSED", 400)
    assert gate.robust_wilson95 == (0.923, 0.967) and not gate.failed_checks and gate.finished_at is not None
    mark = parse_watermark_predicate(watermark_predicate(), what="w")
    assert mark.detected and mark.confidence == 1.0 and mark.scheme == "modelsec-ss-v1"
    recorded = parse_recorded_parameters(_wm_predicate(), what="w")
    assert recorded.tensors == ("w",) and recorded.density_log2 == 4 and isinstance(recorded.kappa, float)
    with pytest.raises(AttestationError, match=r"sanity\.checks"):
        parse_gate_predicate(gate_predicate(**{"sanity.checks": []}), what="g")
