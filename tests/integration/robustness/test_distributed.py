"""The data-parallel context in-process: round-robin batch shards, single-process no-ops.

Two real gloo ranks against one process: tests/integration/test_gate_distributed.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from modelsec.robustness import DistContext  # noqa: E402


def test_context_shards_batches_round_robin() -> None:
    ctx = DistContext(rank=1, world_size=3, backend="gloo")
    assert list(ctx.batches(8)) == [1, 4, 7]
    assert list(DistContext.single().batches(3)) == [0, 1, 2]
    assert not ctx.is_main and DistContext.single().is_main
    t = torch.ones(3)
    assert DistContext.single().all_reduce_sum(t) is t
    DistContext.single().check_same("x", what="y")
