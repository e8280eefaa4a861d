"""The runtime guard: every file and tensor a serving stack reads from a model directory is a verified byte.

`install(policy)` arranges, process-wide and lazily (a framework is patched when it is first imported, so a
plain interpreter start imports none of them):

* **Entry points are redirected to a verified snapshot** (`modelsec.verifier.guard.snapshot`): the first time
a
  model directory reaches a guarded entry point it is verified whole, and the framework gets the snapshot's
  private read-only tree in place of the directory, so every non-tensor file it opens — configs, tokenizer
  files, chat templates, the index, generation configs, remote code — holds the verified bytes. Guarded:
  transformers' file resolution (`cached_file` / `cached_files`, the layer under configs, tokenizers and
  generation configs), `from_pretrained` of `AutoConfig`, the `AutoModel*` classes, `AutoTokenizer`,
  `AutoProcessor`, `AutoImageProcessor`, `AutoFeatureExtractor`, `PreTrainedConfig`, `PreTrainedModel`,
  tokenizers, processors, image processors, feature extractors and `GenerationConfig`, `pipeline()`, and
  sentence-transformers models (`SentenceTransformer`, `CrossEncoder`, `SparseEncoder`).
* **Names stay inside the tree**: a `subfolder=`, a file name given to `cached_file` / `cached_files`,
  `GenerationConfig`'s `config_file_name`, `gguf_file` that is absolute or has a `..` segment would be joined
  past the tree (`os.path.join`) onto unverified files: refused before anything is read. A path in the model
  directory that its bundles ignore (`--ignore-paths`, `.git/`) is refused by name, not reported as missing.
* **Tensors come from the verified loader**: `safetensors.safe_open` and `safetensors.torch.load_file` (and
  every copy of them that a loaded module holds) read a shard into private memory, compare its digests with
  the signed manifest and only then build tensors (`modelsec.verifier.loader`). A shard path inside a
  snapshot is served from the signed model behind it; any other shard path first has its model verified
  whole. transformers' byte-loading path (`disable_mmap`), which has no file name to verify, is refused.
* **Remote code**: `trust_remote_code=True` is refused unless the policy allows remote code; even then only a
  local `module.Class` reference whose module is a signed file runs, imported from a private per-process
  module directory filled from the snapshot (never from the shared `HF_MODULES_CACHE`); cross-repo
  references (`org/repo--module.Class`) are refused. Nothing is ever fetched: a reference that is not a
  local path is refused.
* **Pinning**: `expected_digests` (or `$MODELSEC_MODEL_DIGEST`: a bare `sha256:<hex>` or the whole
  `modelsec.dev/models` annotation value `uri@sha256:<hex>[,...]`) must contain the model's root digest.

Every process: with the package's start-up hook, any Python process started with `$MODELSEC_POLICY` set
installs the guard (see `modelsec.verifier.guard.boot`); without it, wrap a command:

    MODELSEC_POLICY=/etc/modelsec/policy.yaml python -m modelsec.verifier.guard.hook serve.py --port 8080
    MODELSEC_POLICY=/etc/modelsec/policy.yaml python -m modelsec.verifier.guard.hook -m my_server.main

Not covered: `safetensors.torch.load(bytes)` (bytes without a path cannot be matched to a signed model) and
files a framework reads from outside the model directory (its own configuration and caches).
"""

from __future__ import annotations

import functools
import importlib
import os
import runpy
import sys
import tempfile
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from modelsec.errors import Error, PolicyViolationError, UnsupportedAlgorithmError
from modelsec.policy import Policy, PolicySet, model_uri
from modelsec.verifier.admission import admit_model, report_warnings
from modelsec.verifier.guard.postimport import when_imported
from modelsec.verifier.guard.snapshot import (
    VerifiedSnapshot,
    check_relative_name,
    find_signed_root,
    open_snapshot,
    snapshot_containing,
)
from modelsec.verifier.loader import VerifiedSafeOpen, resolve_policy
from modelsec.verifier.pinning import DigestPin, digest_pins_from_env, digests_for_model, expected_digest_set
from modelsec.verifier.verification import check_file_set, precheck_file, verify_files, verify_signatures

__all__ = ["guarded_path", "install", "installed", "main", "preflight", "uninstall"]

