"""Resolve `package.module:attribute` import paths (architecture factories, dataset loaders).

The code named this way is the operator's (installed in the environment or on `PYTHONPATH`), never code
shipped inside a model directory: `resolve_import_path` refuses a module that would be imported from below
`forbid_under` (the model directory), checked from the import spec *before* the module runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelsec.errors import PolicyError, PolicyViolationError

__all__ = ["is_import_path", "resolve_import_path"]

_IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_import_path(text: str) -> bool:
    """Whether `text` has the form `package.module:attribute` (identifiers only)."""
    return bool(_IMPORT_PATH.match(text))


def _origins(spec: importlib.machinery.ModuleSpec) -> list[str]:
    places = [spec.origin] if spec.origin else []
    places.extend(spec.submodule_search_locations or [])
    return [p for p in places if p not in ("built-in", "frozen")]


def resolve_import_path(spec: str, *, what: str, forbid_under: Path | None = None) -> Callable[..., Any]:
    """Import `package.module` and return its callable `attribute`.

    Args:
        spec: `package.module:attribute`.
        what: Names the role in errors ("architecture", "dataset loader").
        forbid_under: Refuse modules whose files lie below this directory (the model directory).

    Returns:
        The callable.

    Raises:
        PolicyError: Malformed spec, module not importable, attribute missing or not callable.
        PolicyViolationError: The module would be imported from below `forbid_under`.
    """
    if not is_import_path(spec):
        raise PolicyError(f"{what} {spec!r}: expected an import path of the form package.module:function")
    module_name, attribute = spec.split(":")
    if forbid_under is not None:
        root = forbid_under.resolve()
        parts = module_name.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            try:
                found = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                break
            if found is None:
                break
            for place in _origins(found):
                if Path(place).resolve().is_relative_to(root):
                    raise PolicyViolationError(
                        f"{what} {spec!r}: module {name} would be imported from the model directory {root}; "
                        "code shipped with a model is never run"
                    )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PolicyError(f"{what} {spec!r}: cannot import {module_name}: {e}") from e
    value = getattr(module, attribute, None)
    if value is None or not callable(value):
        raise PolicyError(f"{what} {spec!r}: {module_name} has no callable {attribute!r}")
    return value  # type: ignore[no-any-return]
