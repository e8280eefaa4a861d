r"""Pickles recognised by their bytes, not by their names: the one content classification of modelsec.

A file's name says nothing about how a consumer reads it: `torch.load` accepts any name (`checkpoint.pth.tar`
is a torch zip), `joblib.load` unwraps gzip, xz, bz2, lzma and zlib by their magic bytes
(`classifier.pkl.gz`), and an opaque archive (`model.tar`, a `.nemo` tar, a `.mar` zip) holds whatever was
packed into it. So the refusal of pickles (`refusePickle`) is decided on the bytes as well as the name:

* **A pickle**: the data parses as a pickle opcode stream from offset 0 under `pickletools.dis` (opcode
  arguments, stack and memo discipline) and either reaches STOP, or stays valid for `_MAX_OPCODES` opcodes,
  or stays valid after at least one whole opcode up to the end of the inspected window (a protocol 0 pickle
  may open with a string longer than the window); a stream that reaches STOP without PROTO and without an
  opcode that imports or calls (`_CODE_OPCODES`) builds plain values only and is not reported (the text
  "Git v2.35.2 ..." is such a pickle of one float). A JSON file fails at once (`{` and `[` are not
  opcodes), and so do the magic numbers of other binary formats; text fails at its first space or newline
  where an opcode must stand. Safetensors files are not sniffed here (their strict header parse defines
  them).
* **A torch zip or any zip archive** (`PK\x03\x04` at offset 0, as `torch.load` and `numpy.load`
  recognise them): its central directory is read, every member named like a pickle (`*/data.pkl`,
  `PICKLE_SUFFIXES`) is one, and every member's first bytes are classified in turn.
* **A tar archive** (a valid first header): every member header, name and first bytes, likewise.
* **A compressed wrapper** (gzip, zlib, xz, lzma-alone, bz2, zstd, lz4 frame): the start of the
  decompressed stream, decompressed with an output bound, is classified in turn.

Everything is bounded by `Limits`: the first `max_content_inspect_bytes` of a file (for a zip also its last
as many bytes, where its directory lives), at most `max_content_inspect_bytes` of decompressed output per
stream and `4 x` that in all, and `max_content_nesting` levels of archives and wrappers. An archive or
wrapper that cannot be inspected completely within these bounds (a member, header or directory outside
the inspected window, an unreadable or encrypted member, a compressor modelsec has no library for, data
after the end of a tar) *may* hold pickles and is reported as such: under `refusePickle` it is refused, and
the error says to sign the unpacked files instead. A corrupt compressed stream is not reported: no consumer
can unpickle what does not decompress.

The classification runs on the very bytes that are hashed (`ContentSniffer` is fed the hashing engine's
chunks), so what is classified is what was verified; nothing is re-opened.
"""

from __future__ import annotations

import functools
import io
import os
import warnings
import zlib
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from modelsec.limits import Limits
from modelsec.modelformat.model_files import PICKLE_SUFFIXES

# tarfile, zipfile, bz2 and lzma are imported by the readers that need them: the hashing engine imports this
# module, and the verified loader's start-up would otherwise pay for four archive libraries.
if TYPE_CHECKING:
    import tarfile
    import zipfile

__all__ = ["ContentSniffer", "pickle_finding"]

# Parsing arbitrary bytes as protocol 0 strings makes pickletools' escape decoding warn ("invalid escape
# sequence") on the user's terminal; the bytes are judged here, not reported as Python source. A filter
# (not `catch_warnings`, which is not thread-safe: the hashing engine classifies in several threads).
warnings.filterwarnings("ignore", category=DeprecationWarning, module="pickletools")

