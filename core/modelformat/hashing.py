"""The hashing engine: one read pass per file, every digest the manifests need, files in parallel threads.

For each file the engine computes, from the same bytes in one pass:

* the file digests requested (SHA-256 for ECDSA manifests, SM3 for SM2 manifests, both at once when both
  are signed), through OpenSSL via `hashlib` (SM3: `hashlib.new("sm3")`, else `cryptography`'s SM3), and
* for `*.safetensors` files, the strictly parsed header (`modelsec.modelformat.safetensors_header`) and one
  digest per tensor over exactly its byte range of the data section, and
* for every other file, whether its bytes are or may hold a pickle (`modelsec.modelformat.content`, fed the
  same chunks), so that the pickle verdict is about the bytes that were hashed and compared.

Per-tensor digests default to BLAKE3 (the `blake3` package, C/SIMD, GIL released): they cover the same
bytes as the file digest again, so their algorithm decides what the second pass costs. Measured here per
core: SHA-256 ≈ 1.36 GB/s, BLAKE3 ≈ 3.5 GB/s, SM3 ≈ 0.27 GB/s, so BLAKE3 adds ~40% to SHA-256 work where
a SHA-256 tensor digest would double it. `tensor_hash` can be SHA-256 or SM3 where policy demands it.

Reading is streamed in `Limits.hash_chunk_bytes` chunks into one reused buffer per thread (memory is
O(chunk x threads), never O(file)). Files are opened with `open_beneath` (no link followed) and must keep
the size seen at open time; a file that grows or shrinks while hashed is refused. Threads scale because
hashlib, cryptography and blake3 release the GIL while hashing large buffers.

Where a core would otherwise idle (fewer large safetensors files than cores, e.g. a single-file model),
one file's work is split over two threads: a helper reads the chunks and computes the per-tensor digests
(and every file digest but the costliest), the file's own thread computes the costliest file digest of
the same chunks. Both see the same bytes in the same order, so every digest equals the one-thread result;
the reader then rotates `_PIPELINE_SLOTS` chunk buffers instead of one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from modelsec.algorithms import HashAlgorithm
from modelsec.errors import BackendUnavailableError, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.content import ContentSniffer
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.safetensors_header import SafetensorsHeader, parse_header, parse_header_length

__all__ = [
    "ChunkSource",
    "FileDigests",
    "Hasher",
    "TensorDigest",
    "hash_files",
    "hash_source",
    "hmac_sm3",
    "new_hasher",
]

ProgressCallback = Callable[[int], None]

# Chunk buffers in flight between the helper and the file's thread when a file's work is split.
_PIPELINE_SLOTS = 4
# Only files of at least this many chunks are split: the hand-over costs more than it saves below it.
_PIPELINE_MIN_CHUNKS = 8
# Relative cost per byte (measured per core: SM3 0.27, SHA-256 1.36, BLAKE3 3.5 GB/s); the costliest file
# digest stays on the file's own thread.
_COST = {"sm3": 13, "sha256": 3, "blake3": 1}


class _Absorber(Protocol):
    """What the engine feeds each chunk to: a hasher, or the content sniffer."""

    def update(self, data: bytes | memoryview, /) -> object:
        """Absorb more bytes."""
        ...


class Hasher(Protocol):
    """The incremental hash interface shared by hashlib, cryptography (adapted) and blake3."""

    def update(self, data: bytes | memoryview, /) -> object:
        """Absorb more bytes."""
        ...

    def digest(self) -> bytes:
        """The digest of everything absorbed."""
        ...


class _CryptographySm3:
    """SM3 through `cryptography` (`hashes.SM3`) where hashlib's OpenSSL lacks it."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives import hashes

        self._ctx = hashes.Hash(hashes.SM3())

    def update(self, data: bytes | memoryview, /) -> None:
        self._ctx.update(data)

    def digest(self) -> bytes:
        return self._ctx.finalize()


def _sm3_from_hashlib() -> bool:
    try:
        hashlib.new("sm3")
    except ValueError:
        return False
    return True


_HASHLIB_SM3 = _sm3_from_hashlib()


def hmac_sm3(key: bytes, data: bytes) -> bytes:
    """HMAC-SM3 (RFC 2104 over SM3, GB/T 32905-2016) of `data`, through the same SM3 as `new_hasher`.

    hashlib's where the OpenSSL build has SM3, else `cryptography`'s (DESIGN.md decision 3).
    """
    if _HASHLIB_SM3:
        return hmac.new(key, data, "sm3").digest()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import hmac as crypto_hmac

    h = crypto_hmac.HMAC(key, hashes.SM3())
    h.update(data)
    return h.finalize()


