"""Lazy package exports: names resolve to their submodule on first access (keeps torch out of import time)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: MutableMapping[str, Any], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`: `homes` maps each exported name to its submodule.

    The first access imports the submodule and caches the value in `namespace` (the package's globals).
    """

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