# Opcodes `pickletools.dis` may accept before the data counts as a pickle without reaching STOP: bounds the
# CPU spent on one file (about a millisecond), far beyond what any text or binary format survives.
_MAX_OPCODES = 2048
# Read size for an archive member's first bytes (the part inside the window is used).
_PREFIX_STEP = 4096
# The inspected decompressed output of all streams of one file together, in units of the window.
_TOTAL_BUDGET_WINDOWS = 4
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
# Opcodes that import or call something (or hand an id to the consumer's `persistent_load`): a pickle
# without them only builds plain values.
_CODE_OPCODES = frozenset(
    {
        "GLOBAL",
        "STACK_GLOBAL",
        "INST",
        "OBJ",
        "REDUCE",
        "NEWOBJ",
        "NEWOBJ_EX",
        "BUILD",
        "EXT1",
        "EXT2",
        "EXT4",
        "PERSID",
        "BINPERSID",
    }
)
# Bounded decompression: (data, most output bytes) -> (output, the stream ended with nothing after it).
_Decompress = Callable[[bytes, int], tuple[bytes, bool]]
# An archive member's first bytes and its size, or None for a member without data.
_Head = tuple[bytes, int] | None


class _OutOfWindow(Exception):
    """A read reached bytes that were not kept for inspection."""


class _Enough(Exception):
    """`pickletools.dis` accepted `_MAX_OPCODES` opcodes."""


class _Window(io.RawIOBase):
    """A read-only seekable view of a file of `size` bytes of which only a head and a tail are known.

    Reads of unknown bytes raise `_OutOfWindow`, so a parser (tarfile, zipfile, pickletools) either sees
    real bytes of the verified file or stops; it never sees invented ones.
    """

    def __init__(self, head: bytes, size: int, tail: bytes = b"") -> None:
        self.head, self.size, self.tail, self.pos = head, size, tail, 0
        self.tail_start = size - len(tail)
        self.overrun_fits = False  # the last read past the window asked only for bytes the file has

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        start = self.pos
        if start >= end:
            return b""
        if end <= len(self.head):
            data = self.head[start:end]
        elif start >= self.tail_start:
            data = self.tail[start - self.tail_start : end - self.tail_start]
        elif start < len(self.head) and end >= self.tail_start and len(self.head) >= self.tail_start:
            data = self.head[start:] + self.tail[len(self.head) - self.tail_start : end - self.tail_start]
        else:
            self.overrun_fits = n is not None and 0 <= n and start + n <= self.size
            raise _OutOfWindow
        self.pos = end
        return bytes(data)

    def readline(self, size: int | None = -1, /) -> bytes:
        # Only pickle text opcodes read lines, and only from the head.
        cut = self.head.find(b"\n", self.pos)
        if cut < 0 and len(self.head) < self.size:
            self.overrun_fits = True  # a line longer than the rest of the window
            raise _OutOfWindow
        end = len(self.head) if cut < 0 else cut + 1
        line, self.pos = bytes(self.head[self.pos : end]), max(self.pos, end)
        return line


class _OpcodeCounter:
    """The text sink of `pickletools.dis`: one line per opcode; stops the parse after `limit` opcodes."""

    def __init__(self, limit: int) -> None:
        self.lines, self.limit = 0, limit

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        if self.lines >= self.limit:
            raise _Enough
        return len(text)


@functools.cache
def _opcode_chars() -> frozenset[str]:
    """The first characters a pickle can start with (pickletools is imported by the first classification)."""
    import pickletools

    return frozenset(op.code for op in pickletools.opcodes)


