"""Tensor access for the watermark: safetensors model directories (strictly parsed) and in-memory arrays.

Reading a model directory walks it with the signer's rules (`modelsec.modelformat.model_files.walk_model`: no
symlinks, no special files, clean names), and parses every `*.safetensors` header with the strict parser of
DESIGN.md decision 6 before any tensor byte is used. Data are read through a read-only memory map, one shard
at a time, and only the carrier blocks are gathered; the pages read are unmapped again tensor by tensor, so
memory stays bounded by about one tensor;
`read` materialises one whole tensor (used by re-synchronisation only).

dtypes: F32 is read as float32, F16 and BF16 are widened to float32 exactly (BF16 by shifting its 16 bits
into the high half of a float32), F64 stays float64. `encode` casts back with round-to-nearest-even.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from modelsec.modelformat.safetensors_header import SafetensorsHeader, TensorInfo

__all__ = [
    "RAW_DTYPES",
    "ArraySource",
    "DirectorySource",
    "ShardFile",
    "TensorRef",
    "TensorSource",
    "decode",
    "encode",
    "open_source",
]

#: Little-endian numpy storage dtype of each float safetensors dtype (BF16 is handled as raw uint16).
RAW_DTYPES: Mapping[str, str] = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}
_NUMPY_TO_SAFETENSORS = {"float32": "F32", "float16": "F16", "float64": "F64"}


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor as the watermark sees it: name, safetensors dtype name, shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


class TensorSource(Protocol):
    """Read access to a model's tensors (a directory, in-memory arrays, or a re-synchronised view)."""

    def tensors(self) -> Sequence[TensorRef]:
        """All tensors, in a stable order."""
        ...

    def read_blocks(
        self, ref: TensorRef, blocks: npt.NDArray[np.int64], block_size: int
    ) -> npt.NDArray[np.floating]:
        """The given blocks of the flattened tensor as an (n, block_size) float32/float64 array (a copy)."""
        ...

    def read(self, ref: TensorRef) -> npt.NDArray[np.floating]:
        """The whole tensor, float32/float64, in its shape (a copy)."""
        ...


def decode(raw: npt.NDArray[Any], dtype: str, *, copy: bool = True) -> npt.NDArray[np.floating]:
    """Widen raw storage values (`RAW_DTYPES[dtype]`) to float32 (float64 for F64).

    Args:
        raw: Values in their storage dtype.
        dtype: The safetensors dtype name.
        copy: Always return a new array; with False, F32/F64 input the caller owns may be returned as is.
    """
    import numpy as np

    if dtype == "BF16":
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype == "F64":
        return raw.astype(np.float64, copy=copy)
    return raw.astype(np.float32, copy=copy)


def encode(values: npt.NDArray[np.floating], dtype: str) -> npt.NDArray[Any]:
    """Cast float values back to the storage dtype with round-to-nearest-even, clamping finite overflow.

    Finite inputs stay finite: values beyond the dtype's largest finite number become that number (the
    embedding changes magnitudes by at most `max_relative_change`, so this only matters for weights
    already next to the dtype's limit).
    """
    import numpy as np

    out: npt.NDArray[Any]
    if dtype == "F64":
        out = values.astype("<f8")
        return out
    if dtype == "F32":
        out = np.clip(values, -np.finfo(np.float32).max, np.finfo(np.float32).max).astype("<f4")
        return out
    if dtype == "F16":
        limit = float(np.finfo(np.float16).max)
        out = np.clip(values, -limit, limit).astype("<f2")
        return out
    # BF16: round-to-nearest-even on the float32 bit pattern; 0x7F7F is the largest finite magnitude.
    f32 = np.clip(values.astype(np.float32), -3.3895313892515355e38, 3.3895313892515355e38)
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(
        np.uint32
    )
    magnitude = rounded & np.uint32(0x7FFF)
    rounded = np.where(magnitude > 0x7F7F, (rounded & np.uint32(0x8000)) | np.uint32(0x7F7F), rounded)
    return rounded.astype("<u2")


