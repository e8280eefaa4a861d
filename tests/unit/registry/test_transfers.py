"""The registry client's transfer settings and its bounded runner (in-process; the wire is in integration)."""

from __future__ import annotations

import threading
import time

import pytest

from modelsec.errors import MalformedArtifactError, NotFoundError
from modelsec.registry.client import RegistryOptions, run_bounded


def test_transfers_come_from_the_environment_and_bad_values_are_refused() -> None:
    assert RegistryOptions.from_env({}).transfers == 4
    assert RegistryOptions.from_env({"MODELSEC_OCI_TRANSFERS": "8"}).transfers == 8
    for bad in ("0", "65", "-1", "four", "2.5"):
        with pytest.raises(MalformedArtifactError, match="MODELSEC_OCI_TRANSFERS") as refused:
            RegistryOptions.from_env({"MODELSEC_OCI_TRANSFERS": bad})
        assert repr(bad) in str(refused.value)


def test_run_bounded_keeps_order_and_never_runs_more_than_its_limit() -> None:
    running, peak, lock = 0, 0, threading.Lock()

    def job(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return i * i

    assert run_bounded([lambda i=i: job(i) for i in range(12)], 3) == [i * i for i in range(12)]
    assert 2 <= peak <= 3


def test_run_bounded_raises_the_first_error_and_starts_nothing_after_it() -> None:
    started: list[int] = []

    def job(i: int) -> None:
        started.append(i)
        if i == 1:
            raise NotFoundError("layer 1: no such blob")
        time.sleep(0.05)

    with pytest.raises(NotFoundError, match="layer 1"):
        run_bounded([lambda i=i: job(i) for i in range(20)], 2)
    assert len(started) < 20  # the jobs queued behind the failure were cancelled
