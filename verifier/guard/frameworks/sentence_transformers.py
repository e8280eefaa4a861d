"""The runtime guard for sentence-transformers: `SentenceTransformer`, `CrossEncoder` and `SparseEncoder`.

All three construct through `BaseModel.__init__`, whose model reference (`model_name_or_path`) goes through
`guarded_path`; the files and tensors it then loads go through the transformers and safetensors patches.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from modelsec.verifier.guard.patching import Patcher, guarded_path, patch, unpatched

__all__ = ["PATCHERS"]


def _patch_base_model(module: ModuleType) -> None:
    cls = getattr(module, "BaseModel", None)
    if not isinstance(cls, type):
        return
    original: Any = unpatched(cls, "__init__", cls.__dict__["__init__"])

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        trust = bool(kwargs.get("trust_remote_code"))
        if args:
            args = (guarded_path(args[0], trust_remote_code=trust), *args[1:])
        elif "model_name_or_path" in kwargs:
            kwargs["model_name_or_path"] = guarded_path(kwargs["model_name_or_path"], trust_remote_code=trust)
        original(self, *args, **kwargs)

    patch(cls, "__init__", __init__)


PATCHERS: Mapping[str, Patcher] = {
    "sentence_transformers.base.model": _patch_base_model,
}