# --- directories --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardFile:
    """One parsed safetensors file of a model directory.

    Attributes:
        name: Relative POSIX name inside the model directory.
        size: File size in bytes when parsed.
        header: The strictly validated header.
        raw_header: The 8-byte length prefix and JSON header exactly as read.
        mtime_ns: Modification time when parsed (to detect a file changed between passes).
    """

    name: str
    size: int
    header: SafetensorsHeader
    raw_header: bytes
    mtime_ns: int


class DirectorySource:
    """The tensors of a safetensors model directory, read through read-only memory maps.

    Use as a context manager (or call `close`) to release the maps. Only one shard is mapped at a time.

    Args:
        root: The model directory.
        limits: Parser limits; defaults to `Limits()`.

    Raises:
        MalformedArtifactError: Not a directory, no `*.safetensors` file, a malformed header, or a tensor
            name that appears in two shards.
        PolicyViolationError: A symlink or special file in the directory.
    """

    def __init__(self, root: Path, *, limits: Limits | None = None) -> None:
        from modelsec.modelformat.model_files import open_model_root, walk_model
        from modelsec.signer.layout import MODEL_IGNORE_PATHS

        self.root = Path(root)
        self.limits = limits or Limits()
        self.shards: list[ShardFile] = []
        self._where: dict[str, tuple[ShardFile, TensorInfo]] = {}
        self._refs: list[TensorRef] = []
        self._mapped: tuple[str, mmap.mmap] | None = None
        # One descriptor for the walk and every later open: the directory listed is the one read, whatever
        # happens to the path meanwhile.
        self._root_fd = open_model_root(self.root)
        try:
            self.files = walk_model(
                self.root, ignore_paths=MODEL_IGNORE_PATHS, limits=self.limits, root_fd=self._root_fd
            )
            names = [f.name for f in self.files if f.name.endswith(".safetensors")]
            if not names:
                pickles = [
                    f.name for f in self.files if f.name.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))
                ]
                hint = (
                    f" (found {', '.join(pickles[:3])}: pickle checkpoints are not supported)"
                    if pickles
                    else ""
                )
                raise MalformedArtifactError(
                    f"{self.root}: no *.safetensors weights in the model directory{hint}"
                )
            for name in names:
                shard = self._parse(name)
                self.shards.append(shard)
                for info in sorted(shard.header.tensors, key=lambda t: t.name):
                    if info.name in self._where:
                        raise MalformedArtifactError(
                            f"{self.root}: tensor {info.name!r} appears in both "
                            f"{self._where[info.name][0].name} and {name}"
                        )
                    self._where[info.name] = (shard, info)
                    self._refs.append(TensorRef(info.name, info.dtype, info.shape))
        except BaseException:
            self.close()
            raise

    def _parse(self, name: str) -> ShardFile:
        from modelsec.modelformat.model_files import open_beneath
        from modelsec.modelformat.safetensors_header import read_header

        fd = open_beneath(self._root_fd, name, what=str(self.root))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            header, raw = read_header(f, st.st_size, path=f"{self.root}/{name}", limits=self.limits)
        return ShardFile(name=name, size=st.st_size, header=header, raw_header=raw, mtime_ns=st.st_mtime_ns)

    @property
    def root_fd(self) -> int:
        """The descriptor of the walked model directory (owned by this source; read every file through it)."""
        return self._root_fd

    def __enter__(self) -> DirectorySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the memory map and the directory descriptor."""
        self._unmap()
        if getattr(self, "_root_fd", -1) >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def _unmap(self) -> None:
        if self._mapped is not None:
            self._mapped[1].close()
            self._mapped = None

    def _map(self, shard: ShardFile) -> mmap.mmap:
        from modelsec.modelformat.model_files import open_beneath

        if self._mapped is not None and self._mapped[0] == shard.name:
            return self._mapped[1]
        self._unmap()
        fd = open_beneath(self._root_fd, shard.name, what=str(self.root))
        try:
            if os.fstat(fd).st_size != shard.size:
                raise MalformedArtifactError(f"{self.root}/{shard.name}: file changed size while being read")
            mapped = mmap.mmap(fd, shard.size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._mapped = (shard.name, mapped)
        return mapped

    def tensors(self) -> Sequence[TensorRef]:
        """All tensors, shard by shard (shards sorted by name), sorted by name inside a shard."""
        return list(self._refs)

    def _raw(self, ref: TensorRef) -> npt.NDArray[Any]:
        import numpy as np

        shard, info = self._where[ref.name]
        mapped = self._map(shard)
        count = math.prod(info.shape)
        return np.frombuffer(
            mapped, dtype=RAW_DTYPES[info.dtype], count=count, offset=shard.header.data_start + info.begin
        )

    def read_blocks(
        self, ref: TensorRef, blocks: npt.NDArray[np.int64], block_size: int
    ) -> npt.NDArray[np.floating]:
        """Gather carrier blocks of a float tensor (see `TensorSource.read_blocks`)."""
        import numpy as np

        raw = self._raw(ref)
        n_blocks = raw.size // block_size
        gathered = np.take(raw[: n_blocks * block_size].reshape(n_blocks, block_size), blocks, axis=0)
        del raw
        self._drop_pages(ref)
        return decode(gathered, ref.dtype, copy=False)

    def read(self, ref: TensorRef) -> npt.NDArray[np.floating]:
        """The whole float tensor (see `TensorSource.read`)."""
        raw = self._raw(ref)
        out = decode(raw, ref.dtype).reshape(ref.shape)
        del raw
        self._drop_pages(ref)
        return out

    def _drop_pages(self, ref: TensorRef) -> None:
        """Unmap the pages of `ref` just read from this process (they stay in the page cache).

        Pages touched through the map count in the process's resident set until the map is closed; dropped
        tensor by tensor, the map adds about one tensor to peak memory instead of one shard.
        """
        if self._mapped is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        shard, info = self._where[ref.name]
        start = shard.header.data_start + info.begin
        aligned = start - start % mmap.PAGESIZE
        end = min(shard.size, start + info.nbytes)
        if end > aligned:
            self._mapped[1].madvise(mmap.MADV_DONTNEED, aligned, end - aligned)

    def iter_shards(self) -> Iterator[tuple[ShardFile, list[TensorRef]]]:
        """Each shard with its tensors, in order (the unit of bounded-memory processing)."""
        by_shard: dict[str, list[TensorRef]] = {}
        for ref in self._refs:
            by_shard.setdefault(self._where[ref.name][0].name, []).append(ref)
        for shard in self.shards:
            yield shard, by_shard.get(shard.name, [])


class ArraySource:
    """In-memory tensors (a state dict of numpy arrays), e.g. for experiments and tests.

    float32, float16 and float64 arrays are eligible carriers; any other dtype is listed as `OTHER` and
    ignored. Arrays are not copied until read.
    """

    def __init__(self, arrays: Mapping[str, Any]) -> None:
        import numpy as np

        self._arrays = {name: np.asarray(value) for name, value in arrays.items()}
        self._refs = [
            TensorRef(
                name, _NUMPY_TO_SAFETENSORS.get(arr.dtype.name, "OTHER"), tuple(int(d) for d in arr.shape)
            )
            for name, arr in sorted(self._arrays.items())
        ]

    def tensors(self) -> Sequence[TensorRef]:
        """All tensors, sorted by name."""
        return list(self._refs)

    def read_blocks(
        self, ref: TensorRef, blocks: npt.NDArray[np.int64], block_size: int
    ) -> npt.NDArray[np.floating]:
        """Gather carrier blocks (see `TensorSource.read_blocks`)."""
        import numpy as np

        flat = self._arrays[ref.name].reshape(-1)
        n_blocks = flat.size // block_size
        out = flat[: n_blocks * block_size].reshape(n_blocks, block_size)[blocks]
        return out.astype(np.float64 if out.dtype == np.float64 else np.float32)

    def read(self, ref: TensorRef) -> npt.NDArray[np.floating]:
        """The whole tensor as float32/float64 (a copy)."""
        import numpy as np

        arr = self._arrays[ref.name]
        return arr.astype(np.float64 if arr.dtype == np.float64 else np.float32)


def open_source(model: Path | str | Mapping[str, Any], *, limits: Limits | None = None) -> TensorSource:
    """A `DirectorySource` for a path, an `ArraySource` for a mapping of arrays.

    Raises:
        MalformedArtifactError: As `DirectorySource`.
        PolicyViolationError: As `DirectorySource`.
    """
    if isinstance(model, (str, os.PathLike)):
        return DirectorySource(Path(model), limits=limits)
    return ArraySource(model)
