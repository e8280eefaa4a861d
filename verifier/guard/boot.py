"""Start-up entry points of the runtime guard: the `.pth` hook and the vLLM plugin.

Every Python process started with `$MODELSEC_POLICY` in its environment installs the guard before any user
code runs, however it was started (a shell, `subprocess`, `multiprocessing` spawn/forkserver, torchrun or
vLLM workers), because the package installs `modelsec-guard.pth` into site-packages (regular and editable
installs; see setup.py). Its one line imports nothing when the variable is unset or empty; when it is set,
it imports this module and calls `boot()`.

Fail closed: a `.pth` line that raises only makes `site` print a warning and go on, so `boot()` (and the
`.pth` line itself, for when modelsec cannot be imported) prints `modelsec: error: runtime guard not
installed: <reason>` to stderr and ends the process with exit status 1 instead.

Not covered: interpreters started with `-S` (no `site`, so no `.pth` processing) and code on `PYTHONPATH`
that runs before site-packages is processed. vLLM loads `vllm_plugin` (entry point group
`vllm.general_plugins`) in each of its processes, which also covers installs whose `.pth` files are not
processed (e.g. `pip install --target` directories on `PYTHONPATH`).
"""

from __future__ import annotations

import os
import sys

from modelsec.errors import BackendUnavailableError, Error
from modelsec.policy import POLICY_ENV

__all__ = ["EXIT_STATUS", "boot", "vllm_plugin"]

EXIT_STATUS = 1
_PREFIX = "modelsec: error: runtime guard not installed: "


def boot() -> None:
    """Install the runtime guard at interpreter start-up, or end the process (called by the `.pth` line).

    Does nothing when `$MODELSEC_POLICY` is unset or empty. Otherwise calls
    `modelsec.verifier.guard.hook.install()`, which loads and validates the policy file now; the models
    themselves are verified when a framework loads them.

    Never raises: on any failure (bad policy file, unreadable key, missing dependency, any exception) it
    prints one line `modelsec: error: runtime guard not installed: <reason>` to stderr and exits the
    process with status `EXIT_STATUS` (`os._exit`: no user code, atexit handler or finalizer runs).
    """
    if not os.environ.get(POLICY_ENV):
        return
    try:
        from modelsec.verifier.audit import enable_stderr_audit
        from modelsec.verifier.guard import hook

        hook.install()
        enable_stderr_audit()
    except BaseException as e:  # noqa: BLE001 - fail closed: any failure ends the process
        reason = e.diagnostics() if isinstance(e, Error) else f"{type(e).__name__}: {e}"
        try:
            sys.stderr.write(f"{_PREFIX}{reason}\n")
            sys.stderr.flush()
        finally:
            os._exit(EXIT_STATUS)


def vllm_plugin() -> None:
    """Guard this vLLM process: the vLLM general plugin (entry point `vllm.general_plugins: modelsec_guard`).

    vLLM calls every general plugin in each process it starts (engine, workers) before loading a model.
    Like the `.pth` hook, it does nothing when `$MODELSEC_POLICY` is unset or empty, and nothing when
    the guard is already installed in this process; otherwise it installs the guard.

    Raises:
        PolicyError: The policy file named by `$MODELSEC_POLICY` is missing or invalid.
        KeyMaterialError: A key the policy lists cannot be read or parsed.
        BackendUnavailableError: A module the guard needs cannot be imported.
    """
    if not os.environ.get(POLICY_ENV):
        return
    try:
        from modelsec.verifier.guard import hook

        if not hook.installed():
            hook.install()
        from modelsec.verifier.audit import enable_stderr_audit

        enable_stderr_audit()
    except Error as e:
        e.add_context("runtime guard not installed")
        raise
    except ImportError as e:
        raise BackendUnavailableError(f"runtime guard not installed: {type(e).__name__}: {e}") from e
