"""The release gate's configuration file (`modelsec release --gate-config`): its model and its loader.

The gate configuration is a small YAML/JSON file (validated strictly; `apiVersion` and `kind` may be left
out, as in files written before they existed; JSON Schema: `schemas/gate-spec.schema.json`):

```yaml
apiVersion: modelsec.dev/v1alpha1
kind: GateSpec
architecture: lenet5:lenet5        # import path of the architecture factory
data: mnist.npz                    # .npz / .safetensors with `inputs` and `labels` (relative to this file)
eps: 0.3
stepSize: 0.01
steps: 40
restarts: 1
minRobustAccuracy: 0.85
rule: point                        # or strict (Wilson 95% lower bound)
minSamples: 100
seed: 0
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from modelsec.config import ConfigModel, Fraction, Text, read_config, validate

__all__ = ["GateSpec", "GateSpecModel", "load_gate_spec"]


class GateSpecModel(ConfigModel):
    """The release pipeline's PGD gate (`modelsec release --gate-config`).

    `apiVersion` and `kind` may be left out (gate files written before they existed); when given they must
    be `modelsec.dev/v1alpha1` and `GateSpec`.
    """

    model_config = ConfigDict(title="GateSpec")

    api_version: Literal["modelsec.dev/v1alpha1"] | None = None
    kind: Literal["GateSpec"] | None = None
    architecture: Text
    data: Text
    eps: float = Field(ge=0.0)
    step_size: float = Field(gt=0.0)
    steps: int = Field(ge=1)
    restarts: int = Field(default=1, ge=1)
    min_robust_accuracy: Fraction
    rule: Literal["point", "strict"] = "point"
    min_samples: int = Field(default=100, ge=1)
    seed: int = 0
    batch_size: int = Field(default=256, ge=1)
    device: Annotated[str, Field(pattern=r"^(cpu|cuda|cuda:\d+)$")] = "cpu"


@dataclass(frozen=True, slots=True)
class GateSpec:
    """The PGD gate of a release: architecture factory, dataset, and the attack and threshold."""

    architecture: str
    data: Path
    eps: float
    step_size: float
    steps: int
    min_robust_accuracy: float
    restarts: int = 1
    rule: str = "point"
    min_samples: int = 100
    seed: int = 0
    batch_size: int = 256
    device: str = "cpu"


def load_gate_spec(path: Path) -> GateSpec:
    """Read and validate a gate configuration file (YAML or JSON); `data` is relative to the file.

    The file is checked against `GateSpecModel` (published as
    `schemas/gate-spec.schema.json`); the dataset and the architecture are not opened here.

    Raises:
        PolicyError: Unreadable file, larger than 1 MiB, not YAML/JSON, unknown or missing fields, wrong
            types or values out of range (the message names the file and the field).
    """
    _, doc = read_config(path, "gate configuration")
    spec = validate(GateSpecModel, doc, str(path))
    return GateSpec(
        architecture=spec.architecture,
        data=path.parent / spec.data,
        eps=spec.eps,
        step_size=spec.step_size,
        steps=spec.steps,
        min_robust_accuracy=spec.min_robust_accuracy,
        restarts=spec.restarts,
        rule=spec.rule,
        min_samples=spec.min_samples,
        seed=spec.seed,
        batch_size=spec.batch_size,
        device=spec.device,
    )
