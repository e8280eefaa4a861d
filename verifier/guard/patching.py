"""The runtime guard's patching core: what every framework module (`guard.frameworks`) shares.

* **The redirect**: `guarded_path` maps a model reference to the verified snapshot's private tree
  (`modelsec.verifier.guard.snapshot`), verifying the model whole the first time; `snapshot_for` gives the
  snapshot itself. Both apply the policy and digest pins that `hook.install()` set with `configure()`.
* **The record of patches**: `patch` replaces an attribute and remembers the original once;
  `patch_functions` also replaces every module-level copy of a patched function (`from x import f` bound it at
  import), and `restore_all` puts every original back, copies included. `unpatched` gives a framework the
  original of what it wraps, so that installing twice never wraps a wrapper.
* **A wrapper for `from_pretrained`-style entry points**: `redirecting` sends the model reference through
  `guarded_path` and checks the file and folder names joined onto it.

The guard's modules never hold a framework's functions at module level, so the sweep for copies skips them
(a framework module defines its replacements there: rebinding them would undo the guard).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from modelsec.errors import Error, PolicyViolationError
from modelsec.policy import Policy, PolicySet
from modelsec.verifier.guard.snapshot import (
    VerifiedSnapshot,
    check_relative_name,
    find_signed_root,
    open_snapshot,
    snapshot_containing,
)
from modelsec.verifier.loader import resolve_policy
from modelsec.verifier.pinning import DigestPin
from modelsec.verifier.verification import precheck_file

__all__ = [
    "Patcher",
    "configure",
    "current_policy",
    "guarded_path",
    "one_sweep",
    "patch",
    "patch_functions",
    "redirecting",
    "restore_all",
    "snapshot_for",
    "unpatched",
]

Patcher = Callable[[ModuleType], None]
"""Patches one framework module once it is imported (registered by module name in `hook`)."""

# The guard's own modules: they define the replacements and never hold a framework's functions.
_GUARD_PREFIX = __name__.rpartition(".")[0] + "."

_originals: dict[tuple[int, str], tuple[object, object]] = {}  # (id(owner), name) -> (owner, original)
_policy: Policy | PolicySet | None = None
_pins: tuple[DigestPin, ...] | None = None
# While `install()` patches the frameworks already imported, their sweeps are collected here, run once.
_pending_rebind: dict[int, tuple[object, object]] | None = None
# id(replacement) -> (replacement, original): a module imported while the guard is active binds the
# replacement itself (`from safetensors import safe_open`), which `_originals` never saw; `restore_all()`
# restores those bindings too.
_replaced: dict[int, tuple[object, object]] = {}


def configure(policy: Policy | PolicySet | None, pins: tuple[DigestPin, ...] | None) -> None:
    """Set the policy and digest pins the redirect applies (None, None: the guard is not installed)."""
    global _policy, _pins
    _policy, _pins = policy, pins


def current_policy() -> Policy | PolicySet | None:
    """The policy set by `configure()`, or None."""
    return _policy


# --- what the guard serves -------------------------------------------------------------------------


def snapshot_for(path: Path) -> tuple[VerifiedSnapshot, str]:
    """The verified snapshot holding `path` (a tree path, or a path in a signed model), and its name there.

    Raises:
        PolicyViolationError: Not a local path (nothing is fetched), or a single file refused for what it is.
        VerificationError: The model does not verify (see `open_snapshot`).
    """
    hit = snapshot_containing(path)
    if hit is not None:
        return hit
    if not os.path.lexists(path):
        raise PolicyViolationError(
            f"{path}: not a local path; the modelsec runtime guard loads signed local model directories only "
            "and never fetches (download the model, sign it, and load it by its path)"
        )
    if path.is_file():
        # A single file is refused for what it is (pickle, malformed header) before bundles are looked for.
        precheck_file(path, resolve_policy(path, _policy))
    root = find_signed_root(path)
    snap = open_snapshot(root, _policy, pins=_pins)
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return snap, "" if rel == "." else rel


def guarded_path(value: Any, *, trust_remote_code: bool = False) -> Any:
    """Map a model reference to the verified snapshot's tree (the guard's redirect, also for adapters).

    Args:
        value: What a framework was given: a local path (str or `os.PathLike`); anything else (None, a
            model object, a dict) is returned unchanged.
        trust_remote_code: The caller asked to run the model's code.

    Returns:
        The same path inside the snapshot's private tree (same type as given for `str` / `Path`).

    Raises:
        PolicyViolationError: Not a local path (nothing is fetched), remote code not allowed, or a path in
            the model directory that its bundles do not sign (an ignored path).
        VerificationError: The model does not verify (see `open_snapshot`).
    """
    if not isinstance(value, str | os.PathLike) or (isinstance(value, str) and not value):
        return value
    snap, rel = snapshot_for(Path(os.fspath(value)))
    if trust_remote_code and not snap.policy.allow_remote_code:
        raise PolicyViolationError(
            f"{value}: trust_remote_code=True is refused by policy {snap.policy.name!r} (allowRemoteCode)"
        )
    snap.refuse_unsigned(rel)
    target = snap.path / rel if rel else snap.path
    return target if isinstance(value, Path) else str(target)


# --- patching ----------------------------------------------------------------------------------------


def patch(owner: object, name: str, replacement: object) -> None:
    """Set `owner.name` to `replacement`, remembering the original the first time (for `restore_all`)."""
    key = (id(owner), name)
    if key not in _originals:
        # For a class, keep the raw descriptor (a classmethod), not the method bound to this class:
        # restoring a bound method would make every subclass call it with the base class.
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        _originals[key] = (owner, original)
    setattr(owner, name, replacement)


def unpatched(owner: object, name: str, current: Any) -> Any:
    """What `owner.name` was before the guard patched it; `current` when the guard has not patched it."""
    hit = _originals.get((id(owner), name))
    return current if hit is None else hit[1]


def _module_copies(replacements: dict[int, tuple[object, object]]) -> list[tuple[object, str, object]]:
    """(module, attribute, new value) for every module-level binding of a key of `replacements`."""
    found: list[tuple[object, str, object]] = []
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith(_GUARD_PREFIX):  # defines the replacements: never rebound
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            hit = replacements.get(id(value))
            if hit is not None and hit[0] is value:
                found.append((module, attr, hit[1]))
    return found


def _rebind(replacements: dict[int, tuple[object, object]]) -> None:
    """Replace every module-level copy of a patched function (`from x import f` bound it at import)."""
    for module, attr, replacement in _module_copies(replacements):
        patch(module, attr, replacement)


def _rebind_copies(restorations: dict[int, tuple[object, object]]) -> None:
    """Put the originals back wherever a module bound a replacement itself (no `_originals` entry)."""
    for module, attr, original in _module_copies(restorations):
        setattr(module, attr, original)


def patch_functions(module: ModuleType, names: dict[str, Callable[..., Any]]) -> None:
    """Replace module-level functions of `module` and every module-level copy of them elsewhere.

    Args:
        module: The framework module that defines the functions.
        names: Attribute name -> replacement; a name `module` lacks is skipped.
    """
    replacements: dict[int, tuple[object, object]] = {}
    for name, replacement in names.items():
        original = getattr(module, name, None)
        if original is None:
            continue
        if (id(module), name) in _originals:
            original = _originals[(id(module), name)][1]
        elif id(original) in _replaced and _replaced[id(original)][0] is original:
            # Imported while the guard was active: it bound the replacement; its original is the one replaced.
            original = _replaced[id(original)][1]
            _originals[(id(module), name)] = (module, original)
        replacements[id(original)] = (original, replacement)
        _replaced.setdefault(id(replacement), (replacement, original))
        patch(module, name, replacement)
    if _pending_rebind is not None:
        _pending_rebind.update(replacements)
    else:
        _rebind(replacements)


@contextlib.contextmanager
def one_sweep() -> Iterator[None]:
    """Collect the copy sweeps of `patch_functions` calls made inside, and run them as one at the end.

    Each sweep walks every attribute of every loaded module: `install()` patches the frameworks already
    imported inside this, so that they cost one sweep. Nothing is swept if the body raises.
    """
    global _pending_rebind
    _pending_rebind = {}
    try:
        yield
        replacements = _pending_rebind
    finally:
        _pending_rebind = None
    _rebind(replacements)


def restore_all() -> None:
    """Restore every patched attribute, and every module-level copy of a replacement, to its original."""
    for (_, name), (owner, original) in reversed(list(_originals.items())):
        setattr(owner, name, original)
    _originals.clear()
    if _replaced:
        _rebind_copies({k: (replacement, original) for k, (replacement, original) in _replaced.items()})
        _replaced.clear()


# --- from_pretrained-style entry points ------------------------------------------------------------------

# Keyword arguments of `from_pretrained` that name a file or folder joined onto the model directory.
_NAME_ARGUMENTS = ("subfolder", "gguf_file", "_configuration_file", "config_file_name")


def redirecting(
    descriptor: Any, *, first: str = "pretrained_model_name_or_path", file_argument: str | None = None
) -> Any:
    """Wrap a `from_pretrained`-like classmethod so that its model reference goes through `guarded_path`.

    `first` is the model reference's parameter name; `file_argument` a file name parameter that follows it
    positionally. Names joined onto the model directory are checked before anything is read. A framework
    error caused by a guard refusal is replaced by that refusal.
    """
    func = descriptor.__func__ if isinstance(descriptor, classmethod) else descriptor

    @functools.wraps(func)
    def wrapper(cls: Any, *args: Any, **kwargs: Any) -> Any:
        trust = bool(kwargs.get("trust_remote_code"))
        model = args[0] if args else kwargs.get(first)
        for name in _NAME_ARGUMENTS:
            check_relative_name(kwargs.get(name), name, model)
        if file_argument is not None and len(args) > 1:
            check_relative_name(args[1], file_argument, model)
        if args:
            args = (guarded_path(args[0], trust_remote_code=trust), *args[1:])
        elif first in kwargs:
            kwargs[first] = guarded_path(kwargs[first], trust_remote_code=trust)
        try:
            return func(cls, *args, **kwargs)
        except Exception as e:
            refusal = _modelsec_cause(e)
            if refusal is None or refusal is e:
                raise
            raise refusal from e

    return classmethod(wrapper) if isinstance(descriptor, classmethod) else wrapper


def _modelsec_cause(error: BaseException) -> Error | None:
    """The guard's refusal behind a framework's own error (transformers rewraps some as a vague OSError)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, Error):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
