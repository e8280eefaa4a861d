"""Data-parallel evaluation on `torch.distributed`: one process per GPU (torchrun), or gloo on CPU.

The gate splits its fixed-size batches round-robin over ranks (rank `r` evaluates global batches `r`,
`r + W`, `r + 2W`, ...), writes per-example outcomes into a zero vector of length N, and sums the vectors
with one `all_reduce`. Each batch's random start is seeded from its *global* index
(`modelsec.robustness.pgd.batch_seed`), so on CPU a run on W processes gives exactly the per-example
outcomes, and therefore the counts, of a single process.

The same code runs unchanged as one process: `DistContext.single()` reduces nothing. Under `torchrun`
(`WORLD_SIZE` > 1 in the environment) `from_environment` initialises the default process group: NCCL
when the gate runs on CUDA, gloo otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from modelsec.errors import BackendUnavailableError, PolicyError

__all__ = ["DistContext", "from_environment"]


@dataclass(frozen=True, slots=True)
class DistContext:
    """Which slice of the work this process does.

    Attributes:
        rank: This process's rank, `0 <= rank < world_size`.
        world_size: Number of processes.
        backend: `gloo`, `nccl`, or None for a single process without a process group.
    """

    rank: int = 0
    world_size: int = 1
    backend: str | None = None

    @classmethod
    def single(cls) -> DistContext:
        """One process, no process group."""
        return cls()

    @classmethod
    def current(cls) -> DistContext:
        """The context of an already initialised default process group (or `single()` without one)."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
        return cls.single()

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the one that signs and prints)."""
        return self.rank == 0

    def batches(self, count: int) -> range:
        """The global batch indices this rank evaluates, out of `count`."""
        return range(self.rank, count, self.world_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over all ranks (in place semantics; returns the summed tensor on its device).

        NCCL reduces CUDA tensors; gloo reduces CPU tensors: the tensor is moved as the backend needs and
        moved back.
        """
        if self.world_size == 1 or self.backend is None:
            return tensor
        wire = tensor.cuda() if self.backend == "nccl" else tensor.cpu()
        dist.all_reduce(wire, op=dist.ReduceOp.SUM)
        return wire.to(tensor.device)

    def check_same(self, value: str, *, what: str) -> None:
        """Fail unless every rank passes the same `value` (dataset digest, configuration).

        Raises:
            PolicyError: Ranks disagree (they were started with different arguments or data).
        """
        if self.world_size == 1 or self.backend is None:
            return
        values: list[object] = [None] * self.world_size
        dist.all_gather_object(values, value)
        if any(v != value for v in values):
            raise PolicyError(f"ranks disagree on the {what}: {sorted({str(v) for v in values})}")


def from_environment(device: str) -> DistContext:
    """The context for this process: join the torchrun process group when `WORLD_SIZE` > 1.

    Args:
        device: `cpu` or `cuda`: selects gloo or NCCL when a process group must be created.

    Returns:
        The context (an existing process group is reused).

    Raises:
        BackendUnavailableError: The process group cannot be initialised (retryable: the rendezvous may be
            late).
    """
    if dist.is_available() and dist.is_initialized():
        return DistContext.current()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext.single()
    if not dist.is_available():
        raise BackendUnavailableError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        dist.init_process_group(backend=backend)
    except (RuntimeError, ValueError) as e:
        raise BackendUnavailableError(f"cannot join the {backend} process group: {e}") from e
    return DistContext.current()