def _pickle_protocol(data: bytes, size: int) -> str | None:
    """Describe `data` (the first bytes of `size`) as a pickle, or None when it is not one."""
    if not data or chr(data[0]) not in _opcode_chars():
        return None
    import pickletools

    window, names, count, stopped = _Window(data, size), set(), 0, True
    try:
        for opcode, _arg, _pos in pickletools.genops(window):  # type: ignore[arg-type]
            names.add(opcode.name)
            count += 1
            if count >= _MAX_OPCODES:
                stopped = False
                break
    except _OutOfWindow:
        stopped = False
        # Valid up to the end of the window: a pickle if a whole opcode came first and the argument that
        # runs past the window fits in the file. (A huge argument of the first opcode proves nothing: `BM`
        # and a size start every BMP image; text opening with `(The` declares a 4-byte length "he  " far
        # beyond a text file's size. A protocol 0/1 pickle may well open with `(` and a huge string.)
        if count < 1 or not window.overrun_fits:
            return None
    except Exception:  # noqa: BLE001 - pickletools raises several kinds for "not a pickle"
        return None
    try:  # the same opcodes again, now with pickletools' stack and memo checks
        pickletools.dis(_Window(data, size), out=_OpcodeCounter(count))  # type: ignore[arg-type]
    except (_Enough, _OutOfWindow):
        pass
    except Exception:  # noqa: BLE001 - as above
        return None
    if stopped and data[0] != 0x80 and not names & _CODE_OPCODES:
        # A short stream without PROTO that builds only plain values ("Git v2.35.2 ..." is BINFLOAT,
        # STOP): unpickling it runs nothing, and text files begin like that.
        return None
    protocol = f" (protocol {data[1]})" if data[0] == 0x80 and len(data) > 1 else " (protocol 0 or 1)"
    return f"a pickle{protocol}"


class _Inspector:
    """One file's classification, with the decompression budget shared by all nested streams."""

    def __init__(self, limits: Limits) -> None:
        self.window = limits.max_content_inspect_bytes
        self.nesting = limits.max_content_nesting
        self.max_members = limits.max_files
        self.budget = _TOTAL_BUDGET_WINDOWS * self.window

    def classify(self, data: bytes, size: int, depth: int, tail: bytes = b"") -> str | None:
        """Describe `data`, the first bytes of a stream of `size` bytes (more than `len(data)`: cut)."""
        found = _pickle_protocol(data, size)
        if found is not None:
            return found
        if data.startswith(_ZIP_MAGIC):
            return self._nested(depth, "zip archive", lambda: self._zip(data, size, tail, depth))
        if _is_tar(data):
            return self._nested(depth, "tar archive", lambda: self._tar(data, size, depth))
        wrapper = _wrapper(data)
        if wrapper is None:
            return None
        name, decompress = wrapper
        return self._nested(
            depth, f"{name} stream", lambda: self._wrapped(name, decompress, data, len(data) == size, depth)
        )

    def _nested(self, depth: int, what: str, inspect: Callable[[], str | None]) -> str | None:
        if depth >= self.nesting:
            return f"a {what} nested more than {self.nesting} levels deep (it may hold pickles)"
        try:
            return inspect()
        except _OutOfWindow:
            return (
                f"a {what} that could not be inspected completely within the first "
                f"{self.window} bytes (it may hold pickles)"
            )

    def _take(self, n: int) -> int:
        """Debit the decompression budget for reading up to `n` bytes; how many may be read."""
        n = min(n, self.window, self.budget)
        if n <= 0:
            raise _OutOfWindow
        self.budget -= n
        return n

    def _wrapped(
        self, name: str, decompress: _Decompress | None, data: bytes, whole: bool, depth: int
    ) -> str | None:
        if decompress is None:
            return f"a {name} stream that modelsec has no library to inspect (it may hold pickles)"
        import lzma

        try:
            out, ended = decompress(data, self._take(self.window))
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError):
            return None  # corrupt: no consumer can unpickle what does not decompress
        if not out:
            return None
        # The output is all there is only when the stream ended with nothing after it (a second gzip
        # member, say, continues the output for `gzip.open`).
        inner = self.classify(out, len(out) if whole and ended else len(out) + 1, depth + 1)
        article = "an" if name in ("xz", "lz4", "lzma") else "a"
        return None if inner is None else f"{article} {name}-compressed {_without_article(inner)}"

    def _tar(self, data: bytes, size: int, depth: int) -> str | None:
        import tarfile

        try:
            archive = tarfile.open(fileobj=_Window(data, size), mode="r:")
        except tarfile.TarError:
            return None
        with archive:
            for count, member in enumerate(archive):
                if count >= self.max_members:
                    raise _OutOfWindow
                found = self._member(member.name, depth, self._tar_head(archive, member))
                if found is not None:
                    return f"a tar archive whose member {member.name!r} is {found}"
            end = archive.offset
        if len(data) < size or any(data[end:]):
            raise _OutOfWindow  # bytes after what tarfile read as members: other readers may go on
        return None

    def _tar_head(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], _Head]:
        def head() -> _Head:
            f = archive.extractfile(member) if member.isreg() and member.size else None
            return None if f is None else (_read_prefix(f, self._take(member.size)), member.size)

        return head

    def _zip(self, data: bytes, size: int, tail: bytes, depth: int) -> str | None:
        import zipfile

        try:
            archive = zipfile.ZipFile(_Window(data, size, tail))
        except zipfile.BadZipFile:
            raise _OutOfWindow from None  # starts like a zip but has no readable directory
        with archive:
            infos = archive.infolist()
            if len(infos) > self.max_members:
                raise _OutOfWindow
            for info in infos:
                found = self._member(info.filename, depth, self._zip_head(archive, info))
                if found is not None:
                    return f"a zip archive whose member {info.filename!r} is {found}"
        return None

    def _zip_head(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], _Head]:
        import zipfile

        def head() -> _Head:
            if info.is_dir() or not info.file_size:
                return None
            try:
                with archive.open(info) as f:
                    return _read_prefix(f, self._take(info.file_size)), info.file_size
            except (RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error, OSError, EOFError):
                raise _OutOfWindow from None  # encrypted, an unknown method, or corrupt: not inspectable

        return head

    def _member(self, name: str, depth: int, head: Callable[[], _Head]) -> str | None:
        if name.lower().endswith(PICKLE_SUFFIXES):
            return "a pickle by its name"
        got = head()
        return None if got is None else self.classify(got[0], got[1], depth + 1)


