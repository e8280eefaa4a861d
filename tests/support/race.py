"""Swapping two paths atomically, as a local attacker racing a check against an open would."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> None:
    """Swap `a` and `b` in one step (`renameat2(RENAME_EXCHANGE)`), else with three renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if rc == 0:
            return
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


_SWAP_LOOP = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(ctypes.get_errno())
"""


@contextlib.contextmanager
def swapping(a: Path, b: Path) -> Iterator[None]:
    """Exchange `a` and `b` over and over in a child process while the block runs; put them back after.

    A child process, not a thread: a thread would run only when this process's threads yield the GIL, so
    the swaps would land at a few chosen points instead of anywhere. Skips where `renameat2` is missing.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, "renameat2", None) is None:
        pytest.skip("renameat2(RENAME_EXCHANGE) is unavailable here")
    before = os.lstat(a).st_ino
    child = subprocess.Popen(
        [sys.executable, "-c", _SWAP_LOOP, os.fspath(a), os.fspath(b)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        yield
        assert child.poll() is None, f"the swap loop stopped (errno {child.returncode})"
    finally:
        child.kill()
        child.wait()
        if os.lstat(a).st_ino != before:
            exchange(a, b)

