"""Data-parallel gate on torch.distributed (gloo, 2 CPU processes) gives exactly the single-process result.

Here rather than in unit/: the ranks are real processes (torch.multiprocessing.spawn).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from modelsec.robustness import Dataset, DistContext, GateConfig, SanityConfig, run_gate  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

pytestmark = pytest.mark.integration

N, BATCH = 150, 32  # five batches: rank 0 takes three, rank 1 two (an uneven split on purpose)


def _config() -> GateConfig:
    return GateConfig(
        eps=0.08,
        step_size=0.02,
        steps=4,
        restarts=2,
        seed=3,
        min_robust_accuracy=0.5,
        min_samples=50,
        batch_size=BATCH,
        sanity=SanityConfig(samples=70),
    )


def _summary(result: object) -> dict[str, object]:
    doc = result.to_json()  # type: ignore[attr-defined]
    env = doc.pop("environment")
    doc.pop("elapsedSeconds")
    doc.pop("finishedAt")
    return {**doc, "worldSize": env["worldSize"], "backend": env["backend"]}


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    """One torchrun-like rank: the environment variables torchrun sets, then the public entry points."""
    torch.set_num_threads(1)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
        }
    )
    from safetensors.torch import load_file

    from modelsec.robustness import from_environment

    ctx = from_environment("cpu")
    assert (ctx.rank, ctx.world_size, ctx.backend) == (rank, world, "gloo")
    model = h.digits_models.digits_mlp()
    model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")))
    data = load_file(os.path.join(folder, "data.safetensors"))
    dataset = Dataset(data["inputs"], data["labels"], "cd" * 32, "digits", "loader")
    result = run_gate(model, dataset, _config(), dist=ctx)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(_summary(result), f)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = h.trained_mlp()
    _, _, x, y = h.digits()
    x, y = x[:N].contiguous(), y[:N].contiguous()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    save_file({"inputs": x, "labels": y}, str(tmp_path / "data.safetensors"))

    single = run_gate(
        model, Dataset(x, y, "cd" * 32, "digits", "loader"), _config(), dist=DistContext.single()
    )
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = _summary(single)
    assert expected["worldSize"] == 1
    for got in ranks:
        assert got["worldSize"] == 2 and got["backend"] == "gloo"
        assert {**got, "worldSize": 1, "backend": None} == expected
    assert 0 < single.robust.correct < single.clean.correct
