"""`modelsec.v1.RobustnessService`: PGD robustness gates on server-side models, with streamed progress.

`RunGate` is `modelsec gate pgd` behind an RPC: the model is verified under every policy matching its path
(`modelsec.verifier.admission.admit_model`) before any weight is loaded, the architecture comes from the
server's allow-list (`architectures`), never from the request alone, and the result is signed with a
server-held key holding the `gate` role and the `gateResult` operation when the caller asks for an
attestation. The statement is built
here from this run's own result, and records who ran it (`runBy`: this server's `serverIdentity` and the
caller's identity) next to the caller's choices (dataset digest, steps, restarts, eps), which a policy then
judges (`minSteps`, `minRestarts`, `datasetDigests`, `requireServerRun`). A FAILED verdict is a result, not
an RPC error.

Threads and cancellation: the gate runs in a worker thread (`run_blocking`). Its progress sink hands events
to the event loop (`call_soon_threadsafe`) and, at every pass and batch, stops the run with
`CancelledWorkError` once the call is gone (client cancel, deadline, server shutdown), so the worker ends at
the next batch. Progress is sent at most once per `PROGRESS_INTERVAL` seconds within a pass, plus each
pass's first and last event. Model verification and loading have no progress hook: a call cancelled then is
noticed when the first pass starts.

torch loads inside `RunGate`, so constructing the servicer at server start does not import it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from grpc import aio

from modelsec.errors import PermissionDeniedError
from modelsec.robustness import PREDICATE_TYPE
from modelsec.service.attestation import store_produced, storer_for
from modelsec.service.state import ServiceState
from modelsec.service.work import CancelledWorkError, Check, run_blocking
from modelsec.v1 import robustness_pb2, robustness_pb2_grpc
from modelsec.verifier.admission import admit_model

if TYPE_CHECKING:
    from modelsec.robustness.gate import GateConfig
    from modelsec.robustness.pipeline import GateOutcome

__all__ = ["PROGRESS_INTERVAL", "RobustnessServicer", "gate_config", "result_to_proto"]

PROGRESS_INTERVAL = 0.1  # seconds: at most ~10 progress messages a second within a pass


class _StreamProgress:
    """A `GateProgress` that forwards events to the call's queue and stops the run once the call is gone.

    Runs in the worker thread; `stop` raises `CancelledWorkError` when the run must end.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[robustness_pb2.GateProgress],
        stop: Callable[[], None],
    ) -> None:
        self._loop, self._queue, self._stop = loop, queue, stop
        self._stage, self._done, self._total, self._sent = "", 0, 0, 0.0

    def start(self, description: str, total: int) -> None:
        self._stop()
        self._stage, self._done, self._total = description, 0, total
        self._send()

    def advance(self, n: int) -> None:
        self._stop()
        self._done += n
        if self._done >= self._total or time.monotonic() - self._sent >= PROGRESS_INTERVAL:
            self._send()

    def _send(self) -> None:
        self._sent = time.monotonic()
        event = robustness_pb2.GateProgress(stage=self._stage, done=self._done, total=self._total)
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            raise CancelledWorkError("the server is stopping; gate run stopped") from None


