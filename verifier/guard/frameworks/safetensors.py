"""The runtime guard for safetensors: `safe_open` and `safetensors.torch.load_file` read verified shards only.

Every copy of them that a loaded module holds is replaced too (`patch_functions`). A shard path inside a
snapshot is served from the signed model behind it; any other shard path first has its model verified whole
(`modelsec.verifier.guard.patching.snapshot_for`). The tensors come from `modelsec.verifier.loader`: read into
private memory, compared with the signed manifest, then built.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from modelsec.errors import UnsupportedAlgorithmError
from modelsec.policy import Policy, PolicySet
from modelsec.verifier.guard.patching import Patcher, patch_functions, snapshot_for
from modelsec.verifier.loader import VerifiedSafeOpen

__all__ = ["PATCHERS"]


def _shard(filename: Any) -> tuple[Path, Policy | PolicySet | None, Any]:
    snap, rel = snapshot_for(Path(os.fspath(filename)))
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


def _patch_safetensors(module: ModuleType) -> None:
    patch_functions(module, {"safe_open": _verified_safe_open})
    rust = sys.modules.get("safetensors._safetensors_rust")
    if rust is not None:
        patch_functions(rust, {"safe_open": _verified_safe_open})


def _patch_safetensors_torch(module: ModuleType) -> None:
    patch_functions(module, {"load_file": _verified_load_file, "safe_open": _verified_safe_open})


PATCHERS: Mapping[str, Patcher] = {
    "safetensors": _patch_safetensors,
    "safetensors.torch": _patch_safetensors_torch,
}