def _read_prefix(f: IO[bytes], n: int) -> bytes:
    """Up to `n` first bytes of an archive member: as many as lie inside the inspected window.

    A member that starts inside the window but runs past it is judged by its start (as a file is); one
    whose start lies outside cannot be judged at all.
    """
    data = bytearray()
    try:
        while len(data) < n and (part := f.read(min(_PREFIX_STEP, n - len(data)))):
            data += part
    except _OutOfWindow:
        if not data:
            raise
    return bytes(data)


def _without_article(text: str) -> str:
    for article in ("a ", "an "):
        if text.startswith(article):
            return text[len(article) :]
    return text


def _is_tar(data: bytes) -> bool:
    import tarfile

    if len(data) < tarfile.BLOCKSIZE:
        return False
    try:
        tarfile.TarInfo.frombuf(data[: tarfile.BLOCKSIZE], "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _stdlib(factory: Callable[[], Any]) -> _Decompress:
    def run(data: bytes, limit: int) -> tuple[bytes, bool]:
        d = factory()
        out = d.decompress(data, limit)
        return out, bool(getattr(d, "eof", False)) and not getattr(d, "unused_data", b"")

    return run


def _zstd() -> _Decompress | None:
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14
    except ImportError:
        try:
            from backports import zstd  # type: ignore[import-not-found]
        except ImportError:
            zstd = None
    if zstd is not None:
        return _stdlib(zstd.ZstdDecompressor)
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None

    def run(data: bytes, limit: int) -> tuple[bytes, bool]:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(limit)
        return out, False

    return run


def _lz4() -> _Decompress | None:
    try:
        import lz4.frame  # type: ignore[import-not-found]
    except ImportError:
        return None
    return _stdlib(lz4.frame.LZ4FrameDecompressor)


def _wrapper(data: bytes) -> tuple[str, _Decompress | None] | None:
    """The compressor whose magic bytes start `data`, with its bounded decompression (None: no library)."""
    if data.startswith(b"\x1f\x8b"):
        return "gzip", _stdlib(lambda: zlib.decompressobj(wbits=31))
    if data.startswith(b"\xfd7zXZ\x00"):
        import lzma

        return "xz", _stdlib(lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ))
    if data[:3] == b"BZh" and data[3:4].isdigit() and data[3:4] != b"0":
        import bz2

        return "bzip2", _stdlib(bz2.BZ2Decompressor)
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd", _zstd()
    if data.startswith(b"\x04\x22\x4d\x18"):
        return "lz4", _lz4()
    # Weak magics (joblib's zlib and lzma formats): a text file may start alike, so these are only
    # reported when the start really decompresses (a corrupt stream is never reported, see `_wrapped`).
    if len(data) > 1 and data[0] == 0x78 and (data[0] * 256 + data[1]) % 31 == 0:
        return "zlib", _stdlib(zlib.decompressobj)
    if data.startswith(b"]\x00\x00"):
        import lzma

        return "lzma", _stdlib(lambda: lzma.LZMADecompressor(lzma.FORMAT_ALONE))
    return None


