"""CEL conditions over in-toto statements: compiled once at policy load, evaluated with a bound.

The implementation is `cel-python` (PyPI `cel-python`, import `celpy`; CEL spec
https://github.com/google/cel-spec). Chosen over `common-expression-language`
(CEL in Rust) by the feature list in `tests/unit/policy/test_cel_conditions.py`, which both pass, and by the
bound: the Rust library exposes no syntax
tree and no cancel or cost hook, so a runaway evaluation could be stopped only by killing a worker process,
while cel-python's parse tree can be measured at load and its tree-walking evaluator checks a step and time
budget at every node (`_BoundedEvaluator`). Its `matches()` uses RE2 (linear time). Measured here (2 cores):
Rust 0.4 ms, cel-python 2 ms per evaluation of a two-clause SLSA condition, compile 0.9 ms (cached).

The bound, in two parts:

* at load (`compile_condition`): source size, syntax-tree node count, depth and comprehension (macro)
  nesting are limited (`ConditionLimits`); a malformed or over-limit expression is a `PolicyError` naming the
  policy field;
* at evaluation (`CompiledCondition.evaluate`): every visited node costs one step; more than
  `max_steps` steps or more than `max_seconds` is a `ConditionError` with the reason (never a hang).
  Values are only built by visited nodes, so the step budget also bounds their size.

Variables bound in a condition: `statement` (the whole in-toto statement), `predicate`, `predicateType` and
`subject` (its fields). A missing field is an error (`ConditionError`), never `false`; test with `has()`.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelsec.errors import AttestationError, PolicyError

__all__ = ["CompiledCondition", "ConditionError", "ConditionInput", "ConditionLimits", "compile_condition"]

_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})


class ConditionError(AttestationError):
    """A condition could not be evaluated to `true` or `false` over a statement.

    A field is missing or of another type, or the step or time budget ran out.
    """


@dataclass(frozen=True, slots=True)
class ConditionLimits:
    """Bounds on a CEL condition.

    Attributes:
        max_source_chars: Longest accepted expression text.
        max_nodes: Most syntax-tree nodes (cel-python's parse tree).
        max_depth: Deepest syntax tree.
        max_comprehension_nesting: Most macros (`all`, `exists`, `exists_one`, `map`, `filter`) nested in one
            another (each nesting level multiplies the work by the length of a list).
        max_steps: Most evaluator node visits per evaluation.
        max_seconds: Longest evaluation (wall clock).
    """

    max_source_chars: int = 4096
    max_nodes: int = 2000
    max_depth: int = 200
    max_comprehension_nesting: int = 2
    max_steps: int = 100_000
    max_seconds: float = 0.25


def _celpy() -> Any:
    import celpy

    return celpy


def _measure(tree: Any) -> tuple[int, int, int]:
    """Node count, depth and macro nesting of a lark parse tree, iteratively (no recursion limit)."""
    nodes = depth = nesting = 0
    stack: list[tuple[Any, int, int]] = [(tree, 1, 0)]
    while stack:
        node, d, n = stack.pop()
        nodes += 1
        depth = max(depth, d)
        children = getattr(node, "children", None)
        if children is None:
            continue
        inner = n
        if node.data == "member_dot_arg" and len(children) >= 2 and str(children[1]) in _MACROS:
            # The macro's body (not its receiver) runs once per element: that is what nests.
            inner = n + 1
            nesting = max(nesting, inner)
        stack.extend((c, d + 1, n if i == 0 else inner) for i, c in enumerate(children))
    return nodes, depth, nesting


class _Budget:
    def __init__(self, limits: ConditionLimits) -> None:
        self.steps = limits.max_steps
        self.deadline = time.monotonic() + limits.max_seconds
        self.limits = limits

    def spend(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise ConditionError(f"stopped after {self.limits.max_steps} evaluation steps (max_steps)")
        if not self.steps % 256 and time.monotonic() > self.deadline:
            raise ConditionError(f"stopped after {self.limits.max_seconds} s (max_seconds)")


def _make_evaluator_class() -> Any:
    from celpy.evaluation import Evaluator

    class _BoundedEvaluator(Evaluator):
        """cel-python's evaluator, spending one step of a shared budget per visited node."""

        budget: _Budget

        def visit(self, tree: Any) -> Any:
            self.budget.spend()
            return super().visit(tree)

        def sub_evaluator(self, ast: Any) -> Any:
            nested = _BoundedEvaluator(ast, activation=self.activation)
            nested.budget = self.budget
            return nested

        def set_activation(self, values: Any) -> Any:
            # A macro binds its variable once per element. cel-python clones the whole activation (every
            # variable and the function table) each time; a child activation that resolves the macro's
            # variable first and everything else in its parent is the same name resolution, without the copy.
            self.activation = self.base_activation.nested_activation(vars=values)
            return self

    return _BoundedEvaluator


class ConditionInput:
    """One statement, converted to CEL values once (on first use) for every condition evaluated over it.

    Args:
        statement: The statement as parsed JSON (`Statement.to_json_object()`).
        payload: The exact bytes it was parsed from (the DSSE payload the signature covers), or None. With
            them, a condition's value over these bytes is remembered (`_RESULTS`): a condition is a pure
            function of the expression and the statement, so the same signed statement seen again (the
            webhook decides the same models over and over) is not evaluated again.
    """

    __slots__ = ("_activation", "digest", "statement")

    def __init__(self, statement: Mapping[str, Any], payload: bytes | None = None) -> None:
        self.statement = statement
        self.digest = hashlib.sha256(payload).digest() if payload is not None else None
        self._activation: Any = None

    @property
    def activation(self) -> Any:
        """cel-python's activation binding `statement`, `predicate`, `predicateType` and `subject`."""
        if self._activation is None:
            from celpy.evaluation import Activation

            celpy = _celpy()
            converted = celpy.json_to_cel(dict(self.statement))
            context = {
                "statement": converted,
                "predicate": converted.get("predicate", celpy.celtypes.MapType({})),
                "predicateType": converted.get("predicateType", celpy.celtypes.StringType("")),
                "subject": converted.get("subject", celpy.celtypes.ListType([])),
            }
            self._activation = Activation(annotations=_environment().annotations, vars=context)
        return self._activation


class _Results:
    """Values of conditions over statement payloads (sha256), most recently used kept; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[tuple[bytes, str, ConditionLimits], bool] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[bytes, str, ConditionLimits]) -> bool | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: tuple[bytes, str, ConditionLimits], value: bool) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)


# Only values are remembered, never a failure: a stopped evaluation (time budget) may pass another time.
_RESULTS = _Results(4096)


@dataclass(frozen=True, slots=True)
class CompiledCondition:
    """A CEL expression that passed the load-time limits, ready to evaluate.

    Attributes:
        source: The expression text.
        limits: Its bounds.
    """

    source: str
    limits: ConditionLimits
    _tree: Any

    def evaluate(self, statement: Mapping[str, Any] | ConditionInput) -> bool:
        """Evaluate over one in-toto statement (a JSON object), within `limits`.

        Args:
            statement: The statement as parsed JSON (`Statement.to_json_object()`), or converted once
                (`ConditionInput`) when several conditions are evaluated over it.

        Returns:
            The condition's boolean value.

        Raises:
            ConditionError: A field is missing or of another type than the expression expects, the value is
                not a boolean, or the step or time budget ran out.
        """
        celpy = _celpy()
        from celpy.evaluation import CELEvalError

        prepared = statement if isinstance(statement, ConditionInput) else ConditionInput(statement)
        key = (prepared.digest, self.source, self.limits) if prepared.digest is not None else None
        if key is not None:
            known = _RESULTS.get(key)
            if known is not None:
                return known
        evaluator = _evaluator_class()(self._tree, activation=prepared.activation)
        evaluator.budget = _Budget(self.limits)
        try:
            value = evaluator.evaluate()
        except ConditionError:
            raise
        except (
            CELEvalError,
            RecursionError,
            MemoryError,
            ValueError,
            TypeError,
            KeyError,
            ArithmeticError,
        ) as e:
            raise ConditionError(f"cannot be evaluated: {_describe(e)}") from e
        if not isinstance(value, celpy.celtypes.BoolType):
            raise ConditionError(f"is {type(value).__name__}, not a boolean")
        if key is not None:
            _RESULTS.put(key, bool(value))
        return bool(value)


def _describe(e: BaseException) -> str:
    if e.args and isinstance(e.args[0], str):
        return e.args[0]
    return type(e).__name__


@functools.cache
def _evaluator_class() -> Any:
    return _make_evaluator_class()


@functools.cache
def _environment() -> Any:
    # celpy.Environment() sets the interpreter's recursion limit to 2500 for the whole process; a policy load
    # must not change what every other parser of the process (strict_json's depth refusal) relies on. An
    # expression too deep to parse or evaluate within the process's limit is refused (RecursionError).
    limit = sys.getrecursionlimit()
    try:
        return _celpy().Environment()
    finally:
        sys.setrecursionlimit(limit)


@functools.lru_cache(maxsize=1024)
def _compile(source: str, limits: ConditionLimits) -> CompiledCondition:
    from celpy.celparser import CELParseError

    try:
        tree = _environment().compile(source)
    except (CELParseError, RecursionError) as e:
        raise PolicyError(
            f"is not a CEL expression: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from e
    nodes, depth, nesting = _measure(tree)
    if nodes > limits.max_nodes:
        raise PolicyError(f"has {nodes} syntax-tree nodes, more than {limits.max_nodes}")
    if depth > limits.max_depth:
        raise PolicyError(f"nests {depth} deep, more than {limits.max_depth}")
    if nesting > limits.max_comprehension_nesting:
        raise PolicyError(
            f"nests {nesting} comprehensions (all/exists/exists_one/map/filter), "
            f"more than {limits.max_comprehension_nesting}"
        )
    return CompiledCondition(source, limits, tree)


def compile_condition(source: str, *, where: str, limits: ConditionLimits | None = None) -> CompiledCondition:
    """Parse and bound-check a CEL condition; compiled conditions are cached by source and limits.

    Args:
        source: The expression text.
        where: The policy and field it comes from, for errors (e.g. `policy 'p': attestations.conditions[0]`).
        limits: Its bounds (default `ConditionLimits()`).

    Returns:
        The compiled condition.

    Raises:
        PolicyError: `{where}.condition: ...`: the expression is too long, malformed, or over a syntax-tree
            limit.
    """
    limits = limits or ConditionLimits()
    if len(source) > limits.max_source_chars:
        raise PolicyError(
            f"{where}.condition: is {len(source)} characters, more than {limits.max_source_chars}"
        )
    try:
        return _compile(source, limits)
    except PolicyError as e:
        raise PolicyError(f"{where}.condition: {e.diagnostics()}") from None
