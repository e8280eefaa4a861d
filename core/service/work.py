"""Running blocking work (hashing, watermark extraction, PGD) off the event loop, stoppable.

`run_blocking(fn, context)` runs `fn(cancelled)` in a worker thread. When the RPC ends early (the client
cancels, its deadline passes, or the server shuts down), the awaiting coroutine is cancelled and sets the
`cancelled` event; `fn` must poll it through `checkpoint` (called from the progress callbacks the library
functions already accept) and then stops with `CancelledWorkError`. A thread cannot be killed from outside:
work that never reaches a checkpoint runs to its end, but its result is discarded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from grpc import aio

from modelsec.errors import BackendUnavailableError

__all__ = ["CancelledWorkError", "DeadlinePassedError", "checkpoint", "deadline_of", "run_blocking"]

T = TypeVar("T")


class CancelledWorkError(BackendUnavailableError):
    """The RPC that asked for this work is gone (cancelled, or the server is stopping): status CANCELLED."""


class DeadlinePassedError(CancelledWorkError):
    """The RPC's deadline passed while the work ran: status DEADLINE_EXCEEDED."""


def checkpoint(cancelled: threading.Event, deadline: float | None = None) -> None:
    """Raise `CancelledWorkError` once `cancelled` is set or the monotonic `deadline` has passed."""
    import time

    if cancelled.is_set():
        raise CancelledWorkError("the call was cancelled; work stopped")
    if deadline is not None and time.monotonic() > deadline:
        cancelled.set()
        raise DeadlinePassedError("the call's deadline passed; work stopped")


def deadline_of(context: aio.ServicerContext[Any, Any]) -> float | None:
    """The call's deadline on the `time.monotonic()` clock, or None without one."""
    import time

    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


async def run_blocking(fn: Callable[[threading.Event], T], context: aio.ServicerContext[Any, Any]) -> T:
    """Run `fn(cancelled)` in a worker thread; set `cancelled` if the awaiting RPC is cancelled."""
    cancelled = threading.Event()
    try:
        return await asyncio.to_thread(fn, cancelled)
    finally:
        cancelled.set()  # normal return: a no-op for the finished thread; cancellation: stops it
