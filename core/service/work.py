"""Running blocking work (hashing, watermark extraction, PGD) off the event loop, stoppable.

`run_blocking(fn, context)` runs `fn(check)` in a worker thread. When the RPC ends early (the client
cancels, its deadline passes, or the server shuts down), `check()` raises `CancelledWorkError` (or
`DeadlinePassedError`); `fn` calls it from the progress callbacks the library functions already accept.
A thread cannot be killed from outside: work that never calls `check` runs to its end, but its result is
discarded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from grpc import aio

from modelsec.errors import BackendUnavailableError

__all__ = ["CancelledWorkError", "Check", "DeadlinePassedError", "run_blocking"]

T = TypeVar("T")


class CancelledWorkError(BackendUnavailableError):
    """The RPC that asked for this work is gone (cancelled, or the server is stopping): status CANCELLED."""


class DeadlinePassedError(CancelledWorkError):
    """The RPC's deadline passed while the work ran: status DEADLINE_EXCEEDED."""


Check = Callable[[], None]


def _checker(cancelled: threading.Event, deadline: float | None) -> Check:
    def check() -> None:
        if cancelled.is_set():
            raise CancelledWorkError("the call was cancelled; work stopped")
        if deadline is not None and time.monotonic() > deadline:
            cancelled.set()
            raise DeadlinePassedError("the call's deadline passed; work stopped")

    return check


async def run_blocking(fn: Callable[[Check], T], context: aio.ServicerContext[Any, Any]) -> T:
    """Run `fn(check)` in a worker thread; `check()` raises once the RPC is gone or past its deadline.

    The call counts as gone when the awaiting coroutine is cancelled or the call's done-callback fires
    (client cancel, server shutdown), whichever the event loop sees first.
    """
    cancelled = threading.Event()
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    # grpc-stubs declare the callback as a non-protocol class, so no function matches it.
    context.add_done_callback(lambda _context: cancelled.set())  # type: ignore[arg-type]
    try:
        return await asyncio.to_thread(fn, _checker(cancelled, deadline))
    finally:
        cancelled.set()  # normal return: a no-op for the finished thread; cancellation: stops it
