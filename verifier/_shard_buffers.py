"""Private shard buffers for the verified loader: read once from a descriptor, hashed while filled.

Used by `modelsec.verifier.loader` only. A shard is refused by its length before any allocation
(`checked_shard_size`); the buffer is mapped and filled slice by slice by a reader thread while the
caller's thread hashes it (`BufferFill`); tensors are views of the verified buffer (`tensor_from`).
torch is imported only when a buffer or tensor is built.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from modelsec.attestations.predicates.oms import TensorEntry
from modelsec.errors import BackendUnavailableError, MalformedArtifactError, UnsupportedAlgorithmError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import FileDigests, hash_source
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.safetensors_header import (
    SafetensorsHeader,
    TensorInfo,
    parse_header,
    parse_header_length,
)
from modelsec.verifier.verification import SignedModel

TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}


def torch_module() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without the [torch] extra
        raise BackendUnavailableError("building tensors needs torch: pip install 'modelsec[torch]'") from e
    return torch


def check_device(device: str) -> str:
    """`device` if tensors can go there; refuse an unavailable CUDA device before anything is read."""
    if device == "cpu":
        return device
    if not isinstance(device, str) or not (device == "cuda" or device.startswith(("cuda:", "cpu:"))):
        raise UnsupportedAlgorithmError(f"device {device!r}: modelsec loads to 'cpu' or 'cuda[:N]'")
    if device.startswith("cuda"):
        torch = torch_module()
        index = device.partition(":")[2]
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {device!r}: CUDA is not available on this node")
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise BackendUnavailableError(
                f"device {device!r}: this node has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


@dataclass(frozen=True, slots=True)
class VerifiedShard:
    name: str
    buffer: Any  # torch.Tensor (uint8, the whole file, private)
    header: SafetensorsHeader


class BufferFill:
    """A private buffer filled from a descriptor by a reader thread, consumed as a `ChunkSource`.

    With `populate` (see `_private_buffer`) the reader maps each slice of fresh memory just before it reads
    into it, so mapping, reading and hashing overlap instead of mapping the whole shard first.
    """

    def __init__(
        self,
        fd: int,
        view: memoryview,
        size: int,
        chunk: int,
        what: str,
        populate: Callable[[int, int], None] | None = None,
        *,
        inline: bool = False,
    ) -> None:
        self._fd, self._view, self._size, self._chunk, self._what = fd, view, size, chunk, what
        self._populate = populate
        self._filled = 0
        self._populated = 0
        self._pos = 0
        self._error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if inline:
            # A small shard: a thread's start and hand-overs cost more than the overlap saves, so the
            # whole buffer is filled here, before any of it is hashed.
            self._run()
        else:
            self._thread = threading.Thread(target=self._run, name="modelsec-read", daemon=True)
            self._thread.start()

    def _map_upto(self, end: int) -> None:
        if self._populate is None:
            return
        step = -(-self._chunk // mmap.PAGESIZE) * mmap.PAGESIZE  # page-aligned slice starts
        while self._populated < end:
            n = min(step, self._size - self._populated)
            try:
                self._populate(self._populated, n)
            except OSError as e:
                raise BackendUnavailableError(
                    f"{self._what}: cannot allocate {self._size} bytes to load it: {e}"
                ) from None
            self._populated += n

    def _run(self) -> None:
        try:
            while self._filled < self._size and not self._stop:
                end = min(self._size, self._filled + self._chunk)
                self._map_upto(end)
                got = os.readv(self._fd, [self._view[self._filled : end]])
                if got == 0:
                    raise MalformedArtifactError(f"{self._what}: file shrank while it was read")
                with self._cond:
                    self._filled += got
                    self._cond.notify_all()
            if not self._stop and os.read(self._fd, 1):
                raise MalformedArtifactError(f"{self._what}: file grew while it was read")
        except BaseException as e:  # noqa: BLE001 - handed to the consuming thread, which re-raises it
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _wait(self, upto: int) -> None:
        with self._cond:
            while self._filled < upto and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    def read_exact(self, n: int) -> bytes:
        self._wait(self._pos + n)
        data = bytes(self._view[self._pos : self._pos + n])
        self._pos += n
        return data

    def chunks(self) -> Iterator[memoryview]:
        while self._pos < self._size:
            self._wait(self._pos + 1)
            end = min(self._filled, self._pos + self._chunk)
            view = self._view[self._pos : end]
            self._pos = end
            yield view
        self.close()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join()


def pread_exact(fd: int, length: int, offset: int, what: str) -> bytes:
    parts, done = [], 0
    while done < length:
        got = os.pread(fd, length - done, offset + done)
        if not got:
            raise MalformedArtifactError(f"{what}: file shrank while it was read")
        parts.append(got)
        done += len(got)
    return b"".join(parts)


def checked_shard_size(fd: int, name: str, signed: SignedModel, limits: Limits, what: str) -> int:
    """The shard's size, once it equals what the signed manifest allows: checked before any allocation.

    A signed shard replaced by a huge (e.g. sparse) file must be refused by its length, not by an attempt
    to allocate it. With the per-tensor extension the signed entries give the data section's end; without
    it the header is parsed first (bounded by `limits`), whose tensors must tile the rest of the file.
    """
    size = os.fstat(fd).st_size
    n = parse_header_length(pread_exact(fd, min(8, size), 0, what), size, path=what, limits=limits)
    entries = next((b.manifest.tensors[name] for b in signed.bundles if name in b.manifest.tensors), None)
    if entries is not None:
        data_end = max((e.end for e in entries.values()), default=0)
        source = "its signed tensor entries"
    else:
        data_end = parse_header(pread_exact(fd, n, 8, what), size, path=what, limits=limits).data_size
        source = "its header"
    if size != 8 + n + data_end:
        raise MalformedArtifactError(
            f"{what}: the file has {size} bytes, but {source} allow exactly {8 + n + data_end} "
            f"(8 + a {n}-byte header + {data_end} data bytes); refused before reading it"
        )
    return size


class SmallBufferArena:
    """Private buffers for small shards, carved page-aligned from shared mappings of `_ARENA_BYTES`.

    A model of many small shards would otherwise map, populate and unmap memory per shard in 4 KiB pages
    (huge pages need 2 MiB of one mapping): carving from one mapping lets them share huge pages and the
    set-up. Each carved buffer is still private, written only by its own shard's reader, and hashed before
    use; a view keeps its whole mapping alive. Only the carved slices are ever populated, so the unused
    rest of a mapping costs address space, not memory. One arena per load (thread-safe); mappings are sized
    to the small shards the load expects (`expected` bytes, from their sizes at listing time), so that a host
    with strict overcommit is not charged for address space no shard will use. A shard that turns out larger
    than expected only gets a mapping of its own size.
    """

    def __init__(self, expected: int) -> None:
        self._lock = threading.Lock()
        self._mapping: mmap.mmap | None = None
        self._tensor: Any = None
        self._used = self._size = 0
        self._expected = expected

    @classmethod
    def for_shards(cls, root_fd: int, names: Iterable[str]) -> SmallBufferArena:
        """An arena sized for the small shards among `names` (sizes from `stat`; only a size hint)."""
        total = 0
        for name in names:
            try:
                size = os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_size
            except OSError:
                continue  # refused when it is opened
            if 0 < size <= _ARENA_MAX_SHARD:
                total += -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        return cls(total)

    def take(self, torch: Any, size: int) -> tuple[Any, Callable[[int, int], None]] | None:
        """A buffer of `size` bytes and how to populate a slice of it, or None: use a mapping of its own."""
        if not 0 < size <= _ARENA_MAX_SHARD or not _can_populate_slices():
            return None
        step = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        with self._lock:
            if self._mapping is None or self._used + step > self._size:
                size = max(step, min(_ARENA_BYTES, self._expected))
                self._mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                _prefer_huge_pages(self._mapping, size)
                self._tensor = torch.frombuffer(self._mapping, dtype=torch.uint8)
                self._used, self._size = 0, size
            start, mapping, tensor = self._used, self._mapping, self._tensor
            self._used += step
            self._expected = max(0, self._expected - step)

        return tensor[start : start + size], partial(_populate_slice, mapping, start)


def read_and_hash_shard(
    root_fd: int,
    name: str,
    signed: SignedModel,
    limits: Limits,
    pinned: bool,
    model: str,
    arena: SmallBufferArena | None = None,
) -> tuple[FileDigests, Any]:
    torch = torch_module()
    what = f"{model}/{name}"
    fd = open_beneath(root_fd, name, what=model)
    try:
        size = checked_shard_size(fd, name, signed, limits, what)
        populate = None
        try:
            carved = arena.take(torch, size) if arena is not None and not pinned else None
            if pinned:
                buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            elif carved is not None:
                buffer, populate = carved
            else:
                buffer, populate = _private_buffer(torch, size)
        except (RuntimeError, OSError) as e:  # the signed size itself does not fit this host's memory
            raise BackendUnavailableError(f"{what}: cannot allocate {size} bytes to load it: {e}") from None
        view = memoryview(buffer.numpy()).cast("B") if size else memoryview(b"")
        inline = size < _THREADED_FILL_CHUNKS * limits.hash_chunk_bytes
        source = BufferFill(fd, view, size, limits.hash_chunk_bytes, what, populate, inline=inline)
        try:
            digests = hash_source(
                source,
                name,
                size,
                algorithms=signed.file_hashes,
                tensor_hash=signed.tensor_hash,
                limits=limits,
                what=what,
            )
        finally:
            source.close()
        return digests, buffer
    finally:
        os.close(fd)


def read_shards(
    root_fd: int,
    names: Sequence[str],
    signed: SignedModel,
    limits: Limits,
    pinned: bool,
    model: str,
    *,
    workers: int,
    meanwhile: Callable[[], object],
) -> dict[str, tuple[FileDigests, Any]]:
    """`read_and_hash_shard` of every name, on `workers` reader threads, while `meanwhile` runs here.

    Each reader takes the next name (in order) when it has finished its shard: a loop per thread, not a task
    and a future per shard, so a model of many small shards pays no per-shard scheduling. Small shards share
    one `SmallBufferArena`. Every buffer is still filled only by the reader of its own shard.

    Returns:
        Name -> (digests, private buffer), for every name.

    Raises:
        What `meanwhile` raises, else the failure of the first shard (in `names` order) that failed. After
        the first failure no reader starts another shard, and nothing is returned until every reader stopped.
    """
    arena = SmallBufferArena.for_shards(root_fd, names)
    results: dict[str, tuple[FileDigests, Any]] = {}
    failures: dict[int, BaseException] = {}
    lock = threading.Lock()
    pending = iter(enumerate(names))
    stop = False

    def reader() -> None:
        while True:
            with lock:
                item = None if stop or failures else next(pending, None)
            if item is None:
                return
            i, name = item
            try:
                results[name] = read_and_hash_shard(root_fd, name, signed, limits, pinned, model, arena)
            except BaseException as e:  # noqa: BLE001 - raised by the caller's thread below
                with lock:
                    failures[i] = e
                return

    threads = [
        threading.Thread(target=reader, name="modelsec-load", daemon=True)
        for _ in range(max(1, min(workers, len(names))))
    ]
    for t in threads:
        t.start()
    try:
        meanwhile()
    except BaseException:
        with lock:
            stop = True
        raise
    finally:
        for t in threads:
            t.join()
    if failures:
        raise failures[min(failures)]
    return results


def _private_buffer(torch: Any, size: int) -> tuple[Any, Callable[[int, int], None] | None]:
    """A private CPU buffer of `size` bytes, and how to map a slice of it before it is written (or None).

    Filling fresh anonymous memory takes one page fault per 4 KiB page, which on virtual machines costs
    more CPU than SHA-256 over the same page; mapping pages ahead of the write in one system call is about
    a quarter cheaper. Where the kernel has `MADV_POPULATE_WRITE` (Linux 5.14) that is done slice by slice
    by the reader (`BufferFill`), so that the cost overlaps hashing, and the zeroed slice is still in the
    cache when it is read into; otherwise `MAP_POPULATE` maps the whole buffer first. The tensor keeps the
    mapping alive; torch.empty where neither exists.
    """
    if not size:
        return torch.empty(size, dtype=torch.uint8), None
    if _can_populate_slices():
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        _prefer_huge_pages(mapping, size)
        return torch.frombuffer(mapping, dtype=torch.uint8), partial(_populate_slice, mapping, 0)
    flag = getattr(mmap, "MAP_POPULATE", 0)
    if not flag:
        return torch.empty(size, dtype=torch.uint8), None
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flag)
    return torch.frombuffer(mapping, dtype=torch.uint8), None


def _prefer_huge_pages(mapping: mmap.mmap, size: int) -> None:
    """Ask for transparent huge pages: 512 times fewer faults and page-table entries to fill.

    Measured here (Linux 6.18 VM, THP `madvise` mode) populating fresh private memory costs ~0.30 CPU s/GB
    in 4 KiB pages and ~0.14 in 2 MiB pages. Only a hint: where THP is off or no huge page is free, the
    kernel falls back to 4 KiB pages and nothing else changes.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or size < _HUGE_PAGE:
        return
    with contextlib.suppress(OSError, ValueError):
        mapping.madvise(advice)