def new_hasher(algorithm: HashAlgorithm) -> Hasher:
    """A fresh incremental hasher for `algorithm`.

    Raises:
        BackendUnavailableError: SM3 or BLAKE3 is unavailable in this environment.
    """
    if algorithm is HashAlgorithm.SHA256:
        return hashlib.sha256()
    if algorithm is HashAlgorithm.SM3:
        if _HASHLIB_SM3:
            return hashlib.new("sm3")
        try:
            return _CryptographySm3()
        except Exception as e:
            raise BackendUnavailableError(
                f"SM3 is available neither in hashlib nor in cryptography: {e}"
            ) from e
    if algorithm is HashAlgorithm.BLAKE3:
        try:
            import blake3
        except ImportError as e:
            raise BackendUnavailableError("the blake3 package is not installed") from e
        hasher: Hasher = blake3.blake3()
        return hasher
    raise BackendUnavailableError(f"no hasher for {algorithm}")


@dataclass(frozen=True, slots=True)
class TensorDigest:
    """The digest of one tensor's bytes and the header facts it was taken under.

    Attributes:
        dtype: safetensors dtype string, e.g. "BF16".
        shape: Tensor shape.
        begin: Start offset within the data section, bytes.
        end: End offset (exclusive) within the data section, bytes.
        digest: Digest of bytes [begin, end) of the data section.
    """

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class FileDigests:
    """Everything one read pass learned about one file.

    Attributes:
        name: Relative POSIX name.
        size: Bytes hashed (the whole file).
        digests: File digest per requested algorithm.
        header: The parsed safetensors header, for `*.safetensors` files.
        tensors: Per-tensor digests by tensor name (when requested and the file is safetensors).
        pickle: Why the bytes are, or may hold, a pickle (`modelsec.modelformat.content.pickle_finding`:
            "a gzip-compressed pickle (protocol 4)", ...), or None; always None for safetensors files,
            which the strict header parse defines.
    """

    name: str
    size: int
    digests: Mapping[HashAlgorithm, bytes]
    header: SafetensorsHeader | None
    tensors: Mapping[str, TensorDigest] | None
    pickle: str | None = None


def is_safetensors_name(name: str) -> bool:
    """Whether `name` is parsed as safetensors (by extension, never by sniffing content)."""
    return name.endswith(".safetensors")


