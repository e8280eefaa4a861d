"""The release pipeline of the CI signing stage (a front door): watermark -> sign -> gate -> attest -> verify.

The pipeline is `modelsec.release.pipeline`; this face exports what callers use.
"""

from __future__ import annotations

from modelsec.release.gate_spec import GateSpec, load_gate_spec
from modelsec.release.pipeline import ReleaseResult, check_release_report, release_model

__all__ = ["GateSpec", "ReleaseResult", "check_release_report", "load_gate_spec", "release_model"]
