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
from modelsec.errors import BackendUnavailableError, DigestMismatchError, MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.content import ContentSniffer
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.safetensors_header import SafetensorsHeader, parse_header, parse_header_length

__all__ = [
    "ChunkSource",
    "FileDigests",
    "FileIdentity",
    "Hasher",
    "PrehashedFile",
    "StreamHasher",
    "TensorDigest",
    "check_identity",
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


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What `fstat` says about one file: equal identities mean the same inode, not rewritten since.

    Attributes:
        device: `st_dev`.
        inode: `st_ino`.
        size: `st_size`, bytes.
        mtime_ns: `st_mtime_ns` (any write sets it).
        ctime_ns: `st_ctime_ns` (any write, `utime`, `chmod` or link sets it; no caller can set it back).

    Timestamps come from the file system's clock, whose tick is coarse (about 1-4 ms on Linux): a write
    in the same tick as the last one is not told apart. Hence this binds digests to a file only where no
    other party can write it (a private staging directory, the file created with `O_EXCL`).
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity in a stat result."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def describe(self) -> str:
        """One line for messages: `dev:inode size mtime ctime`."""
        return f"{self.device}:{self.inode} {self.size} bytes mtime {self.mtime_ns} ctime {self.ctime_ns}"


@dataclass(frozen=True, slots=True)
class PrehashedFile:
    """Digests a writer computed from a file's bytes as it wrote them, bound to the file it wrote.

    The one way digests computed elsewhere reach the verifier (`verify_model(prehashed=...)`, used by
    `modelsec.distribution.push_pull.pull_model` alone): the verifier takes `digests` instead of reading the
    file only when the file's identity still equals `identity` and every digest it needs was computed under
    its own limits; otherwise it hashes the file itself. Every comparison is the verifier's, as for a file
    it hashed.

    Attributes:
        digests: What `StreamHasher` computed from the bytes written (the writer adds a SHA-256 it verified
            on the same bytes, e.g. an OCI layer digest).
        identity: The file's identity after its last write (`os.fstat` of the descriptor written).
        tensor_hash: The per-tensor digest algorithm of `digests.tensors`, or None.
        limits: The limits the safetensors header was parsed under.
    """

    digests: FileDigests
    identity: FileIdentity
    tensor_hash: HashAlgorithm | None
    limits: Limits

    def covers(
        self, algorithms: Sequence[HashAlgorithm], tensor_hash: HashAlgorithm | None, limits: Limits
    ) -> bool:
        """Whether these digests hold every digest a verification with these parameters compares."""
        return (
            all(a in self.digests.digests for a in algorithms)
            and (tensor_hash is None or self.tensor_hash is tensor_hash)
            and self.limits == limits
            and self.identity.size == self.digests.size
        )


def check_identity(root_fd: int, name: str, expected: FileIdentity, *, model: str) -> None:
    """Refuse a file whose identity is no longer the one recorded when its bytes were hashed.

    Args:
        root_fd: Descriptor of the model root.
        name: Relative name, opened beneath `root_fd` without following links.
        expected: The identity recorded by the writer (`PrehashedFile.identity`).
        model: Names the model in errors.

    Raises:
        DigestMismatchError: The file was replaced, rewritten or touched since (`compared` = "file identity").
        MalformedArtifactError, PolicyViolationError: As `open_beneath` (missing, a link).
    """
    fd = open_beneath(root_fd, name, what=model)
    try:
        actual = FileIdentity.of(os.fstat(fd))
    finally:
        os.close(fd)
    if actual != expected:
        raise DigestMismatchError(
            f"{model}/{name}",
            expected.describe(),
            actual.describe(),
            compared="file identity (changed since its bytes were hashed as written)",
        )


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
    state = StreamHasher(name, size, algorithms=algorithms, tensor_hash=tensor_hash, limits=limits, what=what)
    if is_safetensors_name(name):
        state.update(source.read_exact(min(8, size)))  # the length prefix
        state.update(source.read_exact(state.header_missing))  # the header, parsed strictly
        if progress:
            progress(state.seen)
    if helper is not None and (state.walker is not None or len(state.file_hashers) > 1):
        by_cost = sorted(
            zip(state.algorithms, state.file_hashers, strict=True), key=lambda p: -_COST.get(p[0].value, 3)
        )
        side: list[_Absorber] = [h for _, h in by_cost[1:]]
        if state.sniffer is not None:
            side.append(state.sniffer)
        _split_pass(source, state.walker, [by_cost[0][1]], side, progress, helper)
        # The source yields exactly `size` bytes (it refuses a file that shrinks or grows).
        state.seen = size
    else:
        for chunk in source.chunks():
            state.update(chunk)
            if progress:
                progress(len(chunk))
    return state.finish()


class StreamHasher:
    """Push-mode counterpart of `hash_source`: one file's digests from bytes handed over as they arrive.

    For a writer that produces a file (a download) and must not read it back: each chunk given to `update`
    is absorbed exactly as `hash_source` absorbs a file's bytes, so `finish` returns the `FileDigests` that
    `hash_source` would compute for a file holding the same bytes under the same `name` and `limits`
    (`*.safetensors`: the header is parsed strictly as soon as its bytes are in, then every tensor's byte
    range is digested; other files: the pickle verdict of `modelsec.modelformat.content`). The header bytes
    are buffered until complete (bounded by `Limits.max_safetensors_header_bytes`), the data section is not.

    Nothing here binds the digests to a file on disk: `PrehashedFile` adds the file's identity for that.

    Args:
        name: Relative name; `*.safetensors` names are parsed strictly.
        size: Bytes the file will have (a descriptor's size): more is refused at once, fewer by `finish`.
        algorithms: File digest algorithms.
        tensor_hash: Per-tensor digest algorithm for safetensors files, or None.
        limits: Parser limits.
        what: Names the file in errors; defaults to `name`.

    Raises (from `update` and `finish`):
        MalformedArtifactError: Malformed safetensors header, or more or fewer bytes than `size`.
    """

    def __init__(
        self,
        name: str,
        size: int,
        *,
        algorithms: Sequence[HashAlgorithm],
        tensor_hash: HashAlgorithm | None,
        limits: Limits,
        what: str | None = None,
    ) -> None:
        self.name, self.size, self.what, self.limits = name, size, what or name, limits
        self.algorithms = list(dict.fromkeys(algorithms))
        self.tensor_hash = tensor_hash
        self.file_hashers = [new_hasher(a) for a in self.algorithms]
        self.header: SafetensorsHeader | None = None
        self.walker: _TensorWalker | None = None
        self.sniffer: ContentSniffer | None = None
        self.seen = 0
        # Safetensors: the header's bytes until it is complete (then None); `_header_end` once its length
        # prefix is in.
        self._pending: bytearray | None = bytearray() if is_safetensors_name(name) else None
        self._header_end: int | None = None
        if self._pending is None:
            self.sniffer = ContentSniffer(size, limits)

    def update(self, data: bytes | memoryview, /) -> None:
        """Absorb the next bytes of the file (see the class docstring for the errors)."""
        self.seen += len(data)
        if self.seen > self.size:
            raise MalformedArtifactError(f"{self.what}: more than the {self.size} bytes announced")
        if self._pending is not None:
            self._pending += data
            data = self._take_header(self._pending)
            if not data:
                return
        for h in self.file_hashers:
            h.update(data)
        if self.sniffer is not None:
            self.sniffer.update(data)
        if self.walker is not None:
            self.walker.feed(memoryview(data))

    @property
    def header_missing(self) -> int:
        """Bytes still needed before the safetensors header can be parsed (0 once parsed, or not safetensors).

        Known once the 8-byte length prefix is in; before that, the bytes missing from the prefix.
        """
        if self._pending is None:
            return 0
        end = self._header_end if self._header_end is not None else min(8, self.size)
        return end - len(self._pending)

    def _take_header(self, pending: bytearray) -> memoryview:
        """Parse the header once its bytes are in; the data-section bytes that came with them."""
        if self._header_end is None:
            if len(pending) < min(8, self.size):
                return memoryview(b"")
            prefix = bytes(pending[:8])
            self._header_end = 8 + parse_header_length(prefix, self.size, path=self.what, limits=self.limits)
        if len(pending) < self._header_end:
            return memoryview(b"")
        end, self._pending = self._header_end, None
        self.header = parse_header(bytes(pending[8:end]), self.size, path=self.what, limits=self.limits)
        for h in self.file_hashers:
            h.update(memoryview(pending)[:end])
        if self.tensor_hash is not None:
            self.walker = _TensorWalker(self.header, self.tensor_hash)
        return memoryview(pending)[end:]

    def finish(self) -> FileDigests:
        """The file's digests, once exactly `size` bytes were absorbed.

        Raises:
            MalformedArtifactError: Fewer bytes than `size` (or a safetensors header never completed).
        """
        if self._pending is not None and self.seen == self.size:
            self._take_header(self._pending)  # a file shorter than its header's length prefix: refused there
        if self.seen != self.size or self._pending is not None:
            raise MalformedArtifactError(f"{self.what}: {self.seen} bytes, not the {self.size} announced")
        return FileDigests(
            name=self.name,
            size=self.size,
            digests={a: h.digest() for a, h in zip(self.algorithms, self.file_hashers, strict=True)},
            header=self.header,
            tensors=self.walker.result if self.walker is not None else None,
            pickle=self.sniffer.finding() if self.sniffer is not None else None,
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
