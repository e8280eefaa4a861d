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

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from modelsec.config import API_VERSION, ConfigModel, ConfigPath, Fraction, Text, read_config, validate

__all__ = ["GateSpec", "load_gate_spec"]


class GateSpec(ConfigModel):
    """The release pipeline's PGD gate (`modelsec release --gate-config`).

    `apiVersion` and `kind` may be left out (gate files written before they existed); when given they must
    be `modelsec.dev/v1alpha1` and `GateSpec`.
    """

    # The docstring above is the schema's description: further notes are comments. A left-out `apiVersion`
    # or `kind` reads as the one accepted value; `data` is resolved against the file's directory.
    model_config = ConfigDict(title="GateSpec")

    api_version: Literal["modelsec.dev/v1alpha1"] = Field(default=None, validate_default=True)
    kind: Literal["GateSpec"] = Field(default=None, validate_default=True)
    architecture: Text
    data: ConfigPath
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

    @field_validator("api_version", "kind", mode="before")
    @classmethod
    def _current_when_left_out(cls, value: Any, info: ValidationInfo) -> Any:
        # Only a left-out field reaches here as None: a `null` in the file is refused before.
        if value is None:
            return API_VERSION if info.field_name == "api_version" else "GateSpec"
        return value


def load_gate_spec(path: Path) -> GateSpec:
    """Read and validate a gate configuration file (YAML or JSON); `data` is relative to the file.

    The file is checked against `GateSpec` (published as `schemas/gate-spec.schema.json`); the dataset and
    the architecture are not opened here.

    Raises:
        PolicyError: Unreadable file, larger than 1 MiB, not YAML/JSON, unknown or missing fields, wrong
            types or values out of range (the message names the file and the field).
    """
    _, doc = read_config(path, "gate configuration")
    return validate(GateSpec, doc, str(path), base_dir=path.parent)