class _Reader:
    """Exact-size chunked reads from a descriptor into one reused buffer."""

    def __init__(self, fd: int, size: int, chunk: int, *, what: str, buffers: int = 1) -> None:
        self.fd, self.remaining, self.what = fd, size, what
        n = min(chunk, max(size, 1))  # small side files need no full-size buffer
        # With several buffers a chunk stays valid until `buffers - 1` more chunks have been read.
        self.views = [memoryview(bytearray(n)) for _ in range(buffers)]
        self.next_buffer = 0

    def read_exact(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            part = os.read(self.fd, n - len(data))
            if not part:
                raise MalformedArtifactError(f"{self.what}: file shrank while it was read")
            data += part
        self.remaining -= n
        return bytes(data)

    def chunks(self) -> Iterator[memoryview]:
        return _ChunkIter(self)


class _ChunkIter:
    def __init__(self, reader: _Reader) -> None:
        self.r = reader

    def __iter__(self) -> _ChunkIter:
        return self

    def __next__(self) -> memoryview:
        r = self.r
        if r.remaining == 0:
            if os.read(r.fd, 1):
                raise MalformedArtifactError(f"{r.what}: file grew while it was read")
            raise StopIteration
        view = r.views[r.next_buffer]
        r.next_buffer = (r.next_buffer + 1) % len(r.views)
        want = min(len(view), r.remaining)
        got = os.readv(r.fd, [view[:want]])
        if got == 0:
            raise MalformedArtifactError(f"{r.what}: file shrank while it was read")
        r.remaining -= got
        return view[:got]


class ChunkSource(Protocol):
    """Where the engine gets bytes from: a file descriptor, or a private in-memory buffer being filled."""

    def read_exact(self, n: int) -> bytes:
        """The next `n` bytes (header reads)."""
        ...

    def chunks(self) -> Iterator[memoryview]:
        """The remaining bytes as successive views, until the source is exhausted."""
        ...


def hash_source(
    source: ChunkSource,
    name: str,
    size: int,
    *,
    algorithms: Sequence[HashAlgorithm],
    tensor_hash: HashAlgorithm | None,
    limits: Limits,
    progress: ProgressCallback | None = None,
    what: str | None = None,
    helper: Executor | None = None,
) -> FileDigests:
    """Hash one file's bytes from `source` in one pass (see the module docstring).

    Args:
        source: Yields exactly `size` bytes.
        name: Relative name; `*.safetensors` names are parsed strictly.
        size: Total bytes the source yields.
        algorithms: File digest algorithms.
        tensor_hash: Per-tensor digest algorithm for safetensors files, or None.
        limits: Parser limits.
        progress: Byte-count callback.
        what: Names the file in errors; defaults to `name`.
        helper: Where to run a helper thread that splits this file's work (module docstring); its views
            of `source` must stay valid until `_PIPELINE_SLOTS` more chunks are read. None: one thread.

    Returns:
        The file's digests, parsed header and per-tensor digests, or (not safetensors) its pickle finding.

    Raises:
        MalformedArtifactError: Malformed safetensors header, or the source yields more or fewer bytes.
    """
    what = what or name
    file_hashers = [new_hasher(a) for a in algorithms]
    header: SafetensorsHeader | None = None
    tensor_digests: dict[str, TensorDigest] | None = None
    if is_safetensors_name(name):
        prefix = source.read_exact(min(8, size))
        n = parse_header_length(prefix, size, path=what, limits=limits)
        raw_header = source.read_exact(n)
        header = parse_header(raw_header, size, path=what, limits=limits)
        for h in file_hashers:
            h.update(prefix)
            h.update(raw_header)
        if progress:
            progress(8 + n)
    walker = _TensorWalker(header, tensor_hash) if header is not None and tensor_hash is not None else None
    sniffer = ContentSniffer(size, limits) if header is None else None
    if helper is not None and (walker is not None or len(file_hashers) > 1):
        by_cost = sorted(zip(algorithms, file_hashers, strict=True), key=lambda p: -_COST.get(p[0].value, 3))
        side: list[_Absorber] = [h for _, h in by_cost[1:]]
        if sniffer is not None:
            side.append(sniffer)
        _split_pass(source, walker, [by_cost[0][1]], side, progress, helper)
    else:
        for chunk in source.chunks():
            for h in file_hashers:
                h.update(chunk)
            if sniffer is not None:
                sniffer.update(chunk)
            if walker is not None:
                walker.feed(chunk)
            if progress:
                progress(len(chunk))
    if walker is not None:
        tensor_digests = walker.result
    return FileDigests(
        name=name,
        size=size,
        digests={a: h.digest() for a, h in zip(algorithms, file_hashers, strict=True)},
        header=header,
        tensors=tensor_digests,
        pickle=sniffer.finding() if sniffer is not None else None,
    )


def _hash_one(
    root_fd: int,
    name: str,
    algorithms: Sequence[HashAlgorithm],
    tensor_hash: HashAlgorithm | None,
    limits: Limits,
    progress: ProgressCallback | None,
    model: str,
    helper: Executor | None = None,
) -> FileDigests:
    what = f"{model}/{name}"
    fd = open_beneath(root_fd, name, what=model)
    try:
        size = os.fstat(fd).st_size
        if size < _PIPELINE_MIN_CHUNKS * limits.hash_chunk_bytes:
            helper = None
        buffers = _PIPELINE_SLOTS if helper is not None else 1
        reader = _Reader(fd, size, limits.hash_chunk_bytes, what=what, buffers=buffers)
        return hash_source(
            reader,
            name,
            size,
            algorithms=algorithms,
            tensor_hash=tensor_hash,
            limits=limits,
            progress=progress,
            what=what,
            helper=helper,
        )
    finally:
        os.close(fd)


class _TensorWalker:
    """Assigns successive chunks of the data section to tensors and digests each tensor's bytes.

    The parser guarantees the tensors, sorted by `begin`, tile the data section exactly, so walking the
    chunks with a cursor over that list assigns every byte to exactly one tensor.
    """

    def __init__(self, header: SafetensorsHeader, algorithm: HashAlgorithm) -> None:
        self.tensors, self.algorithm = header.tensors, algorithm
        self.result: dict[str, TensorDigest] = {}
        self.index, self.offset = 0, 0
        self.current = new_hasher(algorithm)
        self._close_finished()  # empty tensors at offset 0

    def _close_finished(self) -> None:
        while self.index < len(self.tensors) and self.offset == self.tensors[self.index].end:
            t = self.tensors[self.index]
            self.result[t.name] = TensorDigest(t.dtype, t.shape, t.begin, t.end, self.current.digest())
            self.current, self.index = new_hasher(self.algorithm), self.index + 1

    def feed(self, chunk: memoryview) -> None:
        pos = 0
        while pos < len(chunk):
            take = min(len(chunk) - pos, self.tensors[self.index].end - self.offset)
            self.current.update(chunk[pos : pos + take])
            pos += take
            self.offset += take
            self._close_finished()


def _split_pass(
    source: ChunkSource,
    walker: _TensorWalker | None,
    own: list[Hasher],
    side: list[_Absorber],
    progress: ProgressCallback | None,
    helper: Executor,
) -> None:
    """One pass over `source` on two threads: the helper reads and feeds `walker` and `side`, this one `own`.

    At most `_PIPELINE_SLOTS` chunks are in flight (read but not yet absorbed by `own`), so a source that
    rotates that many buffers never overwrites a chunk still being hashed.
    """
    handed: queue.SimpleQueue[memoryview | BaseException | None] = queue.SimpleQueue()
    free = threading.Semaphore(_PIPELINE_SLOTS)
    stop = threading.Event()

    def produce() -> None:
        try:
            chunks = iter(source.chunks())
            while True:
                free.acquire()
                if stop.is_set():
                    return
                chunk = next(chunks, None)
                if chunk is None:
                    handed.put(None)
                    return
                for h in side:
                    h.update(chunk)
                if walker is not None:
                    walker.feed(chunk)
                handed.put(chunk)
        except BaseException as e:  # noqa: BLE001 - handed to the file's thread, which re-raises it
            handed.put(e)

    future = helper.submit(produce)
    try:
        while (item := handed.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            for h in own:
                h.update(item)
            if progress:
                progress(len(item))
            free.release()
    finally:
        stop.set()
        free.release()
        wait([future])  # the helper no longer touches the source or its buffers


def hash_files(
    root_fd: int,
    names: Sequence[str],
    *,
    algorithms: Sequence[HashAlgorithm],
    tensor_hash: HashAlgorithm | None = HashAlgorithm.BLAKE3,
    limits: Limits | None = None,
    progress: ProgressCallback | None = None,
    max_workers: int | None = None,
    model: str = ".",
) -> dict[str, FileDigests]:
    """Hash the named files of a model directory, one read pass each, in parallel threads.

    Args:
        root_fd: Descriptor of the model root (`modelsec.modelformat.model_files.open_model_root`).
        names: Clean relative file names (from `walk_model` or a verified manifest).
        algorithms: File digest algorithms to compute, each in the same pass.
        tensor_hash: Per-tensor digest algorithm for safetensors files, or None for none.
        limits: Parsing and chunk limits; defaults to `Limits()`.
        progress: Called with the number of bytes consumed after each chunk (from worker threads).
        max_workers: Thread count; defaults to `min(len(names), os.cpu_count())`.
        model: Names the model in errors.

    Returns:
        A `FileDigests` per name.

    Raises:
        MalformedArtifactError: A safetensors header is malformed, or a file changed size while read.
        PolicyViolationError: A path component is a symlink.
        BackendUnavailableError: A requested hash is unavailable.
    """
    limits = limits or Limits()
    algorithms = list(dict.fromkeys(algorithms))
    if not names:
        return {}
    workers = max_workers or min(len(names), os.cpu_count() or 1)
    lock = threading.Lock()
    safe_progress: ProgressCallback | None = None
    if progress is not None:
        report = progress

        def safe_progress(n: int) -> None:
            with lock:
                report(n)

    # Largest files first keeps both cores busy until the end.
    sizes = {n: _size_hint(root_fd, n) for n in names}
    order = sorted(names, key=lambda n: -sizes[n])
    # Fewer large files than cores: each large file splits its work with a helper thread (module docstring).
    large = [n for n in order if sizes[n] >= _PIPELINE_MIN_CHUNKS * limits.hash_chunk_bytes]
    split = (tensor_hash is not None or len(algorithms) > 1) and 0 < len(large) < (os.cpu_count() or 1)
    helpers = (
        ThreadPoolExecutor(max_workers=len(large), thread_name_prefix="modelsec-hash-helper")
        if split
        else None
    )
    try:
        if workers == 1:
            results = [
                _hash_one(root_fd, n, algorithms, tensor_hash, limits, safe_progress, model, helpers)
                for n in order
            ]
        else:
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="modelsec-hash")
            try:
                futures = [
                    pool.submit(
                        _hash_one, root_fd, n, algorithms, tensor_hash, limits, safe_progress, model, helpers
                    )
                    for n in order
                ]
                results = [f.result() for f in futures]
            finally:
                # On the first refusal, files not yet started are not read at all.
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        if helpers is not None:
            helpers.shutdown(wait=True)
    return {r.name: r for r in results}


def _size_hint(root_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_size
    except OSError:
        return 0