def _populate_slice(mapping: mmap.mmap, base: int, offset: int, length: int) -> None:
    """Map bytes [base + offset, + length) of `mapping` before they are written (OSError: no memory)."""
    mapping.madvise(_MADV_POPULATE_WRITE, base + offset, length)


_HUGE_PAGE = 2 * 2**20
# Shards of fewer chunks than this are filled before hashing, on the caller's thread (`BufferFill` inline).
_THREADED_FILL_CHUNKS = 8
# Shards up to this size share `SmallBufferArena` mappings of `_ARENA_BYTES` (address space, populated only
# where carved).
_ARENA_MAX_SHARD = 8 * 2**20
_ARENA_BYTES = 256 * 2**20
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux's value where Python lacks the name


@cache
def _can_populate_slices() -> bool:
    if sys.platform != "linux" or not hasattr(mmap.mmap, "madvise"):
        return False
    probe = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        probe.madvise(_MADV_POPULATE_WRITE)
    except (OSError, ValueError):  # EINVAL before Linux 5.14
        return False
    finally:
        probe.close()
    return True


@cache
def _torch_dtype(name: str) -> Any:
    """The torch dtype of a safetensors dtype name, or None where this torch has none (looked up once)."""
    torch_name = TORCH_DTYPES.get(name)
    return getattr(torch_module(), torch_name, None) if torch_name else None


