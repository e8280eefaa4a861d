"""RobustnessService over a real server: streamed progress, the result and its attestation, refusals, and
that cancelling the call (client cancel, SIGTERM of `modelsec serve`) stops the gate on the server.

The model is the digits MLP trained in-process (`tests.unit.robustness._helpers`), signed with the test
P-256 key; the dataset is 64 held-out digits. The server imports the architecture `digits_models:digits_mlp`
from examples/ (on sys.path for the in-thread server, on PYTHONPATH for the child process).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from modelsec.errors import PermissionDeniedError  # noqa: E402
from modelsec.policy import Policy, RobustnessRequirement  # noqa: E402
from modelsec.robustness import DistContext, GateConfig, run_pgd_gate  # noqa: E402
from modelsec.service.client import ChannelOptions, ModelsecClient  # noqa: E402
from modelsec.v1 import robustness_pb2  # noqa: E402
from modelsec.verifier import verify_attestations  # noqa: E402
from tests.support.service import InThreadServer, spawn_cli_server, write_server_config  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

ARCH = "digits_models:digits_mlp"
# Long enough that a run is still in its first pass seconds later (about 0.5 s per batch of 8 on one core).
LONG_STEPS = 2000


@dataclasses.dataclass
class Setup:
    root: Path
    model: Path
    data: Path
    config: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Setup:
    root = tmp_path_factory.mktemp("gate-service")
    model = h.signed_model_dir(
        root / "models" / "digits-mlp", h.trained_mlp().state_dict(), key_dir / "ecdsa-p256.key.pem"
    )
    _, _, x, y = h.digits()
    data = root / "models" / "digits-64.npz"
    np.savez(data, inputs=x[:64].numpy(), labels=y[:64].numpy())
    config = write_server_config(
        root / "server",
        key_dir,
        keys=[
            {"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem"), "allow": ["*"]},
            {
                "name": "weights-only",
                "path": str(key_dir / "ecdsa-p256.key.pem"),
                "roles": ["weights"],
                "allow": ["*"],
            },
        ],
        readRoots=[str(root / "models")],
        architectures=[ARCH],
        gracePeriod=1,
    )
    return Setup(root, model, data, config)


@pytest.fixture(scope="module")
def server(setup: Setup) -> Iterator[InThreadServer]:
    with InThreadServer(setup.config) as running:
        yield running


def _request(setup: Setup, **fields: Any) -> robustness_pb2.RunGateRequest:
    base: dict[str, Any] = {
        "model_path": str(setup.model),
        "architecture": ARCH,
        "data_path": str(setup.data),
        "eps": 0.03,
        "step_size": 0.0075,
        "steps": 10,
        "seed": 7,
        "min_robust_accuracy": 0.5,
        "min_samples": 50,
        "batch_size": 16,
    }
    return robustness_pb2.RunGateRequest(**{**base, **fields})


def _client(target: str) -> ModelsecClient:
    return ModelsecClient(target, ChannelOptions(plaintext=True, timeout=60))


def _gate_threads() -> list[str]:
    """Threads of this process whose stack is inside `run_pgd_gate` (the in-thread server's workers)."""
    frames = sys._current_frames()
    busy = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == "run_pgd_gate":
                busy.append(thread.name)
                break
            frame = frame.f_back
    return busy


def _wait_until(condition: Any, timeout: float) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_server_start_imports_neither_torch_nor_numpy(setup: Setup) -> None:
    """Both servicers are registered at start; torch and numpy load with the first gate or watermark call."""
    code = (
        "import asyncio, json, sys\n"
        "from pathlib import Path\n"
        "from modelsec.service.config import load_server_config\n"
        "from modelsec.service.server import SERVICES, start_server\n"
        "async def main():\n"
        "    running = await start_server(load_server_config(Path(sys.argv[1])))\n"
        "    await running.stop(0)\n"
        "asyncio.run(main())\n"
        "print(json.dumps({'services': sorted(SERVICES), 'loaded': [m for m in ('torch', 'numpy') "
        "if m in sys.modules]}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(setup.config)], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"modelsec.v1.RobustnessService", "modelsec.v1.WatermarkService"} <= set(doc["services"])
    assert doc["loaded"] == []


def test_run_streams_progress_then_the_python_api_result(
    setup: Setup, server: InThreadServer, key_dir: Path
) -> None:
    with _client(server.target) as c:
        events = list(c.run_gate(_request(setup, attestation_key_version="ci-p256/1")))
    *progress, last = events
    assert last.WhichOneof("event") == "result"
    assert progress and all(e.WhichOneof("event") == "progress" for e in progress)
    stages = [e.progress.stage for e in progress]
    assert stages[0] == "PGD eps=0.03" and "sanity: FGSM" in stages
    assert all(0 <= e.progress.done <= e.progress.total == 64 for e in progress)
    assert any(e.progress.done == 64 for e in progress if e.progress.stage == "PGD eps=0.03")

    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    local = run_pgd_gate(
        setup.model,
        policy=policy,
        architecture=ARCH,
        data=setup.data,
        config=GateConfig(
            eps=0.03,
            step_size=0.0075,
            steps=10,
            seed=7,
            min_robust_accuracy=0.5,
            min_samples=50,
            batch_size=16,
        ),
        dist=DistContext.single(),
    )
    got = last.result
    assert got.verdict == local.result.verdict == "PASSED"
    assert got.root_digest == local.root_digest and got.samples == 64
    assert got.clean_accuracy == local.result.clean.accuracy
    assert got.robust_accuracy == local.result.robust.accuracy  # same seed, same CPU arithmetic
    assert (got.robust_accuracy_lower, got.robust_accuracy_upper) == local.result.robust.wilson95
    assert got.robust_accuracy_lower < got.robust_accuracy <= got.robust_accuracy_upper

    requiring = dataclasses.replace(
        policy, robustness=RobustnessRequirement(min_eps=0.03, min_robust_accuracy=0.5, min_samples=50)
    )
    verdict = verify_attestations(got.root_digest, [got.attestation], requiring, require_signatures=False)
    assert verdict.ok and [e.kind for e in verdict.evidence] == ["robustness"], verdict


def test_a_failed_verdict_is_a_result_not_an_error(setup: Setup, server: InThreadServer) -> None:
    with _client(server.target) as c:
        *_, last = c.run_gate(_request(setup, min_robust_accuracy=0.99, rule="strict"))
    assert last.result.verdict == "FAILED" and last.result.attestation == b""
    assert last.result.robust_accuracy_lower < 0.99
    assert any("0.99" in r for r in last.result.reasons), last.result.reasons


def test_refusals(setup: Setup, server: InThreadServer) -> None:
    with _client(server.target) as c:
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*allow-list"):
            list(c.run_gate(_request(setup, architecture="digits_models:digits_cnn")))
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*outside"):
            list(c.run_gate(_request(setup, data_path=str(setup.root / "server" / "server.yaml"))))
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*weights-only/1.*gate"):
            list(c.run_gate(_request(setup, attestation_key_version="weights-only/1")))
        with pytest.raises(grpc.RpcError) as e:
            list(c.robustness.RunGate(_request(setup, steps=0), timeout=60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "steps must be >= 1" in e.value.details()
    assert not _gate_threads()


def test_client_cancel_stops_the_gate_on_the_server(setup: Setup, server: InThreadServer) -> None:
    with _client(server.target) as c:
        call = c.robustness.RunGate(_request(setup, steps=LONG_STEPS, batch_size=8), timeout=120)
        first = next(call)
        assert first.WhichOneof("event") == "progress"
        assert _gate_threads(), "the gate should be running on the server now"
        call.cancel()
        with pytest.raises(grpc.RpcError) as e:
            next(call)
    assert e.value.code() == grpc.StatusCode.CANCELLED
    # The worker stops at its next batch (about half a second here), not after the remaining passes.
    assert _wait_until(lambda: not _gate_threads(), timeout=8) < 8


@pytest.mark.slow
def test_sigterm_during_a_gate_run_ends_the_call_and_the_process(setup: Setup) -> None:
    child = spawn_cli_server(setup.config, env={"PYTHONPATH": str(h.EXAMPLES), "OMP_NUM_THREADS": "1"})
    try:
        channel = grpc.insecure_channel(child.target)
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=60
        )
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        with _client(child.target) as c:
            call = c.robustness.RunGate(_request(setup, steps=LONG_STEPS, batch_size=8), timeout=120)
            assert next(call).WhichOneof("event") == "progress"
            started = time.monotonic()
            child.process.send_signal(signal.SIGTERM)
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as e:
                for _ in call:
                    pass
            ended = time.monotonic() - started
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e.value
        assert ended < 1 + 5  # the grace period, then cancelled
        code = child.process.wait(timeout=15)
        exited = time.monotonic() - started
        channel.close()
        _, err = child.terminate()
    finally:
        if child.process.poll() is None:
            child.process.kill()
    assert code == 0, err[-2000:]
    assert exited < 1 + 8, f"exited {exited:.1f} s after SIGTERM"
    assert '"event":"shutdown"' in err


def test_gate_runs_take_turns(setup: Setup, server: InThreadServer) -> None:
    """With maxConcurrentGates 1 (the default) a second run starts only after the first has finished."""
    events: dict[str, list[tuple[float, str]]] = {"a": [], "b": []}

    def run(name: str) -> None:
        with _client(server.target) as c:
            for message in c.run_gate(_request(setup)):
                events[name].append((time.monotonic(), message.WhichOneof("event") or ""))

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(120)
    assert events["a"][-1][1] == "result" and events["b"][-1][1] == "result"
    first, second = sorted(events.values(), key=lambda e: e[0][0])
    assert second[0][0] >= first[-1][0], "the second run streamed before the first finished"


def test_the_attestation_can_go_straight_into_the_store(setup: Setup, server: InThreadServer) -> None:
    """store_attestation: a PASSED gate lands in the store the webhook reads; a FAILED one does not."""
    from modelsec.errors import MalformedArtifactError

    with _client(server.target) as c:
        *_, passed = c.run_gate(_request(setup, attestation_key_version="ci-p256/1", store_attestation=True))
        result = passed.result
        assert result.verdict == "PASSED" and result.stored_attestation_id and not result.not_stored_reason
        stored = {r.attestation.id: r.bundle for r in c.get_attestations(result.root_digest)}
        assert result.stored_attestation_id in stored
        *_, failed = c.run_gate(
            _request(
                setup,
                min_robust_accuracy=0.99,
                rule="strict",
                attestation_key_version="ci-p256/1",
                store_attestation=True,
            )
        )
        assert failed.result.verdict == "FAILED" and failed.result.attestation
        assert not failed.result.stored_attestation_id and "FAILED" in failed.result.not_stored_reason
        assert len(c.get_attestations(result.root_digest)) == len(stored)
        with pytest.raises(MalformedArtifactError, match="store_attestation needs attestation_key_version"):
            list(c.run_gate(_request(setup, store_attestation=True)))
