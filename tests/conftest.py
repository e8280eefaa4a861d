"""Shared fixtures: tiny sharded models written with the real safetensors library, throwaway keys, markers."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import SignatureAlgorithm
from modelsec.signer import generate_private_key_pem

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("MODELSEC_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus" / "cases"

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.support.fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.fixture(autouse=True)
def _sigint_as_it_was() -> object:
    """A test (or a library it runs in-process) that leaves SIGINT ignored must not pass that on: an ignored
    signal is inherited by every child process, which then ignores Ctrl-C (the Ctrl-C tests saw exit 0)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread and before is not None and signal.getsignal(signal.SIGINT) != before:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True)
def _no_guard_left_installed() -> object:
    """A test that installs the runtime guard and fails before its own cleanup must not patch later tests."""
    yield
    hook = sys.modules.get("modelsec.verifier.guard.hook")
    if hook is not None and getattr(hook, "_active", False):
        hook.uninstall()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch

        torch.set_num_threads(1)
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


def write_tiny_model(root: Path, *, shards: int = 2, seed: int = 0) -> Path:
    """A standard Hugging Face sharded layout: shards + index + config + tokenizer files."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {
            f"layers.{i}.weight": rng.standard_normal((8, 16)).astype(np.float32),
            f"layers.{i}.bias": rng.standard_normal((8,)).astype(np.float16),
            f"layers.{i}.ids": np.arange(5, dtype=np.int64),
        }
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.nbytes
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (root / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 16}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "WordLevel"}}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    return root


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-model")


@pytest.fixture(scope="session")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Throwaway key pairs: <alg>.key.pem / <alg>.pub.pem for every algorithm, plus an untrusted P-256."""
    d = tmp_path_factory.mktemp("keys")
    for alg in SignatureAlgorithm:
        private, public = generate_private_key_pem(alg)
        (d / f"{alg.value}.key.pem").write_bytes(private)
        (d / f"{alg.value}.pub.pem").write_bytes(public)
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (d / "other.key.pem").write_bytes(private)
    (d / "other.pub.pem").write_bytes(public)
    return d


def run_cli(
    *args: str | Path,
    env: Mapping[str, str | None] | None = None,
    input: str | bytes | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `modelsec ARGS` in this process, as the console script would run it, and return what it did.

    The result has the shape of `subprocess.run(..., capture_output=True, text=True)`. What a fresh process
    would give the command is given for the call and taken back after it: `env` over `os.environ` (None
    unsets), `input` on stdin (empty otherwise), `cwd`, stdout and stderr that are no terminal, Python's
    default warnings filters printing on stderr, and the logging configuration. Exit codes are the real
    ones (click's standalone mode and the commands' `sys.exit`); an uncaught exception is raised here, so
    the test fails on the traceback a real run would print.
    """
    from click.testing import CliRunner

    from modelsec.cli.main import main

    argv = [str(a) for a in args]
    hook = sys.modules.get("modelsec.verifier.guard.hook")
    if hook is not None and getattr(hook, "_active", False):
        raise RuntimeError("the runtime guard is installed here; a `modelsec` process starts without it")
    overrides = dict(env or {})
    if any(os.environ.get(k) != v for k, v in overrides.items() if k in _PROCESS_ONLY_ENV):
        names = sorted(k for k in overrides if k in _PROCESS_ONLY_ENV)
        raise RuntimeError(f"{names} are read once per process: use run_cli_process")
    previous_dir = os.getcwd()
    logging_state = _logging_state()
    saved_argv = sys.argv
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["modelsec", *argv]
        with warnings.catch_warnings(), _openat2_from(overrides), _sys_path_from(overrides):
            warnings.resetwarnings()  # as a fresh interpreter has them (no -W, no pytest filters)
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.filterwarnings("ignore", category=category, append=True)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]  # to sys.stderr
            result = CliRunner().invoke(
                main, argv, input=input, env=overrides, catch_exceptions=False, prog_name="modelsec"
            )
    finally:
        sys.argv = saved_argv
        os.chdir(previous_dir)
        _restore_logging(logging_state)
        if hook is None:
            hook = sys.modules.get("modelsec.verifier.guard.hook")
        if hook is not None and getattr(hook, "_active", False):
            hook.uninstall()  # the process that installed it has ended
    return subprocess.CompletedProcess(["modelsec", *argv], result.exit_code, result.stdout, result.stderr)


# Environment read once per process (SoftHSM2 its configuration on C_Initialize, the guard's .pth its policy
# at start-up): a different value needs a process of its own.
_PROCESS_ONLY_ENV = frozenset({"SOFTHSM2_CONF", "MODELSEC_POLICY"})


@contextlib.contextmanager
def _openat2_from(overrides: Mapping[str, str | None]) -> Iterator[None]:
    """`MODELSEC_NO_OPENAT2` is read when `_openat2` is imported: apply an override for the call."""
    if "MODELSEC_NO_OPENAT2" not in overrides:
        yield
        return
    from modelsec.modelformat import _openat2

    saved = _openat2.FORCE_FALLBACK
    _openat2.FORCE_FALLBACK = overrides["MODELSEC_NO_OPENAT2"] == "1"
    try:
        yield
    finally:
        _openat2.FORCE_FALLBACK = saved


@contextlib.contextmanager
def _sys_path_from(overrides: Mapping[str, str | None]) -> Iterator[None]:
    """`PYTHONPATH` makes a process's `sys.path` at start-up: put its entries first for the call."""
    entries = [e for e in (overrides.get("PYTHONPATH") or "").split(os.pathsep) if e]
    saved = list(sys.path)
    sys.path[:0] = entries
    try:
        yield
    finally:
        sys.path[:] = saved
        if entries:
            importlib.invalidate_caches()


_LoggerState = tuple[logging.Logger, int, list[logging.Handler], bool, bool]


def _logging_state() -> tuple[int, list[_LoggerState]]:
    saved = [(x, x.level, list(x.handlers), x.propagate, x.disabled) for x in (logging.root, *_loggers())]
    return logging.root.manager.disable, saved


def _loggers() -> list[logging.Logger]:
    return [x for x in list(logging.root.manager.loggerDict.values()) if isinstance(x, logging.Logger)]


def _restore_logging(state: tuple[int, list[_LoggerState]]) -> None:
    """Take back what a command configured (`basicConfig`, the audit NullHandler, levels)."""
    disable, saved = state
    logging.root.manager.disable = disable
    known = set()
    for logger, level, handlers, propagate, disabled in saved:
        known.add(id(logger))
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate, logger.disabled = propagate, disabled
    for logger in _loggers():
        if id(logger) not in known:
            logger.setLevel(logging.NOTSET)
            logger.handlers.clear()
            logger.propagate, logger.disabled = True, False


def run_cli_process(
    *args: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run the installed `modelsec` console script in a process of its own, for what only a process shows:
    start-up hooks, the guard's `.pth`, signals, the console script's exit status, missing extras, and
    libraries that read their configuration once per process (SoftHSM2)."""
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"
    return subprocess.run(
        [exe, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`modelsec` in-process (`run_cli`)."""
    return run_cli
