"""Post-import hooks: run a callback right after a module's code has executed on its first import.

The runtime guard patches a framework (safetensors, transformers, sentence-transformers) only once the
process imports it, so that a plain interpreter start never imports it. `when_imported(name, callback)`
runs `callback(module)` at once if `name` is already imported, otherwise right after the module's code has
executed, before the importer gets the module back: no code of the importer sees it unpatched.

Mechanism (the shape of PEP 369 and `wrapt.importer`): a finder placed first on `sys.meta_path` answers
only for names with pending callbacks. It asks the other finders for the real spec and wraps the spec's
loader; the wrapper puts the real loader back on the module (`__loader__`, `__spec__.loader`), runs the
real `exec_module`, then the callbacks. Any other name is answered `None` and imported as before.

Fail closed: a callback's exception propagates to the importer, the import fails (Python removes the
module from `sys.modules`), and the callbacks stay registered, so a retried import runs them again.

Not covered: a module imported again after being deleted from `sys.modules` once its callbacks have run
(callbacks run on the first successful import only), `importlib.reload`, a finder inserted before this one
on `sys.meta_path` that answers for a watched name itself, and a callback registered from inside a circular
import of its module begun before the registration (it runs at once, on the partly executed module).
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]

Callback = Callable[[ModuleType], object]

# One re-entrant lock for the registry; callbacks themselves run outside it (a callback may import).
_lock = threading.RLock()
_pending: dict[str, list[Callback]] = {}
# Names whose code is executing through a wrapped loader: a callback registered now runs after it.
_executing: set[str] = set()
_finding = threading.local()


def when_imported(name: str, callback: Callback) -> None:
    """Run `callback(module)` once module `name` is imported: now if it is, else right after its import.

    Callbacks for one name run in registration order, in the importing thread, after the module's code
    (for a package, its `__init__`) has executed and before the import statement returns. Works for
    submodules (`transformers.modeling_utils`) and packages alike; other modules are not affected.

    Args:
        name: The module's full dotted name.
        callback: Called with the module object; it may patch the module.

    Raises:
        Exception: Whatever `callback` raises when the module is already imported; otherwise the
            exception is raised to the code that imports the module, and the import fails.
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None or name in _executing:
            _pending.setdefault(name, []).append(callback)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    spec = getattr(module, "__spec__", None)
    if getattr(spec, "_initializing", False):
        # Another thread (or an import begun before this finder existed) is executing the module:
        # import_module waits on the module's import lock until that import has finished.
        module = importlib.import_module(name)
    callback(module)


def _run_pending(name: str, module: ModuleType) -> None:
    done = 0
    try:
        while True:
            with _lock:
                callbacks = _pending.get(name, [])
                if done >= len(callbacks):
                    _pending.pop(name, None)
                    return
                callback = callbacks[done]
            callback(module)
            done += 1
    finally:
        with _lock:
            _executing.discard(name)


class _Loader(Loader):
    """Delegates to the real loader and runs the pending callbacks after `exec_module`."""

    def __init__(self, real: Loader, name: str) -> None:
        self._real = real
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps the real loader (inspect, importlib.resources, isinstance checks, reload).
        if getattr(module, "__loader__", None) in (None, self):
            module.__loader__ = self._real
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._real
        with _lock:
            _executing.add(self._name)
        try:
            self._real.exec_module(module)
        except BaseException:
            with _lock:
                _executing.discard(self._name)
            raise
        _run_pending(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        if attr in ("_real", "_name"):  # not yet set (copy, pickle): no recursion
            raise AttributeError(attr)
        return getattr(self._real, attr)


class _Finder(MetaPathFinder):
    """Answers only for names with pending callbacks, with the real spec and a wrapped loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _pending:
            return None
        busy: set[str] = _finding.__dict__.setdefault("names", set())
        if fullname in busy:  # another finder asked the import system about this name again
            return None
        busy.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        if spec.loader is not None and not isinstance(spec.loader, _Loader):
            spec.loader = _Loader(spec.loader, fullname)
        return spec
