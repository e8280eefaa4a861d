"""Evaluation datasets for the robustness gate: strict loading, validation and a digest for the report.

A dataset is two tensors: `inputs` (N, ...) floating point in the model's native input range, and `labels`
(N,) integer class indices. It comes from

* a safetensors file holding exactly the tensors `inputs` and `labels` (header parsed strictly by
  `modelsec.modelformat.safetensors_header` before `safetensors` sees the bytes),
* an `.npz` file holding exactly the arrays `inputs` and `labels` (`numpy.load(allow_pickle=False)`; member
  sizes bounded before decompression), or
* an import path `package.module:function` to operator code returning `(inputs, labels)` or a mapping with
  those keys (tensors or numpy arrays).

The digest recorded in the attestation is SHA-256 over the exact file bytes for files (read once, parsed from
that buffer), and over the safetensors serialisation of the validated float32/int64 tensors for loaders.
Validation: both names present and nothing else, N >= 1, inputs at least 2-D with a floating dtype, all
finite and inside the valid range, labels 1-D with an integer dtype, non-negative, one per input. The upper
bound on labels (the model's class count) is checked by the gate.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelsec.errors import MalformedArtifactError, PolicyError
from modelsec.limits import Limits
from modelsec.robustness.imports import is_import_path, resolve_import_path

__all__ = ["MAX_DATASET_BYTES", "Dataset", "dataset_from_tensors", "load_dataset"]

MAX_DATASET_BYTES = 8 * 2**30
"""Largest dataset file (or decompressed `.npz` member) read into memory: 8 GiB."""

_NAMES = frozenset({"inputs", "labels"})
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


@dataclass(frozen=True, slots=True)
class Dataset:
    """A validated evaluation set (CPU tensors).

    Attributes:
        inputs: (N, ...) float32, finite, inside the valid range given to the loader.
        labels: (N,) int64, non-negative.
        digest: Hex SHA-256 (see the module docstring for what it covers).
        source: The file path or import path it came from.
        format: `safetensors`, `npz` or `loader`.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    digest: str
    source: str
    format: str

    @property
    def size(self) -> int:
        """N, the number of examples."""
        return int(self.labels.shape[0])


def load_dataset(
    spec: str | Path,
    *,
    clip: tuple[float, float] = (0.0, 1.0),
    max_bytes: int = MAX_DATASET_BYTES,
    limits: Limits | None = None,
) -> Dataset:
    """Load and validate a dataset from a safetensors or `.npz` file, or from a `pkg.mod:function` loader.

    A string that names an existing path is a file; otherwise a string of the form `pkg.mod:function` is an
    import path (operator code, imported from the environment).

    Args:
        spec: File path, or import path.
        clip: The model's valid input range `(lo, hi)`; inputs outside it are refused.
        max_bytes: Largest file (or decompressed `.npz` member) read into memory.
        limits: Safetensors header limits; defaults to `Limits()`.

    Returns:
        The validated dataset with its digest.

    Raises:
        MalformedArtifactError: The file is missing, too large, not parseable, lacks `inputs` or `labels`,
            holds other tensors, or fails validation (shapes, dtypes, non-finite or out-of-range values).
        PolicyError: An import path cannot be imported or its function fails.
    """
    text = str(spec)
    if isinstance(spec, str) and not os.path.lexists(text) and is_import_path(text):
        return _from_loader(text, clip)
    path = Path(spec)
    data = _read_file(path, max_bytes)
    digest = hashlib.sha256(data).hexdigest()
    if path.suffix == ".npz" or (path.suffix != ".safetensors" and data[:4] == b"PK\x03\x04"):
        inputs, labels = _parse_npz(data, str(path), max_bytes)
        fmt = "npz"
    else:
        inputs, labels = _parse_safetensors(data, str(path), limits or Limits())
        fmt = "safetensors"
    inputs, labels = _validate(inputs, labels, str(path), clip)
    return Dataset(inputs, labels, digest, str(path), fmt)


def dataset_from_tensors(
    inputs: Any, labels: Any, *, source: str, clip: tuple[float, float] = (0.0, 1.0)
) -> Dataset:
    """Validate in-memory tensors (or numpy arrays) as a dataset; the digest covers their serialisation.

    Args:
        inputs: (N, ...) floating point, inside `clip`.
        labels: (N,) integer.
        source: Names the data in errors and in the report.
        clip: The valid input range.

    Returns:
        The validated dataset (`format` = `loader`).

    Raises:
        MalformedArtifactError: Validation fails (see the module docstring).
    """
    x, y = _validate(_as_tensor(inputs, source, "inputs"), _as_tensor(labels, source, "labels"), source, clip)
    from safetensors.torch import save

    digest = hashlib.sha256(save({"inputs": x.contiguous(), "labels": y.contiguous()})).hexdigest()
    return Dataset(x, y, digest, source, "loader")


