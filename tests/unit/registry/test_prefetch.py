"""A manifest read started early in a decision (`prefetch_manifest`) answers that decision only.

The webhook reads a model's root tag while the manifest's referrers are being listed; what makes this
safe is that the early read is the same read, made sooner: it answers the same `listing_once` block
(one decision) once, raises what the read raised (an outage still denies), and never answers a later
decision (that would be a cache of a tag, which can move). An in-memory registry stands in for the
network (the real registry's path is in tests/integration/test_registry_connections.py).
"""

from __future__ import annotations

import threading

import pytest

from modelsec.errors import BackendUnavailableError, NotFoundError
from modelsec.registry.referrers import listing_once, manifest_in_block, prefetch_manifest


class _Registry:
    """`get_manifest` of one tag whose target the test moves; records the reading thread of each read."""

    def __init__(self) -> None:
        self.target = b'{"manifest": 1}'
        self.reads: list[str] = []
        self.failure: Exception | None = None
        self.release = threading.Event()
        self.release.set()

    def get_manifest(self, repository: str, ref: str) -> tuple[bytes, str, str]:
        self.release.wait(5)
        self.reads.append(threading.current_thread().name)
        if self.failure is not None:
            raise self.failure
        return self.target, "application/vnd.oci.image.manifest.v1+json", f"digest-of-{self.target!r}"


def test_a_prefetched_read_runs_beside_the_decision_and_answers_it_once() -> None:
    registry = _Registry()
    registry.release.clear()  # the read is in flight while the decision goes on
    with listing_once():
        prefetch_manifest(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
        assert registry.reads == []  # the decision was not held up by the read
        registry.release.set()
        data, _, _ = manifest_in_block(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
        assert data == b'{"manifest": 1}'
        assert registry.reads and registry.reads[0].startswith("modelsec-registry-prefetch")
        manifest_in_block(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
    assert len(registry.reads) == 2 and registry.reads[1] == threading.current_thread().name  # read again


def test_a_prefetched_read_never_answers_a_later_decision() -> None:
    registry = _Registry()
    with listing_once():
        prefetch_manifest(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
    registry.target = b'{"manifest": "the tag moved"}'
    with listing_once():
        data, _, _ = manifest_in_block(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
    assert data == b'{"manifest": "the tag moved"}'
    # Outside a decision nothing is started, and every read asks the registry.
    before = len(registry.reads)
    prefetch_manifest(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
    assert len(registry.reads) == before
    assert manifest_in_block(registry, "models/m", "oms-sha256-r")[0] == b'{"manifest": "the tag moved"}'  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "failure",
    [
        BackendUnavailableError("registry r: unreachable"),
        NotFoundError("oci://r/models/m:oms-sha256-r: no such manifest"),
    ],
)
def test_a_prefetched_read_raises_what_the_read_raised(failure: Exception) -> None:
    registry = _Registry()
    registry.failure = failure
    with listing_once():
        prefetch_manifest(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
        with pytest.raises(type(failure)) as raised:
            manifest_in_block(registry, "models/m", "oms-sha256-r")  # type: ignore[arg-type]
    assert raised.value is failure