TypedViews = dict[tuple[int, str], Any]
"""Per-dtype views of whole storages (`tensor_from`), by (storage address, safetensors dtype)."""


def tensor_from(
    buffer: Any,
    data_start: int,
    info: TensorInfo | TensorEntry,
    name: str,
    what: str,
    views: TypedViews | None = None,
) -> Any:
    """The tensor `info` describes, a view of `buffer` (no copy unless misaligned for its dtype).

    Each tensor is taken with `as_strided` from one view, per dtype, of the whole storage under `buffer`
    (shared by the shards carved from one arena mapping): slicing the bytes and then viewing them as the
    dtype costs about twice as much and leaves two Python tensors alive per tensor (torch keeps a view's
    Python base alive), which a model of thousands of tensors pays for in garbage collections.

    Args:
        buffer: The verified bytes (uint8, 1-D) holding the data section from `data_start` on.
        data_start: Offset of the data section in `buffer` (negative: `buffer` starts inside it).
        info: The tensor's dtype, shape and byte range [begin, end) within the data section; the header
            parser (or the signed entry compared with it) guarantees that the shape fills the range exactly.
        name: The tensor's name, for errors.
        what: The file, for errors.
        views: The typed views to share between calls (e.g. over every shard of a load); filled here.

    Raises:
        UnsupportedAlgorithmError: torch has no dtype for `info.dtype`.
        MalformedArtifactError: The range lies outside `buffer` (fail closed; the parser never allows it).
    """
    dtype = _torch_dtype(info.dtype)
    if dtype is None:
        raise UnsupportedAlgorithmError(
            f"{what}: tensor `{name}` has dtype {info.dtype}, which torch cannot hold"
        )
    if info.end == info.begin:
        return torch_module().empty(info.shape, dtype=dtype)
    start, end = data_start + info.begin, data_start + info.end
    # `as_strided` checks bounds against the whole storage (a shared arena mapping), not against this
    # buffer: the range is bounded here.
    if start < 0 or end > buffer.numel():
        raise MalformedArtifactError(
            f"{what}: tensor `{name}` bytes [{start}, {end}) lie outside the {buffer.numel()} bytes read"
        )
    itemsize = dtype.itemsize
    at = buffer.storage_offset() + start
    if at % itemsize:
        # Misaligned for its dtype: one copy, still of the verified bytes.
        return buffer[start:end].clone().view(dtype).reshape(info.shape)
    storage = buffer.untyped_storage()
    key = (storage.data_ptr(), info.dtype)
    typed = views.get(key) if views is not None else None
    if typed is None:
        typed = torch_module().empty(0, dtype=dtype, device=buffer.device).set_(storage)
        if views is not None:
            views[key] = typed
    shape = info.shape
    strides = [1] * len(shape)
    for i in range(len(shape) - 1, 0, -1):
        strides[i - 1] = strides[i] * shape[i]
    return typed.as_strided(shape, strides, at // itemsize)


def tensors_of(
    shard: VerifiedShard, names: Iterable[str] | None, what: str, views: TypedViews | None = None
) -> dict[str, Any]:
    """The tensors of a verified shard (those in `names`, or all), as `tensor_from` builds them."""
    wanted = set(names) if names is not None else None
    out = {}
    if views is None:
        views = {}
    for info in shard.header.tensors:
        if wanted is None or info.name in wanted:
            out[info.name] = tensor_from(shard.buffer, shard.header.data_start, info, info.name, what, views)
    return out


def to_device(tensors: dict[str, Any], device: str) -> dict[str, Any]:
    if device == "cpu":
        return tensors
    torch = torch_module()
    moved = {k: v.to(device, non_blocking=True) for k, v in tensors.items()}
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return moved


def read_range(fd: int, offset: int, length: int, what: str) -> Any:
    torch = torch_module()
    buffer = torch.empty(length, dtype=torch.uint8)
    view = memoryview(buffer.numpy()).cast("B") if length else memoryview(b"")
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise MalformedArtifactError(f"{what}: file shrank while it was read")
        done += got
    return buffer
