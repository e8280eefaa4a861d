"""The runtime guard for transformers: file resolution, `from_pretrained`, `pipeline()` and remote code.

* **File resolution** (`transformers.utils.hub.cached_files`, under `cached_file`: the layer every config,
  tokenizer and generation config load shares): the model reference goes through `guarded_path`, and every
  file name and `subfolder` is checked to stay inside the tree and to be signed.
* **Sharded checkpoints** (`transformers.utils.hub.get_checkpoint_shard_files`): for a local folder it joins
  each `weight_map` value of the index onto the folder with `os.path.join` and never reaches `cached_files`
  (an absolute value replaces the folder; transformers 5.24 does not check, 5.25 does). The model and the
  index go through `guarded_path` (the index read is the verified copy, held to the index rules of
  `modelsec.modelformat.shard_index` when the model was verified), and every shard path it returns must
  be a signed file of that same snapshot: anything else is refused before a shard is opened.
* **`from_pretrained`** of `AutoConfig`, the `AutoModel*` classes, `AutoTokenizer`, `AutoProcessor`,
  `AutoImageProcessor`, `AutoFeatureExtractor`, `PreTrainedConfig`, `PreTrainedModel`, tokenizers,
  processors, image processors, feature extractors and `GenerationConfig`, each patched on the class that
  defines it (`redirecting`); and `pipeline()`'s model, config, tokenizer and processor arguments.
* **Bytes without a name**: the byte-loading path (`disable_mmap`, `_safe_load_bytes`) is refused.
* **Remote code** (`get_class_from_dynamic_module`): refused unless the policy allows it; then only a local
  `module.Class` reference whose module is a signed file runs, imported from a private per-process module
  directory filled from the snapshot (never the shared `HF_MODULES_CACHE`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from modelsec.errors import PolicyViolationError
from modelsec.verifier.guard.patching import (
    Patcher,
    guarded_path,
    patch,
    patch_functions,
    redirecting,
    snapshot_for,
    unpatched,
)
from modelsec.verifier.guard.snapshot import check_relative_name, snapshot_containing

__all__ = ["PATCHERS"]

_modules_dir: Path | None = None

# Module -> the classes' methods to redirect once it is imported (classes are patched where they are defined).
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
_PIPELINE_PATHS = ("model", "config", "tokenizer", "feature_extractor", "image_processor", "processor")


def _patch_method(module: ModuleType, class_name: str, method: str) -> None:
    cls = getattr(module, class_name, None)
    if isinstance(cls, type) and method in cls.__dict__:
        options = _METHOD_OPTIONS.get((class_name, method), {})
        patch(cls, method, redirecting(cls.__dict__[method], **options))


def _patch_methods(module: ModuleType) -> None:
    for class_name, method in _METHODS[module.__name__]:
        _patch_method(module, class_name, method)


def _refuse_unverifiable_bytes(*_args: object, **_kwargs: object) -> Any:
    raise PolicyViolationError(
        "loading safetensors from raw bytes (transformers disable_mmap) cannot be verified; "
        "load from a signed local directory instead"
    )


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


def _guarded_shard_files(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_checkpoint_shard_files(
        pretrained_model_name_or_path: Any, index_filename: Any, *args: Any, **kwargs: Any
    ) -> Any:
        check_relative_name(kwargs.get("subfolder"), "subfolder", pretrained_model_name_or_path)
        model = guarded_path(pretrained_model_name_or_path)
        index = guarded_path(index_filename)
        shards, metadata = original(model, index, *args, **kwargs)
        hit = snapshot_containing(index) if isinstance(index, str | os.PathLike) else None
        if hit is None:  # guarded_path always maps a path into a snapshot; anything else is not served
            raise PolicyViolationError(f"{index_filename}: not a verified weight index; refused")
        snap, index_rel = hit
        for shard in shards:
            served = snapshot_containing(shard)
            if served is None or served[0] is not snap or served[1] not in snap.signed.manifest.names:
                raise PolicyViolationError(
                    f"{snap.source / index_rel}: names the shard {os.fspath(shard)!r}, which is not a signed "
                    f"file of {snap.source}; the modelsec runtime guard serves only the verified model's "
                    "shards"
                )
        return shards, metadata

    return get_checkpoint_shard_files


def _patch_hub(module: ModuleType) -> None:
    patch_functions(
        module,
        {
            "cached_files": _guarded_cached_files(module.cached_files),
            "get_checkpoint_shard_files": _guarded_shard_files(
                unpatched(module, "get_checkpoint_shard_files", module.get_checkpoint_shard_files)
            ),
        },
    )


def _patch_modeling_utils(module: ModuleType) -> None:
    if hasattr(module, "_safe_load_bytes"):
        patch(module, "_safe_load_bytes", _refuse_unverifiable_bytes)
    _patch_method(module, "PreTrainedModel", "from_pretrained")


def _private_modules_dir() -> Path:
    global _modules_dir
    if _modules_dir is None:
        from modelsec.verifier.guard.private_files import private_directory

        _modules_dir = private_directory("modelsec-modules-")
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
        snap, rel = snapshot_for(Path(os.fspath(pretrained_model_name_or_path)))
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
    name = "get_class_from_dynamic_module"
    original = unpatched(module, name, getattr(module, name))
    patch_functions(module, {name: _guarded_dynamic_class(original, module)})


def _patch_pipelines(module: ModuleType) -> None:
    original = unpatched(module, "pipeline", module.pipeline)

    @functools.wraps(original)
    def pipeline(*args: Any, **kwargs: Any) -> Any:
        trust = bool(kwargs.get("trust_remote_code"))
        if len(args) > 1:
            args = (args[0], guarded_path(args[1], trust_remote_code=trust), *args[2:])
        for name in _PIPELINE_PATHS:
            if name in kwargs:
                kwargs[name] = guarded_path(kwargs[name], trust_remote_code=trust)
        return original(*args, **kwargs)

    patch_functions(module, {"pipeline": pipeline})


PATCHERS: Mapping[str, Patcher] = {
    "transformers.utils.hub": _patch_hub,
    "transformers.modeling_utils": _patch_modeling_utils,
    "transformers.dynamic_module_utils": _patch_dynamic_modules,
    "transformers.pipelines": _patch_pipelines,
    **dict.fromkeys(_METHODS, _patch_methods),
}