def _read_file(path: Path, max_bytes: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise MalformedArtifactError(f"{path}: cannot open the dataset: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise MalformedArtifactError(f"{path}: the dataset is not a regular file")
        if st.st_size > max_bytes:
            raise MalformedArtifactError(f"{path}: the dataset is larger than {max_bytes} bytes")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise MalformedArtifactError(f"{path}: the dataset is larger than {max_bytes} bytes")
    return data


def _check_names(names: set[str], source: str) -> None:
    missing = sorted(_NAMES - names)
    if missing:
        raise MalformedArtifactError(f"{source}: dataset lacks the tensor(s) {', '.join(missing)}")
    extra = sorted(names - _NAMES)
    if extra:
        raise MalformedArtifactError(
            f"{source}: dataset holds unexpected tensor(s) {', '.join(extra[:5])} (only inputs and labels)"
        )


def _parse_safetensors(data: bytes, source: str, limits: Limits) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    from modelsec.modelformat.safetensors_header import parse_header, parse_header_length

    n = parse_header_length(data[:8], len(data), path=source, limits=limits)
    header = parse_header(data[8 : 8 + n], len(data), path=source, limits=limits)
    _check_names({t.name for t in header.tensors}, source)
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise MalformedArtifactError(f"{source}: cannot load the dataset tensors: {e}") from e
    return tensors["inputs"], tensors["labels"]


def _parse_npz(data: bytes, source: str, max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            for info in infos:
                if info.file_size > max_bytes:
                    raise MalformedArtifactError(
                        f"{source}: npz member {info.filename!r} decompresses to more than {max_bytes} bytes"
                    )
            names = {info.filename.removesuffix(".npy") for info in infos}
            if len(names) != len(infos):
                raise MalformedArtifactError(f"{source}: npz holds duplicate member names")
            _check_names(names, source)
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            inputs, labels = npz["inputs"], npz["labels"]
    except MalformedArtifactError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        raise MalformedArtifactError(f"{source}: not a readable npz dataset: {e}") from e
    return _as_tensor(inputs, source, "inputs"), _as_tensor(labels, source, "labels")


def _as_tensor(value: Any, source: str, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise MalformedArtifactError(f"{source}: `{name}` has the unsupported dtype {value.dtype}")
        if not value.dtype.isnative:
            value = value.astype(value.dtype.newbyteorder("="))
        return torch.from_numpy(np.ascontiguousarray(value))
    raise MalformedArtifactError(f"{source}: `{name}` is a {type(value).__name__}, not a tensor or array")


def _validate(
    inputs: torch.Tensor, labels: torch.Tensor, source: str, clip: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    if inputs.dtype not in _FLOAT_DTYPES:
        raise MalformedArtifactError(f"{source}: `inputs` must be floating point, got {inputs.dtype}")
    if labels.dtype not in _INT_DTYPES:
        raise MalformedArtifactError(f"{source}: `labels` must be integer class indices, got {labels.dtype}")
    if inputs.ndim < 2:
        raise MalformedArtifactError(
            f"{source}: `inputs` must be (N, ...) with at least 2 dimensions, got shape {tuple(inputs.shape)}"
        )
    if labels.ndim != 1:
        raise MalformedArtifactError(f"{source}: `labels` must be 1-D (N,), got shape {tuple(labels.shape)}")
    if labels.shape[0] != inputs.shape[0]:
        raise MalformedArtifactError(
            f"{source}: {inputs.shape[0]} inputs but {labels.shape[0]} labels (shapes {tuple(inputs.shape)} "
            f"and {tuple(labels.shape)})"
        )
    if labels.shape[0] == 0 or inputs[0].numel() == 0:
        raise MalformedArtifactError(f"{source}: the dataset is empty")
    x = inputs.to(torch.float32).contiguous()
    y = labels.to(torch.int64).contiguous()
    if not bool(torch.isfinite(x).all()):
        raise MalformedArtifactError(f"{source}: `inputs` holds NaN or infinite values")
    lo, hi = float(x.min()), float(x.max())
    if lo < clip[0] or hi > clip[1]:
        raise MalformedArtifactError(
            f"{source}: `inputs` range [{lo:g}, {hi:g}] is outside the valid range "
            f"[{clip[0]:g}, {clip[1]:g}] "
            "(give inputs in the model's native range; normalisation belongs inside the model)"
        )
    if int(y.min()) < 0:
        raise MalformedArtifactError(f"{source}: `labels` holds negative class indices")
    return x, y


def _from_loader(spec: str, clip: tuple[float, float]) -> Dataset:
    function = resolve_import_path(spec, what="dataset loader")
    try:
        value = function()
    except Exception as e:
        raise PolicyError(f"dataset loader {spec}: failed: {type(e).__name__}: {e}") from e
    if isinstance(value, Mapping):
        _check_names({str(k) for k in value}, spec)
        inputs, labels = value["inputs"], value["labels"]
    elif isinstance(value, tuple) and len(value) == 2:
        inputs, labels = value
    else:
        raise MalformedArtifactError(
            f"{spec}: a dataset loader must return (inputs, labels) or a mapping with those keys, "
            f"got {type(value).__name__}"
        )
    return dataset_from_tensors(inputs, labels, source=spec, clip=clip)