_lock = threading.RLock()
_originals: dict[tuple[int, str], tuple[object, object]] = {}  # (id(owner), name) -> (owner, original)
_policy: Policy | PolicySet | None = None
_pins: tuple[DigestPin, ...] | None = None
_active = False
_generation = 0
_modules_dir: Path | None = None
# While `install()` patches the frameworks already imported, their sweeps are collected here, run once.
_pending_rebind: dict[int, tuple[object, object]] | None = None
# id(replacement) -> (replacement, original): a module imported while the guard is active binds the
# replacement itself (`from safetensors import safe_open`), which `_originals` never saw; `uninstall()`
# restores those bindings too.
_replaced: dict[int, tuple[object, object]] = {}


# --- what the guard serves -------------------------------------------------------------------------


def _snapshot_for(path: Path) -> tuple[VerifiedSnapshot, str]:
    """The verified snapshot holding `path` (a tree path, or a path in a signed model), and its name there."""
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
    expected = digests_for_model(_pins, model_uri(root)) if _pins is not None else None
    snap = open_snapshot(root, _policy, expected_digests=expected)
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
    snap, rel = _snapshot_for(Path(os.fspath(value)))
    if trust_remote_code and not snap.policy.allow_remote_code:
        raise PolicyViolationError(
            f"{value}: trust_remote_code=True is refused by policy {snap.policy.name!r} (allowRemoteCode)"
        )
    snap.refuse_unsigned(rel)
    target = snap.path / rel if rel else snap.path
    return target if isinstance(value, Path) else str(target)


def _shard(filename: Any) -> tuple[Path, Policy | PolicySet | None, Any]:
    snap, rel = _snapshot_for(Path(os.fspath(filename)))
    return snap.source_path(rel), snap.policy, snap.signed


def _device_name(device: object) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def _verified_load_file(filename: str | os.PathLike[str], device: object = "cpu") -> dict[str, Any]:
    path, policy, signed = _shard(filename)
    with VerifiedSafeOpen(path, policy, device=_device_name(device), signed=signed) as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def _verified_safe_open(
    filename: str | os.PathLike[str], framework: str, device: object = "cpu", **_ignored: object
) -> VerifiedSafeOpen:
    if framework not in ("pt", "torch", "pytorch"):
        raise UnsupportedAlgorithmError(
            f"{filename}: modelsec's verified safe_open serves framework='pt' only, not {framework!r}"
        )
    path, policy, signed = _shard(filename)
    return VerifiedSafeOpen(path, policy, device=_device_name(device), signed=signed)


def _refuse_unverifiable_bytes(*_args: object, **_kwargs: object) -> Any:
    raise PolicyViolationError(
        "loading safetensors from raw bytes (transformers disable_mmap) cannot be verified; "
        "load from a signed local directory instead"
    )


def preflight(model_dir: Path, policy: Policy | PolicySet | None = None) -> None:
    """Check a local model directory before a framework reads it: everything but the shards' bytes.

    Verifies the bundles, the file set, the pickle and remote-code refusals and the digests of every
    non-safetensors file (config, tokenizer, index); shards are verified when they are read through the
    patched `safe_open` / `load_file`. The guard itself verifies whole directories (`open_snapshot`).

    Raises:
        VerificationError: Any of the checks fails (see `modelsec.verifier.verify_model`).
        PolicyError: No usable policy.
    """
    from modelsec.modelformat.hashing import is_safetensors_name

    admission = admit_model(model_dir, policy if policy is not None else _policy)
    resolved = admission.policy
    signed = verify_signatures(model_dir, admission)
    report_warnings(signed.warnings)
    names = check_file_set(signed, resolved)
    side = [n for n in names if not is_safetensors_name(n)]
    verify_files(signed, side, resolved, tensor_hash=None, whole_model=False)


# --- patching ----------------------------------------------------------------------------------------


def _patch(owner: object, name: str, replacement: object) -> None:
    key = (id(owner), name)
    if key not in _originals:
        # For a class, keep the raw descriptor (a classmethod), not the method bound to this class:
        # restoring a bound method would make every subclass call it with the base class.
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        _originals[key] = (owner, original)
    setattr(owner, name, replacement)


