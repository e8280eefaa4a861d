"""when_imported: callbacks after a module's first import, with throwaway modules on a temporary sys.path."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from modelsec.verifier.guard.postimport import _Finder, when_imported


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh package `<name>` with `__init__.py`, `sub.py` and `boom.py`, importable from tmp_path."""
    name = f"throwaway_{uuid.uuid4().hex}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("import time\nSTEPS = ['init']\ntime.sleep(0.01)\nDONE = True\n")
    (root / "sub.py").write_text(f"from {name} import STEPS\nSTEPS.append('sub')\nDONE = True\n")
    (root / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_callback_runs_after_the_package_code_and_before_import_returns(pkg: str) -> None:
    seen: list[tuple[str, bool]] = []
    when_imported(pkg, lambda m: seen.append((m.__name__, m.DONE)))
    assert seen == [] and pkg not in sys.modules
    module = importlib.import_module(pkg)
    assert seen == [(pkg, True)]
    importlib.import_module(pkg)
    assert seen == [(pkg, True)], "a callback runs once"
    # The module keeps its real loader: only the import was wrapped.
    assert isinstance(module.__loader__, importlib.machinery.SourceFileLoader)
    assert isinstance(module.__spec__.loader, importlib.machinery.SourceFileLoader)


def test_submodule_callback_waits_for_the_submodule(pkg: str) -> None:
    seen: list[list[str]] = []
    when_imported(f"{pkg}.sub", lambda m: seen.append(list(m.STEPS)))
    importlib.import_module(pkg)
    assert seen == [], "importing the parent package does not run the submodule's callbacks"
    importlib.import_module(f"{pkg}.sub")
    assert seen == [["init", "sub"]]


def test_already_imported_runs_now_and_several_callbacks_keep_their_order(pkg: str) -> None:
    order: list[int] = []
    when_imported(pkg, lambda m: order.append(1))
    when_imported(pkg, lambda m: order.append(2))
    importlib.import_module(pkg)
    assert order == [1, 2]
    when_imported(pkg, lambda m: order.append(3))
    assert order == [1, 2, 3]


def test_callback_can_patch_before_the_importer_sees_the_module(pkg: str) -> None:
    def patch(module: ModuleType) -> None:
        module.DONE = "patched"

    when_imported(f"{pkg}.sub", patch)
    from importlib import import_module

    assert import_module(f"{pkg}.sub").DONE == "patched"


def test_failing_callback_fails_the_import_every_time(pkg: str) -> None:
    calls: list[int] = []

    def refuse(module: ModuleType) -> None:
        calls.append(1)
        raise PermissionError("guard refused")

    when_imported(f"{pkg}.sub", refuse)
    for _ in range(2):
        with pytest.raises(PermissionError, match="guard refused"):
            importlib.import_module(f"{pkg}.sub")
        assert f"{pkg}.sub" not in sys.modules, "no unpatched module is left behind"
    assert calls == [1, 1]


def test_failing_module_keeps_its_callbacks(pkg: str) -> None:
    seen: list[str] = []
    when_imported(f"{pkg}.boom", lambda m: seen.append(m.__name__))
    with pytest.raises(RuntimeError, match="boom at import"):
        importlib.import_module(f"{pkg}.boom")
    assert seen == []


def test_other_modules_are_not_touched(pkg: str) -> None:
    when_imported(f"{pkg}.sub", lambda m: None)
    finder = next(f for f in sys.meta_path if isinstance(f, _Finder))
    assert finder.find_spec(pkg, None) is None
    assert finder.find_spec("json", None) is None
    spec = finder.find_spec(f"{pkg}.sub", importlib.import_module(pkg).__path__)
    assert spec is not None and spec.origin is not None and spec.origin.endswith("sub.py")
    assert sum(isinstance(f, _Finder) for f in sys.meta_path) == 1, "one finder, however many names"


def test_callback_registered_while_the_module_executes_runs_after_it(tmp_path: Path, pkg: str) -> None:
    name = f"{pkg}_self"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from modelsec.verifier.guard.postimport import when_imported
            SEEN = []
            when_imported(__name__, lambda m: SEEN.append(m.LAST))
            LAST = 'end of module'
            """
        )
    )
    when_imported(name, lambda m: None)  # the module is imported through the finder
    try:
        assert importlib.import_module(name).SEEN == ["end of module"]
    finally:
        sys.modules.pop(name, None)


def test_concurrent_imports_and_registrations_run_each_callback_once(pkg: str) -> None:
    runs: list[str] = []
    lock = threading.Lock()

    def record(tag: str) -> None:
        def callback(module: ModuleType) -> None:
            assert module.DONE is True
            with lock:
                runs.append(tag)

        when_imported(pkg, callback)

    record("first")
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            if i % 2:
                record(f"late{i}")
            else:
                importlib.import_module(pkg)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sorted(runs) == sorted(["first", "late1", "late3", "late5", "late7"])
