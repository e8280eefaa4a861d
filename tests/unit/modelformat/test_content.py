"""`modelsec.modelformat.content`: pickles by their bytes, archives within bounds, no false positives."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import zipfile

import pytest

from modelsec.limits import Limits
from modelsec.modelformat.content import ContentSniffer, pickle_finding

SMALL = Limits(max_content_inspect_bytes=64 * 2**10)


class _Call:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran",))


def _sniff(data: bytes, limits: Limits, step: int) -> str | None:
    s = ContentSniffer(len(data), limits)
    for i in range(0, len(data), step):
        s.update(memoryview(data)[i : i + step])
    return s.finding()


def _zip(*members: tuple[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in members:
            z.writestr(name, data)
    return out.getvalue()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_is_a_pickle(protocol: int) -> None:
    data = pickle.dumps([_Call()], protocol=protocol)
    assert pickle_finding(data, len(data), Limits()) is not None


def test_large_zip_judged_by_its_directory_and_the_members_in_view() -> None:
    big = os.urandom(300 * 2**10)
    payload = pickle.dumps(_Call())
    cases = {
        "pickle named in the directory": (_zip(("big.dat", big), ("archive/data.pkl", b"x")), "by its name"),
        "pickle member in the tail": (
            _zip(("a.dat", big), ("c", payload)),
            "'c' is a pickle",
        ),
        "member outside both windows": (
            _zip(("a.dat", big), ("hidden", payload + os.urandom(100 * 2**10)), ("z.dat", big)),
            "could not be inspected completely",
        ),
    }
    for what, (data, expected) in cases.items():
        for step in (5000, 2**20):  # the engine's chunks, small and large, give the same verdict
            found = _sniff(data, SMALL, step)
            assert found is not None and expected in found, (what, step, found)
    # A large zip whose members all start in view is judged by their first bytes (a `.keras` file, say).
    assert _sniff(_zip(("config.json", b"{}"), ("model.weights.h5", big)), SMALL, 2**20) is None


@pytest.mark.parametrize(
    "data",
    [
        b"Git v2.35.2 Release Notes\n==========\n",  # a pickle of one float, then text: builds no code
        b"(The model card)\n",  # `(` then a 4-byte length far beyond the file
        b"N.",
        b'{"model_type": "bert"}',
        b"#version: 0.2\n\xc4\xa0 t\n",
        b"BM" + struct.pack("<I", 1 << 30) + b"\0" * 64,
        b"GGUF" + struct.pack("<IQQ", 3, 291, 24) + b"\0" * 64,
        b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"
        + b" " * 40
        + b"\n",
        b"\x89PNG\r\n\x1a\n" + b"\0" * 64,
        gzip.compress(b"plain text\n"),
        b"x\x9c" + b"not zlib at all",  # zlib's weak magic, corrupt: no consumer can unpickle it
    ],
)
def test_no_false_positives(data: bytes) -> None:
    assert pickle_finding(data, len(data), Limits()) is None


def test_bounded_work() -> None:
    bomb = gzip.compress(b"\0" * (64 * 2**20))
    assert pickle_finding(bomb, len(bomb), SMALL) is None
    nested = pickle.dumps(_Call())
    for _ in range(5):
        nested = gzip.compress(nested)
    found = pickle_finding(nested, len(nested), Limits())
    assert found is not None and "nested more than 4 levels deep (it may hold pickles)" in found


def test_zstd_without_or_with_a_library() -> None:
    payload = pickle.dumps(_Call())
    frame = b"\x28\xb5\x2f\xfd\x00\x58" + struct.pack("<I", 1 | (len(payload) << 3))[:3] + payload
    found = pickle_finding(frame, len(frame), Limits())
    assert found in (
        "a zstd-compressed pickle (protocol 4)",
        "a zstd stream that modelsec has no library to inspect (it may hold pickles)",
    )