class RobustnessServicer(robustness_pb2_grpc.RobustnessServiceServicer):
    """RunGate over models and datasets under the read roots (access op `robustness`)."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        # Gate runs are long and CPU/GPU-bound: at most `maxConcurrentGates` at a time, so they cannot take
        # every worker thread from the short RPCs (VerifyModel, watermark). Others wait for a slot (or
        # their deadline).
        self._slots = asyncio.Semaphore(state.config.max_concurrent_gates)

    async def RunGate(
        self, request: robustness_pb2.RunGateRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[robustness_pb2.RunGateResponse]:
        """Verify the model, run the PGD gate, stream progress, then send the result.

        Checks, before any file is read: access, the architecture allow-list, both paths, the policy for
        the model, the signing key (its `allow` list, `gate` role and `gateResult` operation) and the gate
        configuration.

        Raises:
            PermissionDeniedError: No `robustness` access, an architecture not in the allow-list, a path
                outside the read roots, or a signing key without the `gate` role or `gateResult` operation.
            NotFoundError: No such signing key version.
            PolicyError: An invalid gate configuration, or an architecture that does not fit the weights
                (INVALID_ARGUMENT).
            VerificationError: The model must not be trusted (nothing was evaluated; FAILED_PRECONDITION).
            CancelledWorkError: The call ended; the worker stops at its next batch.
        """
        caller = self.state.require("robustness")
        storer = storer_for(self.state, request.store_attestation, request.attestation_key_version)
        if request.architecture not in self.state.config.architectures:
            raise PermissionDeniedError(
                f"architecture {request.architecture[:200]!r} is not in the server's allow-list "
                f"(architectures in {self.state.config.source})"
            )
        model_dir = self.state.readable_path(request.model_path, "model_path")
        data = self.state.readable_path(request.data_path, "data_path")
        policy = admit_model(model_dir.path, self.state.policies)
        key = (
            self.state.signing_key_for(request.attestation_key_version, PREDICATE_TYPE, "gateResult")
            if request.attestation_key_version
            else None
        )
        run_by = self.state.run_by()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[robustness_pb2.GateProgress] = asyncio.Queue()

        def work(stop: Check) -> GateOutcome:
            # Imported here, not on the event loop: the first import of torch takes seconds.
            from modelsec.robustness.distributed import DistContext
            from modelsec.robustness.pipeline import run_pgd_gate

            config = gate_config(request)
            stop()
            # A server never joins a torchrun process group, whatever its environment says. Both paths are
            # opened beneath their root (no link followed) and used through those descriptors.
            with model_dir.opened() as model_path, data.opened() as data_path:
                return run_pgd_gate(
                    model_path,
                    policy=policy,
                    architecture=request.architecture,
                    data=data_path,
                    config=config,
                    signer=key.backend if key is not None else None,
                    run_by=run_by,
                    progress=_StreamProgress(loop, queue, stop),
                    dist=DistContext.single(),
                )

        await self._slots.acquire()
        task = asyncio.ensure_future(run_blocking(work, context))
        waiting: asyncio.Future[robustness_pb2.GateProgress] | None = None
        try:
            while True:
                waiting = asyncio.ensure_future(queue.get())
                await asyncio.wait((waiting, task), return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    break
                yield robustness_pb2.RunGateResponse(progress=waiting.result())
            # Events the worker queued before it returned are already in the queue (call_soon_threadsafe
            # keeps their order); send them before the result.
            while not queue.empty():
                yield robustness_pb2.RunGateResponse(progress=queue.get_nowait())
            outcome = task.result()
        finally:
            if waiting is not None:
                waiting.cancel()
            task.cancel()  # no-op when finished; otherwise run_blocking sets the worker's cancelled event
            self._slots.release()
        result = result_to_proto(outcome)
        if key is not None and outcome.bundle:
            self.state.record_signed_bundle(key, outcome.bundle, "RunGate", caller)
        if storer is not None and outcome.bundle:
            result.stored_attestation_id, result.not_stored_reason = store_produced(
                self.state, outcome.bundle, storer
            )
        yield robustness_pb2.RunGateResponse(result=result)


def gate_config(request: robustness_pb2.RunGateRequest) -> GateConfig:
    """The gate configuration of a request, proto3 zero values meaning the documented defaults.

    `clip_min = clip_max = 0` -> `(0, 1)`; `rule ""` -> `point`; `restarts 0` -> 1; `min_samples 0`,
    `batch_size 0` -> `GateConfig`'s defaults; `device ""` -> `cpu`; `step_size 0` -> `default_step_size`
    (Madry et al. 2018, as the CLI). `steps` has no default: 0 is refused. Sanity checks always run.

    Raises:
        PolicyError: Invalid values (`GateConfig` names each one).
    """
    from modelsec.robustness.gate_config import GateConfig, default_step_size

    defaults: dict[str, Any] = {}
    if request.min_samples:
        defaults["min_samples"] = request.min_samples
    if request.batch_size:
        defaults["batch_size"] = request.batch_size
    both_zero = request.clip_min == 0 and request.clip_max == 0
    return GateConfig(
        eps=request.eps,
        step_size=request.step_size or default_step_size(request.eps, request.steps),
        steps=request.steps,
        min_robust_accuracy=request.min_robust_accuracy,
        restarts=request.restarts or 1,
        seed=request.seed,
        rule=request.rule or "point",
        clip=(0.0, 1.0) if both_zero else (request.clip_min, request.clip_max),
        device=request.device or "cpu",
        **defaults,
    )


def result_to_proto(outcome: GateOutcome) -> robustness_pb2.GateResult:
    """A gate outcome -> `GateResult` (verdict, counts, accuracies, Wilson interval, digest, bundle)."""
    result = outcome.result
    lower, upper = result.robust.wilson95
    return robustness_pb2.GateResult(
        verdict=result.verdict,
        root_digest=outcome.root_digest,
        samples=result.robust.total,
        clean_accuracy=result.clean.accuracy,
        robust_accuracy=result.robust.accuracy,
        robust_accuracy_lower=lower,
        robust_accuracy_upper=upper,
        attestation=outcome.bundle or b"",
        reasons=result.reasons,
    )
