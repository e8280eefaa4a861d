"""The configuration files' typed models: published JSON Schemas in step with the models, shipped examples
that fit them, and validation failures that are one PolicyError naming the file and the field path
(issue 13)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelsec import policy as policy_module
from modelsec.config import validate
from modelsec.errors import PolicyError
from modelsec.policy import PolicySet
from modelsec.policy.models import PolicyFileModel
from modelsec.release import GateSpec, load_gate_spec
from modelsec.release import gate_spec as gate_spec_module
from modelsec.service import config as config_module
from modelsec.service.config import ServerConfig, load_server_config

REPO = Path(__file__).resolve().parents[3]
SCHEMAS = {
    "ModelPolicy": ("model-policy.schema.json", PolicyFileModel),
    "ServerConfig": ("server-config.schema.json", ServerConfig),
    "GateSpec": ("gate-spec.schema.json", GateSpec),
}


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)


def _heredocs(text: str) -> list[str]:
    # Shell substitutions in an unquoted heredoc stand for a path.
    bodies = re.findall(r"<<'?YAML'?\n(.*?)\nYAML\n", text, re.DOTALL)
    return [re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", "/tmp/demo", b) for b in bodies]


def _examples() -> list[tuple[str, str, dict[str, Any]]]:
    sources = {
        "core/policy/policies.py": _yaml_blocks(policy_module.__doc__ or ""),
        "core/service/config.py": _yaml_blocks(config_module.__doc__ or ""),
        "core/release/gate_spec.py": _yaml_blocks(gate_spec_module.__doc__ or ""),
        "scripts/demo.sh": _heredocs((REPO / "scripts/demo.sh").read_text()),
    }
    docs = ["README.md", "deploy/README.md"]
    docs += sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))  # the documentation site
    for doc in docs:
        sources[doc] = [b for b in _yaml_blocks((REPO / doc).read_text()) if "kind:" in b]
    found = []
    for source, blocks in sources.items():
        for block in blocks:
            doc = yaml.safe_load(block)
            ours = isinstance(doc, dict) and str(doc.get("apiVersion", "modelsec")).startswith("modelsec")
            # Kubernetes and kustomize documents in the READMEs are checked by tests/integration/deploy.
            if ours and ("kind" in doc or "architecture" in doc):
                found.append((source, doc.get("kind", "GateSpec"), doc))
    return found


EXAMPLES = _examples()


def test_every_kind_of_config_has_a_shipped_example() -> None:
    assert {kind for _, kind, _ in EXAMPLES} == set(SCHEMAS)
    assert ("scripts/demo.sh", "GateSpec") in {(s, k) for s, k, _ in EXAMPLES}  # without apiVersion/kind


@pytest.mark.parametrize(("source", "kind", "doc"), EXAMPLES, ids=[f"{s}:{k}" for s, k, _ in EXAMPLES])
def test_shipped_examples_fit_the_models_and_the_schemas(source: str, kind: str, doc: dict[str, Any]) -> None:
    name, model = SCHEMAS[kind]
    validate(model, doc, source)
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "schemas" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)
    with pytest.raises(jsonschema.ValidationError, match="surprise"):
        jsonschema.Draft202012Validator(schema).validate({**doc, "surprise": 1})


def _policy_text(key_dir: Path, keys: str, extra: str = "") -> str:
    return (
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: p\n    match: ['file:///m/*']\n    keys:\n{keys}{extra}"
    )


def test_errors_name_the_file_and_the_field_path(tmp_path: Path, key_dir: Path) -> None:
    path = tmp_path / "policy.yaml"
    keys = f"      - {key_dir / 'ecdsa-p256.pub.pem'}\n      - {{path: 7}}\n"
    path.write_text(_policy_text(key_dir, keys))
    with pytest.raises(
        PolicyError, match=re.escape(f"{path}: policies[0].keys[1].path must be a valid string")
    ):
        PolicySet.from_file(path)


@pytest.mark.parametrize(
    ("extra", "mentions"),
    [
        # A mis-indented body leaves `robustness:` null: it must not read as "no requirement".
        ("    attestations:\n      robustness:\n    minEps: 0.3\n", "unknown field"),
        (
            "    attestations:\n      robustness:\n",
            r"policies\[0\]\.attestations: robustness must not be null",
        ),
        ("    name2: 2024-01-01\n", r"unknown field\(s\) \['name2'\]"),
        ("    requireAlgorithms: [sm2, rsa]\n", r"requireAlgorithms\[1\] must be .*got 'rsa'"),
        ("    requireAlgorithms: !!set {sm2: null}\n", r"requireAlgorithms must be a list"),
        ("    allowRemoteCode: 'false'\n", "allowRemoteCode must be true or false"),
        ("    limits: {maxFiles: 4096.0}\n", r"limits\.maxFiles must be a valid integer"),
        ("    attestations: {watermark: {minConfidence: .nan}}\n", "minConfidence must be a finite number"),
        # PyYAML (YAML 1.1) reads 1e-9 as text, as the policy module's own example used to write it.
        ("    attestations: {watermark: {maxFalsePositive: 1e-9}}\n", r"not the text '1e-9' .*write 1\.0e-9"),
        (
            "    attestations: {watermark: {keyFile: !!binary aGk=}}\n",
            r"watermark\.keyFile must be a valid str",
        ),
    ],
)
def test_odd_values_are_policy_errors(tmp_path: Path, key_dir: Path, extra: str, mentions: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(_policy_text(key_dir, f"      - {key_dir / 'ecdsa-p256.pub.pem'}\n", extra))
    with pytest.raises(PolicyError, match=mentions):
        PolicySet.from_file(path)


def test_shorthand_and_mapping_keys_keep_their_roles(tmp_path: Path, key_dir: Path) -> None:
    path = tmp_path / "policy.yaml"
    pub = key_dir / "ecdsa-p256.pub.pem"
    path.write_text(
        _policy_text(key_dir, f"      - {pub}\n      - {{path: {pub}, name: g, roles: [gate]}}\n")
    )
    shorthand, mapped = PolicySet.from_file(path).policies[0].keys
    assert shorthand.roles == frozenset() and shorthand.name == "ecdsa-p256.pub.pem"
    assert mapped.roles == {"gate"} and mapped.name == "g"


def test_mistakes_that_read_as_something_else_are_refused(tmp_path: Path, key_dir: Path) -> None:
    """User trial 2: `roles: []` (meant as "no role") granted every role; a `match` without a scheme, or an
    empty one, was accepted and never matched."""
    pub = key_dir / "ecdsa-p256.pub.pem"
    path = tmp_path / "policy.yaml"
    cases = [
        (
            _policy_text(key_dir, f"      - {{path: {pub}, roles: []}}\n"),
            r"keys\[0\]\.roles must not be empty",
        ),
        (
            _policy_text(key_dir, f"      - {pub}\n").replace("match: ['file:///m/*']", "match: ['/m/**']"),
            r"match\[0\] .*'/m/\*\*' has no scheme and can never match.*write 'file:///m/\*\*'",
        ),
        (
            _policy_text(key_dir, f"      - {pub}\n").replace("['file:///m/*']", "[]"),
            r"match must not be empty",
        ),
        (
            _policy_text(key_dir, f"      - {pub}\n")
            + "    authorities:\n      - {name: a, roles: [],\n"
            + "         sigstore: {identities: [{identity: x, issuer: y}]}}\n",
            r"authorities\[0\]\.roles must not be empty",
        ),
    ]
    for text, mentions in cases:
        path.write_text(text)
        with pytest.raises(PolicyError, match=mentions):
            PolicySet.from_file(path)
    path.write_text(_policy_text(key_dir, f"      - {pub}\n").replace("['file:///m/*']", "['**']"))
    assert PolicySet.from_file(path).policies[0].name == "p"


GATE = (
    "architecture: lenet5:lenet5\ndata: mnist.npz\neps: 0.3\nstepSize: 0.01\nsteps: 40\n"
    "minRobustAccuracy: 0.85\n"
)


def test_gate_spec_with_and_without_api_version(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(GATE)
    old = load_gate_spec(path)
    path.write_text("apiVersion: modelsec.dev/v1alpha1\nkind: GateSpec\n" + GATE)
    assert load_gate_spec(path) == old and old.data == tmp_path / "mnist.npz" and old.rule == "point"
    path.write_text("apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\n" + GATE)
    with pytest.raises(PolicyError, match=f"{path}: kind must be 'GateSpec'"):
        load_gate_spec(path)


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        # Old code: inf was accepted here and refused only when the gate ran.
        (GATE.replace("eps: 0.3", "eps: .inf"), "eps must be a finite number"),
        (GATE.replace("steps: 40", "steps: 0"), "steps must be greater than or equal to 1"),
        (GATE + "device: tpu\n", "device must match pattern"),
        (GATE + "rule: loose\n", "rule must be 'point' or 'strict'"),
        # Old code: the gate file was read whole, whatever its size.
        (GATE + "#" * (1 << 20) + "\n", "larger than 1048576 bytes"),
    ],
)
def test_bad_gate_specs_are_policy_errors(tmp_path: Path, text: str, mentions: str) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=mentions):
        load_gate_spec(path)


def test_server_config_null_and_numbers(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    base = (
        "apiVersion: modelsec.dev/v1alpha1\nkind: ServerConfig\nlisten: 127.0.0.1:1\ndataDir: d\npolicy: p\n"
    )
    path.write_text(base + "allowAnonymous: true\ngracePeriod: .inf\n")
    with pytest.raises(PolicyError, match=f"{path}: gracePeriod must be a finite number"):
        load_server_config(path)
    path.write_text(base + "allowAnonymous: true\nkeys: [{name: k, version: 2, path: k.pem}]\n")
    assert load_server_config(path).keys[0].key_version == "k/2"
    path.write_text(base + "allowAnonymous: true\ntls:\n")
    with pytest.raises(PolicyError, match="tls must not be null"):
        load_server_config(path)


def test_model_constants_match_the_policy_module() -> None:
    from typing import get_args

    from modelsec import config as _config
    from modelsec.policy import API_VERSION, ROLES

    assert _config.API_VERSION == API_VERSION and set(get_args(_config.Role)) == ROLES
    for name, _ in SCHEMAS.values():
        schema = json.loads((REPO / "schemas" / name).read_text())
        assert schema["properties"]["apiVersion"]["const"] == API_VERSION
