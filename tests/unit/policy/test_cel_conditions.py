"""CEL conditions (issue 29, item 3): the feature list policies need, tested against each CEL candidate, and
the bound: syntax-tree limits at policy load, a step and time budget at evaluation, and the compile cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import PolicyError
from modelsec.policy.cel import ConditionError, ConditionLimits, compile_condition
from tests.support.policies import first_policy, policy_doc, policy_entry
from tests.support.provenance import provenance_statement

STATEMENT = provenance_statement("b" * 64, base="c" * 64).to_json_object()
STATEMENT["n"], STATEMENT["f"] = 3, 0.5

# What policies need of a CEL implementation, each case (expression, value over STATEMENT).
FEATURES = [
    ("predicate.runDetails.builder.id == 'https://github.com/actions/runner/github-hosted'", True),
    ("has(predicate.runDetails.metadata)", True),
    ("has(predicate.runDetails.nope)", False),
    ("predicate.buildDefinition.resolvedDependencies.exists(d, d.name == 'base-model')", True),
    ("predicate.buildDefinition.resolvedDependencies.all(d, has(d.digest))", True),
    ("predicate.buildDefinition.resolvedDependencies.exists_one(d, has(d.uri))", True),
    ("predicate.buildDefinition.resolvedDependencies.map(d, d.name).size() == 3", True),
    ("size(predicate.buildDefinition.resolvedDependencies.filter(d, d.name == 'dataset')) == 1", True),
    (
        "predicate.buildDefinition.externalParameters.workflow.repository.startsWith('https://github.com/acme/')",
        True,
    ),
    ("predicate.buildDefinition.externalParameters.workflow.ref.endsWith('/main')", True),
    (
        "predicate.buildDefinition.externalParameters.workflow.repository.matches('^https://github[.]com/acme/[a-z]+$')",
        True,
    ),
    ("'sha256' in subject[0].digest", True),
    ("'x' in ['x', 'y'] && !('z' in ['x'])", True),
    ("statement.n > 2 && statement.f < 1.0 && 1u < 2u", True),
    ("timestamp(predicate.runDetails.metadata.startedOn) > timestamp('2024-01-01T00:00:00Z')", True),
    ("predicateType == 'https://slsa.dev/provenance/v1'", True),
    ("b'ab' == b'ab'", True),
]
ERRORS = ["predicate.nope.deeper == 1", "predicate.runDetails.builder.id > 1"]  # an error, never false


def _cel_python(source: str, statement: dict[str, Any]) -> Any:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    activation = {
        "statement": statement,
        "predicate": statement["predicate"],
        "predicateType": statement["predicateType"],
        "subject": statement["subject"],
    }
    return env.program(env.compile(source)).evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def _cel_rust(source: str, statement: dict[str, Any]) -> Any:
    cel = pytest.importorskip("cel")  # PyPI common-expression-language
    activation = {
        "statement": statement,
        "predicate": statement["predicate"],
        "predicateType": statement["predicateType"],
        "subject": statement["subject"],
    }
    return cel.evaluate(source, activation)


def _modelsec(source: str, statement: dict[str, Any]) -> Any:
    return compile_condition(source, where="test").evaluate(statement)


CANDIDATES: dict[str, Callable[[str, dict[str, Any]], Any]] = {
    "cel-python": _cel_python,
    "common-expression-language": _cel_rust,
    "modelsec.policy.cel": _modelsec,
}


@pytest.mark.parametrize("candidate", CANDIDATES)
@pytest.mark.parametrize(("source", "expected"), FEATURES)
def test_feature_list(candidate: str, source: str, expected: bool) -> None:
    assert CANDIDATES[candidate](source, STATEMENT) == expected


@pytest.mark.parametrize("candidate", CANDIDATES)
@pytest.mark.parametrize("source", ERRORS)
def test_a_missing_field_or_wrong_type_is_an_error_not_false(candidate: str, source: str) -> None:
    with pytest.raises(Exception):  # noqa: B017 - each candidate raises its own class
        CANDIDATES[candidate](source, STATEMENT)
    with pytest.raises(ConditionError, match="cannot be evaluated"):
        _modelsec(source, STATEMENT)


@pytest.mark.parametrize(
    ("condition", "reason"),
    [
        ("predicate.a.map(x, predicate.a.map(y, predicate.a.map(z, z)))", "nests 3 comprehensions"),
        ("predicate.a.all(x, x.b.exists(y, y.c.filter(z, z > 1).size() > 0))", "nests 3 comprehensions"),
        ("predicate.x == ", "is not a CEL expression"),
        (" + ".join(["1"] * 700) + " > 0", "syntax-tree nodes"),
        ("(" * 150 + "1" + ")" * 150 + " > 0", "nests"),
    ],
)
def test_a_malformed_or_unbounded_condition_is_a_policy_error_at_load(
    key_dir: Path, condition: str, reason: str
) -> None:
    entry = policy_entry(
        name="prov",
        keys=[str(key_dir / "ecdsa-p256.pub.pem")],
        attestations={"conditions": [{"name": "c", "predicateType": "x", "condition": condition}]},
    )
    with pytest.raises(PolicyError) as e:
        first_policy(policy_doc(entry), key_dir)
    assert "attestations.conditions[0].condition" in str(e.value)
    assert reason in str(e.value)


def test_a_condition_whose_value_grows_exponentially_is_stopped_by_the_budget() -> None:
    """Within the syntax limits, the work grows with the data: len(xs)**2 elements, each a doubling string."""
    condition = compile_condition(
        "predicate.xs.map(a, predicate.xs.map(b, a + a + a + a + a + a + a + a)).size() > 0", where="t"
    )
    xs = ["ab" * 64] * 3000
    started = time.monotonic()
    with pytest.raises(ConditionError, match=r"stopped after"):
        condition.evaluate({"predicate": {"xs": xs}})
    assert time.monotonic() - started < 5 * ConditionLimits().max_seconds + 1


def test_a_step_budget_stops_before_the_clock() -> None:
    condition = compile_condition(
        "predicate.xs.all(a, a >= 0)", where="t", limits=ConditionLimits(max_steps=500, max_seconds=60)
    )
    with pytest.raises(ConditionError, match="stopped after 500 evaluation steps"):
        condition.evaluate({"predicate": {"xs": list(range(10_000))}})
    assert condition.evaluate({"predicate": {"xs": list(range(10))}}) is True


def test_the_compiled_condition_is_cached() -> None:
    source = "predicate.runDetails.builder.id.startsWith('https://github.com/')"
    assert compile_condition(source, where="a") is compile_condition(source, where="b")


def test_a_non_boolean_condition_is_an_error() -> None:
    with pytest.raises(ConditionError, match="not a boolean"):
        compile_condition("predicate.n + 1", where="t").evaluate({"predicate": {"n": 1}})


def test_a_value_is_remembered_only_for_the_same_signed_bytes() -> None:
    """One statement's value never answers for another: the memo is keyed by the payload's SHA-256."""
    import json

    from modelsec.policy.cel import ConditionInput

    condition = compile_condition("predicate.runDetails.builder.id == 'https://b.example'", where="t")
    good = provenance_statement("e" * 64, builder="https://b.example").to_json_object()
    evil = provenance_statement("e" * 64, builder="https://evil.example").to_json_object()
    good_bytes, evil_bytes = json.dumps(good).encode(), json.dumps(evil).encode()
    assert condition.evaluate(ConditionInput(good, good_bytes)) is True
    assert condition.evaluate(ConditionInput(evil, evil_bytes)) is False
    again = ConditionInput(good, good_bytes)
    assert condition.evaluate(again) is True
    assert again._activation is None  # remembered: not converted again
    # A failure is never remembered: the same bytes fail again, with the error.
    broken = compile_condition("predicate.nothing == 1", where="t")
    for _ in range(2):
        with pytest.raises(ConditionError):
            broken.evaluate(ConditionInput(good, good_bytes))