def pickle_finding(head: bytes, size: int, limits: Limits, *, tail: bytes = b"") -> str | None:
    """Why a file's bytes are, or may hold, a pickle (see the module docstring), or None.

    Nothing is unpickled, extracted or written: pickles are parsed with `pickletools`, archives read with
    `tarfile` / `zipfile` over the given bytes only, compressed streams decompressed with an output bound.

    Args:
        head: The file's first bytes (at most `limits.max_content_inspect_bytes` are looked at).
        size: The file's size in bytes (`len(head)` when `head` is the whole file).
        limits: `max_content_inspect_bytes`, `max_content_nesting`, `max_files`.
        tail: The file's last bytes (where a zip archive's directory is), at most as many as `head`.

    Returns:
        A description that completes "NAME is ...", e.g. "a pickle (protocol 4)", "a gzip-compressed pickle
        (protocol 2)", "a zip archive whose member 'archive/data.pkl' is a pickle by its name", or "a tar
        archive that could not be inspected completely within the first 1048576 bytes (it may hold
        pickles)"; None when the bytes are none of these.
    """
    window = limits.max_content_inspect_bytes
    head, tail = head[:window], tail[-window:] if tail else b""
    if len(head) == size:
        tail = b""
    return _Inspector(limits).classify(head, size, 0, tail)


class ContentSniffer:
    """Keeps the bounded head (and, for a zip, tail) of a stream of chunks for `pickle_finding`.

    Fed by the hashing engine with the same chunks it hashes (a `Hasher`-like `update`), so the verdict is
    about the verified bytes. Memory: at most twice `limits.max_content_inspect_bytes`.
    """

    def __init__(self, size: int, limits: Limits) -> None:
        self.size, self.limits = size, limits
        self.window = limits.max_content_inspect_bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.keep_tail: bool | None = None  # decided once the head is complete

    def update(self, chunk: bytes | memoryview, /) -> None:
        """Absorb the next bytes of the stream."""
        if len(self.head) < self.window:
            self.head += chunk[: self.window - len(self.head)]
        if self.keep_tail is None and (len(self.head) >= self.window or len(self.head) >= self.size):
            self.keep_tail = bytes(self.head[:4]) in _ZIP_MAGIC
            if not self.keep_tail:
                self.tail = bytearray()
        if self.keep_tail is not False:
            # Until the head says otherwise, and then only for a zip, the last `window` bytes are kept.
            if len(chunk) >= self.window:
                self.tail = bytearray(
                    chunk[-self.window :]
                )  # one copy per chunk (the chunk's buffer is reused)
            else:
                self.tail += chunk
                if len(self.tail) > self.window:
                    del self.tail[: len(self.tail) - self.window]

    def finding(self) -> str | None:
        """`pickle_finding` over the absorbed bytes."""
        return pickle_finding(bytes(self.head), self.size, self.limits, tail=bytes(self.tail))
