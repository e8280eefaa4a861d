"""Write the JSON Schemas of the configuration files into schemas/ (or the directory given as argv[1]).

The schemas are generated from the pydantic models of each file (`modelsec.policy.models`,
`modelsec.service.config`, `modelsec.release.gate_spec`); a test checks that
regenerating them leaves the committed files byte-identical. Editors pick them up through a first line
`# yaml-language-server: $schema=<url or path of the schema>`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from modelsec.config import json_schema
from modelsec.policy.models import PolicyFileModel
from modelsec.release.gate_spec import GateSpec
from modelsec.service.config import ServerConfig

BASE_URL = "https://modelsec.dev/schemas/v1alpha1/"
SCHEMAS = {
    "model-policy.schema.json": PolicyFileModel,
    "server-config.schema.json": ServerConfig,
    "gate-spec.schema.json": GateSpec,
}


def main(out: Path) -> None:
    """Write every schema of `SCHEMAS` into `out` (sorted keys, two-space indent, final newline)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, model in SCHEMAS.items():
        text = json.dumps(json_schema(model, BASE_URL + name), indent=2, sort_keys=True, ensure_ascii=False)
        (out / name).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "schemas")