def _module_copies(replacements: dict[int, tuple[object, object]]) -> list[tuple[object, str, object]]:
    """(module, attribute, new value) for every module-level binding of a key of `replacements`."""
    found: list[tuple[object, str, object]] = []
    for module in list(sys.modules.values()):
        if module is sys.modules[__name__]:  # defines the replacements: never rebound
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
        _patch(module, attr, replacement)


def _rebind_copies(restorations: dict[int, tuple[object, object]]) -> None:
    """Put the originals back wherever a module bound a replacement itself (no `_originals` entry)."""
    for module, attr, original in _module_copies(restorations):
        setattr(module, attr, original)


def _patch_functions(module: ModuleType, names: dict[str, Callable[..., Any]]) -> None:
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
        _patch(module, name, replacement)
    if _pending_rebind is not None:
        _pending_rebind.update(replacements)
    else:
        _rebind(replacements)


# Keyword arguments of `from_pretrained` that name a file or folder joined onto the model directory.
_NAME_ARGUMENTS = ("subfolder", "gguf_file", "_configuration_file", "config_file_name")


def _redirecting(
    descriptor: Any, *, first: str = "pretrained_model_name_or_path", file_argument: str | None = None
) -> Any:
    """Wrap a `from_pretrained`-like classmethod so that its model reference goes through `guarded_path`.

    `first` is the model reference's parameter name; `file_argument` a file name parameter that follows it
    positionally. Names joined onto the model directory are checked before anything is read.
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


def _patch_method(module: ModuleType, class_name: str, method: str) -> None:
    cls = getattr(module, class_name, None)
    if isinstance(cls, type) and method in cls.__dict__:
        options = _METHOD_OPTIONS.get((class_name, method), {})
        _patch(cls, method, _redirecting(cls.__dict__[method], **options))


def _patch_safetensors(module: ModuleType) -> None:
    _patch_functions(module, {"safe_open": _verified_safe_open})
    rust = sys.modules.get("safetensors._safetensors_rust")
    if rust is not None:
        _patch_functions(rust, {"safe_open": _verified_safe_open})


def _patch_safetensors_torch(module: ModuleType) -> None:
    _patch_functions(module, {"load_file": _verified_load_file, "safe_open": _verified_safe_open})


def _guarded_cached_files(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def cached_files(path_or_repo_id: Any, *args: Any, **kwargs: Any) -> Any:
        subfolder = kwargs.get("subfolder")
        check_relative_name(subfolder, "subfolder", path_or_repo_id)
        given = args[0] if args else kwargs.get("filenames")
        names = [given] if isinstance(given, str | os.PathLike) else list(given or ())
        for name in names:
            check_relative_name(name, "filename", path_or_repo_id)
        if args:
            args = (names, *args[1:])
        elif "filenames" in kwargs:
            kwargs["filenames"] = names
        target = guarded_path(path_or_repo_id)
        hit = snapshot_containing(target) if isinstance(target, str | os.PathLike) else None
        if hit is not None:
            for name in names:
                if isinstance(name, str | os.PathLike):
                    hit[0].refuse_unsigned(os.path.join(hit[1], os.fspath(subfolder or ""), os.fspath(name)))
        return original(target, *args, **kwargs)

    return cached_files


def _patch_transformers_hub(module: ModuleType) -> None:
    _patch_functions(module, {"cached_files": _guarded_cached_files(module.cached_files)})


def _patch_modeling_utils(module: ModuleType) -> None:
    if hasattr(module, "_safe_load_bytes"):
        _patch(module, "_safe_load_bytes", _refuse_unverifiable_bytes)
    _patch_method(module, "PreTrainedModel", "from_pretrained")


def _private_modules_dir() -> Path:
    global _modules_dir
    if _modules_dir is None:
        from modelsec.verifier.guard.private_files import snapshot_base_dir

        _modules_dir = Path(tempfile.mkdtemp(prefix="modelsec-modules-", dir=snapshot_base_dir()))
    return _modules_dir


def _guarded_dynamic_class(original: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_class_from_dynamic_module(
        class_reference: str, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any
    ) -> Any:
        reference = str(class_reference)
        if "--" in reference or "/" in reference:
            raise PolicyViolationError(
                f"remote code reference {reference!r} names another repository; refused (only signed code of "
                "the model itself may run)"
            )
        snap, rel = _snapshot_for(Path(os.fspath(pretrained_model_name_or_path)))
        if not snap.policy.allow_remote_code:
            raise PolicyViolationError(
                f"{snap.source}: remote code {reference!r} is refused by policy {snap.policy.name!r} "
                "(allowRemoteCode)"
            )
        subfolder = kwargs.get("subfolder") or ""
        module_name = reference.rpartition(".")[0].replace(".", "/") + ".py"
        module_file = "/".join(p for p in (rel, subfolder, module_name) if p)
        if module_file not in snap.signed.manifest.names:
            raise PolicyViolationError(
                f"{snap.source}: remote code {reference!r} needs {module_file!r}, which is not a signed file"
            )
        # Import from a private per-process copy of the verified files, never the shared HF_MODULES_CACHE.
        setattr(module, "HF_MODULES_CACHE", str(_private_modules_dir()))  # noqa: B010 - a module global
        return original(reference, str(snap.path / rel) if rel else str(snap.path), *args, **kwargs)

    return get_class_from_dynamic_module


def _patch_dynamic_modules(module: ModuleType) -> None:
    original = module.get_class_from_dynamic_module
    if (id(module), "get_class_from_dynamic_module") in _originals:
        original = _originals[(id(module), "get_class_from_dynamic_module")][1]
    _patch_functions(module, {"get_class_from_dynamic_module": _guarded_dynamic_class(original, module)})


_PIPELINE_PATHS = ("model", "config", "tokenizer", "feature_extractor", "image_processor", "processor")


def _patch_pipelines(module: ModuleType) -> None:
    original = module.pipeline
    if (id(module), "pipeline") in _originals:
        original = _originals[(id(module), "pipeline")][1]

    @functools.wraps(original)
    def pipeline(*args: Any, **kwargs: Any) -> Any:
        trust = bool(kwargs.get("trust_remote_code"))
        if len(args) > 1:
            args = (args[0], guarded_path(args[1], trust_remote_code=trust), *args[2:])
        for name in _PIPELINE_PATHS:
            if name in kwargs:
                kwargs[name] = guarded_path(kwargs[name], trust_remote_code=trust)
        return original(*args, **kwargs)

    _patch_functions(module, {"pipeline": pipeline})


def _patch_sentence_transformers(module: ModuleType) -> None:
    cls = getattr(module, "BaseModel", None)
    if not isinstance(cls, type):
        return
    original: Any = _originals.get((id(cls), "__init__"), (None, cls.__dict__["__init__"]))[1]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        trust = bool(kwargs.get("trust_remote_code"))
        if args:
            args = (guarded_path(args[0], trust_remote_code=trust), *args[1:])
        elif "model_name_or_path" in kwargs:
            kwargs["model_name_or_path"] = guarded_path(kwargs["model_name_or_path"], trust_remote_code=trust)
        original(self, *args, **kwargs)

    _patch(cls, "__init__", __init__)


# Module -> what to patch there once it is imported (classes are patched where they are defined).
_METHODS: dict[str, tuple[tuple[str, str], ...]] = {
    "transformers.configuration_utils": (("PreTrainedConfig", "from_pretrained"),),
    "transformers.tokenization_utils_base": (("PreTrainedTokenizerBase", "from_pretrained"),),
    "transformers.processing_utils": (("ProcessorMixin", "from_pretrained"),),
    "transformers.image_processing_base": (("ImageProcessingMixin", "from_pretrained"),),
    "transformers.feature_extraction_utils": (("FeatureExtractionMixin", "from_pretrained"),),
    "transformers.generation.configuration_utils": (("GenerationConfig", "from_pretrained"),),
    "transformers.models.auto.configuration_auto": (("AutoConfig", "from_pretrained"),),
    "transformers.models.auto.auto_factory": (("_BaseAutoModelClass", "from_pretrained"),),
    "transformers.models.auto.tokenization_auto": (("AutoTokenizer", "from_pretrained"),),
    "transformers.models.auto.processing_auto": (("AutoProcessor", "from_pretrained"),),
    "transformers.models.auto.image_processing_auto": (("AutoImageProcessor", "from_pretrained"),),
    "transformers.models.auto.feature_extraction_auto": (("AutoFeatureExtractor", "from_pretrained"),),
}
# GenerationConfig names its model reference differently and takes a file name after it.
_METHOD_OPTIONS: dict[tuple[str, str], dict[str, str]] = {
    ("GenerationConfig", "from_pretrained"): {
        "first": "pretrained_model_name",
        "file_argument": "config_file_name",
    },
}
_PATCHERS: dict[str, Callable[[ModuleType], None]] = {
    "safetensors": _patch_safetensors,
    "safetensors.torch": _patch_safetensors_torch,
    "transformers.utils.hub": _patch_transformers_hub,
    "transformers.modeling_utils": _patch_modeling_utils,
    "transformers.dynamic_module_utils": _patch_dynamic_modules,
    "transformers.pipelines": _patch_pipelines,
    "sentence_transformers.base.model": _patch_sentence_transformers,
}


def _patch_methods(module: ModuleType) -> None:
    for class_name, method in _METHODS[module.__name__]:
        _patch_method(module, class_name, method)


def _when_active(generation: int, patcher: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def callback(module: ModuleType) -> None:
        with _lock:
            if _active and generation == _generation:
                patcher(module)

    return callback


def install(
    policy: Policy | PolicySet | None = None, *, expected_digests: Collection[str] | None = None
) -> None:
    """Install the runtime guard in this process (see the module docstring); idempotent.

    Frameworks already imported are patched now, the others when they are first imported.

    Args:
        policy: The policy to apply; None loads `$MODELSEC_POLICY` now (and keeps it).
        expected_digests: Model root digests (`sha256:<hex>`) every guarded model must have; None reads
            `$MODELSEC_MODEL_DIGEST` (unset: no pin).

    Raises:
        PolicyError: `policy` is None and `$MODELSEC_POLICY` is unset or invalid, or
            `$MODELSEC_MODEL_DIGEST` is malformed (checked now: fail fast).
    """
    global _policy, _pins, _active, _generation, _pending_rebind
    with _lock:
        resolved: Policy | PolicySet = policy if policy is not None else PolicySet.from_env()
        pins = (
            tuple(DigestPin(None, d) for d in expected_digest_set(expected_digests))
            if expected_digests is not None
            else digest_pins_from_env()
        )
        _policy, _pins = resolved, pins
        if _active:
            return
        _active = True
        _generation += 1
        # Frameworks already imported are patched now, within this call: one sweep of sys.modules for all of
        # them (each sweep walks every attribute of every loaded module); later imports sweep on their own.
        _pending_rebind = {}
        try:
            for name, patcher in _PATCHERS.items():
                when_imported(name, _when_active(_generation, patcher))
            for name in _METHODS:
                when_imported(name, _when_active(_generation, _patch_methods))
            replacements = _pending_rebind
        finally:
            _pending_rebind = None
        _rebind(replacements)


def installed() -> bool:
    """Whether `install()` is in effect."""
    return _active


def uninstall() -> None:
    """Restore every patched function; frameworks imported later are no longer patched."""
    global _policy, _pins, _active, _generation
    with _lock:
        for (_, name), (owner, original) in reversed(list(_originals.items())):
            setattr(owner, name, original)
        _originals.clear()
        if _replaced:
            _rebind_copies({k: (replacement, original) for k, (replacement, original) in _replaced.items()})
            _replaced.clear()
        _policy, _pins, _active = None, None, False
        _generation += 1


def main(argv: Sequence[str] | None = None, *, run: Callable[..., Any] | None = None) -> int:
    """`python -m modelsec.verifier.guard.hook [-m MODULE | SCRIPT] [ARGS...]` with `$MODELSEC_POLICY` set."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[-3] if __doc__ else "", file=sys.stderr)
        return 2
    try:
        install()
    except Error as e:
        print(f"modelsec: error: {e.diagnostics()}", file=sys.stderr)
        return 1
    if args[0] == "-m":
        if len(args) < 2:
            print("modelsec: error: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = args[1:]
        (run or runpy.run_module)(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        (run or runpy.run_path)(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # Run the importable module's main, not this `__main__` copy, so that the script sees one hook state.
    _hook = importlib.import_module("modelsec.verifier.guard.hook")
    sys.exit(_hook.main())
