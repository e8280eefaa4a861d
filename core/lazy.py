"""Lazy package exports and the optional extras: what to install when an optional import is missing."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, Final

__all__ = ["lazy_exports", "missing_extra"]

# Top-level modules that each extra of pyproject.toml installs (base dependencies are not listed).
_EXTRA_MODULES: Final[dict[str, frozenset[str]]] = {
    "torch": frozenset({"torch", "numpy"}),
    "grpc": frozenset({"grpc", "grpc_health", "grpc_reflection", "google", "prometheus_client"}),
    "webhook": frozenset({"uvicorn", "starlette", "prometheus_client"}),
    "watermark": frozenset({"torch", "numpy", "scipy"}),
    "pkcs11": frozenset({"pkcs11"}),
    "postgres": frozenset({"psycopg"}),
}
# The extra that gives a command everything it needs, where one does.
_COMMAND_EXTRA: Final[dict[str, str]] = {
    "gate": "torch",
    "release": "watermark",
    "serve": "grpc",
    "watermark": "watermark",
    "webhook": "webhook",
}


def missing_extra(module: str | None, command: str | None = None) -> str | None:
    """The extra (`pip install 'modelsec[EXTRA]'`) that installs `module`, or None if none does.

    Args:
        module: `ModuleNotFoundError.name`, e.g. `grpc` or `google.protobuf`.
        command: The `modelsec` command that needed it; its own extra is preferred when it covers `module`
            (numpy for `watermark` is the `watermark` extra, for `gate` the `torch` extra).

    Returns:
        The extra's name, or None when `module` belongs to no extra (a broken installation, not an option).
    """
    top = (module or "").partition(".")[0]
    own = _COMMAND_EXTRA.get(command or "")
    if own is not None and top in _EXTRA_MODULES[own]:
        return own
    return next((extra for extra, modules in _EXTRA_MODULES.items() if top in modules), None)


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
