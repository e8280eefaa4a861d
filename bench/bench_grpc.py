"""gRPC service under load: SignStatement (P-256, SM2) and VerifyBundle requests/s, p50/p99 (issue 7).

Usage: python bench/bench_grpc.py [--quick] [--duration 30] [--concurrency 1,8,64] [--client aio|threads]
[--auth token|anonymous] [--log-level warning|info] [--sm2-backend openssl] [--keep]

Set-up (a temporary directory): an ECDSA P-256 and an SM2 key pair made by the real CLI (`modelsec keygen
-a ecdsa-p256` / `-a sm2`), a tiny transformer-like safetensors model (`safetensors.numpy.save_file`, 14
tensors, plus `config.json`), and its OMS weights manifests from `compute_manifests` (SHA-256 for the P-256
key, SM3 for the SM2 key, per-tensor BLAKE3 as `modelsec sign` does by default) turned into the exact
statement bytes a client sends (`manifest_statement` + `serialize_statement`). A ModelPolicy trusts both
public keys and requires `ecdsa-p256`; a ServerConfig holds both private keys as `bench-p256/1` and
`bench-sm2/1`, usable only by the identity `bench`.

The server is `modelsec serve --config ... --log-level warning` (`--log-level`) as a child process:
plaintext on a free 127.0.0.1 port, with the metrics side port on. Authentication is a bearer token
(`--auth token`, the default: every call carries `authorization: Bearer ...`, the server hashes it and
checks the key's `allow` list), or none (`--auth anonymous`: `allowAnonymous: true`). At `warning` the
interceptor writes no per-RPC JSON log line; the Prometheus counters and histograms are still updated on
every call. The child gets `MODELSEC_SM2_BACKEND=<--sm2-backend>` (default `openssl`, which the issue's
SM2 target names), so a missing OpenSSL SM2 fails the SM2 case instead of silently measuring another
backend.

The cases, each at every `--concurrency` level for `--duration` seconds (`--quick`: 3 s):

* `SignStatement p256`: the SHA-256 manifest statement, key `bench-p256/1`;
* `SignStatement sm2`: the SM3 manifest statement, key `bench-sm2/1`;
* `VerifyBundle p256`: one P-256 bundle about the model's root digest (signed by the server in the warm-up,
  so it is the service's own output), default policy, `require_signatures: true`; the verdict must be ok.

Load comes from a separate process (a `multiprocessing` spawn child). `--client aio` (the default; it
loaded the server most on 2 cores, see bench/README.md): one `grpc.aio` event loop, N coroutines, each with
its own channel (`grpc.use_local_subchannel_pool`, so N HTTP/2 connections, as N CI jobs would open) and at
most one call in flight. `--client threads`: N threads with blocking stubs, one channel each. Closed loop:
a client sends its next request when the previous answer arrived; latency is send-to-answer as the client
sees it (on a shared 2-core machine that includes waiting for the client's own event loop). An error is
any RPC failure, a SignStatement answer without a bundle or with another key version, or a VerifyBundle
verdict that is not ok. Afterwards the parent checks a few returned bundles: each verifies under the
policy's keys and carries exactly the statement bytes that were sent; and the server's own Prometheus
counters must show no status other than OK.

Per case the table shows requests/s, p50/p99/max latency, errors, and the CPU time of the server process
(all its threads, from /proc/PID/stat, over exactly the timed window) as cores busy and as microseconds per
request, and the client process's CPU per request. The server runs its servicers on one event loop, so
`srv cores` near 1 means it is saturated and req/s is about 1e6 / `srv us/req`; that figure also holds up
when other jobs share the cores and req/s does not.

Reference (same run, this process, one thread, median of 3): `sign_statement()` calls/s for the same
statement and key, the servicer's work without gRPC (`parse_statement` + `parse_manifest` +
`sign_statement`), the statement parse alone, and `verify_attestations` (VerifyBundle's work). The
`of local` column divides the service rate by the matching in-process rate.

Targets (issue 7, judged at 8 clients): ECDSA SignStatement >= 1,000 requests/s with p99 <= 20 ms; SM2
SignStatement >= 500 requests/s. A missed target is reported (MISSED) but does not change the exit status.

Exit status: 1 if any request failed or a check failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_common.py, from wherever this runs
from _common import (
    console_script,
    cpu_pressure,
    load_average,
    machine_lines,
    ops_per_second,
    percentile,
    render_table,
)

HOST = "127.0.0.1"
MODELSEC = console_script("modelsec") or "modelsec"
IDENTITY = "bench"
KEY_VERSIONS = {"p256": "bench-p256/1", "sm2": "bench-sm2/1"}
SIGN_METHOD = "/modelsec.v1.SigningService/SignStatement"
VERIFY_METHOD = "/modelsec.v1.VerificationService/VerifyBundle"
TARGET_CLIENTS = 8
CALL_TIMEOUT = 10.0
SAMPLES_PER_CASE = 3  # returned bundles checked by the parent after each SignStatement case


# --------------------------------------------------------------------------------------------------------
# Set-up: keys (CLI), tiny model, manifest statements, policy, server configuration


def _write_tiny_model(model: Path, layers: int = 2) -> None:
    """A transformer-like model (hidden 32) with `layers` blocks: 6 * layers + 2 tensors (14 by default)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    h, vocab = 32, 256
    tensors: dict[str, Any] = {"model.embed_tokens.weight": rng.standard_normal((vocab, h))}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": np.ones((h,)),
            p + "self_attn.qkv_proj.weight": rng.standard_normal((3 * h, h)),
            p + "self_attn.o_proj.weight": rng.standard_normal((h, h)),
            p + "post_attention_layernorm.weight": np.ones((h,)),
            p + "mlp.up_proj.weight": rng.standard_normal((4 * h, h)),
            p + "mlp.down_proj.weight": rng.standard_normal((h, 4 * h)),
        }
    tensors["model.norm.weight"] = np.ones((h,))
    tensors = {k: v.astype(np.float32 if v.ndim == 1 else np.float16) for k, v in sorted(tensors.items())}
    model.mkdir(parents=True)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    config = {"model_type": "llama", "hidden_size": h, "num_hidden_layers": layers, "vocab_size": vocab}
    (model / "config.json").write_text(json.dumps(config, indent=2) + "\n")


@dataclass
class Setup:
    root: Path
    config: Path
    policy: Path
    token: str | None
    statements: dict[str, bytes]  # "p256" -> SHA-256 manifest statement, "sm2" -> SM3 manifest statement
    root_digest: str
    files: int
    tensors: int


def make_setup(root: Path, auth: str, layers: int = 2) -> Setup:
    """Keys, model, statements, policy and server configuration under `root`."""
    from modelsec.algorithms import HashAlgorithm
    from modelsec.attestations.predicates.oms import manifest_statement
    from modelsec.attestations.statement import serialize_statement
    from modelsec.signer.layout import MODEL_IGNORE_PATHS
    from modelsec.signer.signing import compute_manifests

    keys = root / "keys"
    keys.mkdir()
    for algorithm in ("ecdsa-p256", "sm2"):
        out = subprocess.run(
            [
                console_script("modelsec") or "modelsec",
                "keygen",
                "-a",
                algorithm,
                "-o",
                str(keys / algorithm),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"modelsec keygen -a {algorithm}: exit {out.returncode}: {out.stderr.strip()}")
    model = root / "model"
    _write_tiny_model(model, layers)
    manifests = compute_manifests(
        model, [HashAlgorithm.SHA256, HashAlgorithm.SM3], ignore_paths=MODEL_IGNORE_PATHS
    )
    sha = manifests[HashAlgorithm.SHA256]
    statements = {
        "p256": serialize_statement(manifest_statement(sha)),
        "sm2": serialize_statement(manifest_statement(manifests[HashAlgorithm.SM3])),
    }
    policy = root / "policy.json"
    policy_doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "bench",
                "match": ["file:///**"],
                "keys": ["keys/ecdsa-p256.pub.pem", "keys/sm2.pub.pem"],
                "requireAlgorithms": ["ecdsa-p256"],
            }
        ],
        "noMatch": "deny",
    }
    policy.write_text(json.dumps(policy_doc, indent=2) + "\n")
    token = secrets.token_urlsafe(32) if auth == "token" else None
    config_doc: dict[str, Any] = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ServerConfig",
        "listen": f"{HOST}:0",
        "metricsListen": f"{HOST}:0",
        "dataDir": "data",
        "policy": "policy.json",
        "keys": [
            {"name": "bench-p256", "path": "keys/ecdsa-p256.key.pem", "allow": [IDENTITY]},
            {"name": "bench-sm2", "path": "keys/sm2.key.pem", "allow": [IDENTITY]},
        ],
        "gracePeriod": 5,
    }
    if token is None:
        config_doc["allowAnonymous"] = True
        for k in config_doc["keys"]:
            k["allow"] = ["anonymous"]
    else:
        config_doc["tokens"] = [{"identity": IDENTITY, "sha256": hashlib.sha256(token.encode()).hexdigest()}]
    config = root / "server.json"
    config.write_text(json.dumps(config_doc, indent=2) + "\n")
    return Setup(
        root,
        config,
        policy,
        token,
        statements,
        sha.subject_digest["sha256"],
        len(sha.resources),
        sum(len(t) for t in sha.tensors.values()),
    )


# --------------------------------------------------------------------------------------------------------
# The server subprocess


@dataclass
class Server:
    pid: int
    port: int
    metrics_port: int

    @property
    def target(self) -> str:
        return f"{HOST}:{self.port}"


@contextlib.contextmanager
def running_server(
    setup: Setup, log: Path, args: argparse.Namespace, outcome: list[str], workers: int = 1
) -> Iterator[Server]:
    """`modelsec serve` on a free loopback port, up once it prints its `serving ...` line; SIGTERM at exit.

    `outcome` receives a problem description if the server does not exit 0 after SIGTERM.
    """
    argv = [
        console_script("modelsec") or "modelsec",
        "serve",
        "--config",
        str(setup.config),
        "--log-level",
        args.log_level,
    ]
    env = {**os.environ, "MODELSEC_SM2_BACKEND": args.sm2_backend, "MODELSEC_SERVE_WORKERS": str(workers)}
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env, cwd=setup.root
        )
    stdout = proc.stdout
    if stdout is None:  # never: stdout=PIPE
        raise RuntimeError("no stdout pipe to the server")
    try:
        ready, _, _ = select.select([stdout], [], [], 60)
        line = stdout.readline().decode(errors="replace") if ready else ""
        m = re.search(r"serving modelsec\.v1 on \S+:(\d+) \(metrics on \S+:(\d+)\)", line)
        if not m:
            proc.kill()
            proc.wait()
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"modelsec serve did not start ({line.strip()!r}): " + " | ".join(tail))
        yield Server(proc.pid, int(m.group(1)), int(m.group(2)))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stdout.close()
        if proc.returncode != 0:
            outcome.append(f"modelsec serve exited {proc.returncode} after SIGTERM (see {log.name})")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) and its live children (`--workers`)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is the state (field 3)
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return own + sum(process_cpu_seconds(int(k)) for k in kids if Path(f"/proc/{k}").exists())


def server_codes(metrics_port: int) -> dict[tuple[str, str], float]:
    """The server's `modelsec_grpc_requests_total` counters by (method, code), from its /metrics port."""
    with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    counts: dict[tuple[str, str], float] = {}
    pattern = re.compile(r"^modelsec_grpc_requests_total\{(.*)\} (\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            counts[(labels.get("method", ""), labels.get("code", ""))] = float(m.group(2))
    return counts


# --------------------------------------------------------------------------------------------------------
# The load generator (runs in a separate process)


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)  # seconds, good answers only
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    bundles: list[bytes] = field(default_factory=list)  # a few SignStatement answers, checked by the parent
    elapsed: float = 0.0
    client_cpu: float = 0.0  # CPU seconds of the load process over the timed window
    server_cpu: float = 0.0  # CPU seconds of the server process over the timed window


@dataclass(frozen=True)
class Job:
    """What one load run sends (plain values: it crosses to the spawn child by pickle)."""

    target: str
    token: str | None
    method: str  # SIGN_METHOD or VERIFY_METHOD
    request: bytes  # the serialized request message
    key_version: str  # SignStatement: the key version the answer must name
    clients: int
    seconds: float
    server_pid: int


class _Checker:
    """Request message, answer check, and the shared result of one run."""

    def __init__(self, job: Job) -> None:
        from modelsec.v1 import signing_pb2, verification_pb2

        self.job = job
        self.sign = job.method == SIGN_METHOD
        kind: Any = signing_pb2.SignStatementRequest if self.sign else verification_pb2.VerifyBundleRequest
        self.request = kind.FromString(job.request)
        self.metadata = (("authorization", f"Bearer {job.token}"),) if job.token else ()
        self.result = LoadResult()
        self.lock = threading.Lock()

    def problem(self, answer: Any) -> str | None:
        """None for a good answer, else what is wrong with it."""
        if self.sign:
            if not answer.bundle:
                return "SignStatement answer without a bundle"
            if answer.key.name != self.job.key_version:
                return f"SignStatement answered with key {answer.key.name!r}"
            if len(self.result.bundles) < SAMPLES_PER_CASE:
                with self.lock:
                    self.result.bundles.append(answer.bundle)
            return None
        if not answer.verdict.ok:
            v = answer.verdict
            return f"verdict not ok: missing {list(v.missing)}, refused {list(v.refused)}, " + (
                f"ignored {list(v.ignored)}"
            )
        return None

    def fail(self, message: str) -> None:
        with self.lock:
            self.result.errors += 1
            if len(self.result.error_samples) < 5:
                self.result.error_samples.append(message)


def _describe(e: BaseException) -> str:
    import grpc

    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"


def _channel_options() -> list[tuple[str, Any]]:
    # One HTTP/2 connection per client, as separate CI jobs would have (gRPC otherwise shares a subchannel
    # between channels with the same target and arguments).
    return [("grpc.use_local_subchannel_pool", 1)]


def _stub_method(channel: Any, job: Job) -> Any:
    from modelsec.v1 import signing_pb2_grpc, verification_pb2_grpc

    if job.method == SIGN_METHOD:
        return signing_pb2_grpc.SigningServiceStub(channel).SignStatement
    return verification_pb2_grpc.VerificationServiceStub(channel).VerifyBundle


async def _drive_aio(job: Job) -> LoadResult:
    from grpc import aio

    check = _Checker(job)
    channels = [aio.insecure_channel(job.target, options=_channel_options()) for _ in range(job.clients)]
    calls = [_stub_method(ch, job) for ch in channels]
    latencies: list[list[float]] = [[] for _ in range(job.clients)]

    async def one(index: int) -> str | None:
        answer = await calls[index](check.request, metadata=check.metadata, timeout=CALL_TIMEOUT)
        return check.problem(answer)

    async def warm(index: int) -> None:  # connection set-up and a first call, not timed
        try:
            problem = await one(index)
        except Exception as e:  # noqa: BLE001 - every failure is counted
            problem = _describe(e)
        if problem:
            check.fail("warm-up: " + problem)

    async def worker(index: int, end: float) -> None:
        own = latencies[index]
        while (sent := time.perf_counter()) < end:
            try:
                problem = await one(index)
            except Exception as e:  # noqa: BLE001 - every failure is counted
                problem = _describe(e)
            if problem:
                check.fail(problem)
            else:
                own.append(time.perf_counter() - sent)

    try:
        await asyncio.gather(*(warm(i) for i in range(job.clients)))
        cpu0, srv0 = time.process_time(), process_cpu_seconds(job.server_pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i, t0 + job.seconds) for i in range(job.clients)))
        check.result.elapsed = time.perf_counter() - t0
        check.result.client_cpu = time.process_time() - cpu0
        check.result.server_cpu = process_cpu_seconds(job.server_pid) - srv0
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    for own in latencies:
        check.result.latencies.extend(own)
    return check.result


def _drive_threads(job: Job) -> LoadResult:
    import grpc

    check = _Checker(job)
    barrier = threading.Barrier(job.clients + 1, timeout=120)  # a stuck client breaks, never hangs
    start = [0.0]

    def worker() -> None:
        latencies: list[float] = []
        with grpc.insecure_channel(job.target, options=_channel_options()) as channel:
            call = _stub_method(channel, job)

            def one() -> str | None:
                answer = call(check.request, metadata=check.metadata, timeout=CALL_TIMEOUT)
                return check.problem(answer)

            try:
                problem = one()  # connection set-up and a first call, not timed
            except Exception as e:  # noqa: BLE001 - every failure is counted
                problem = _describe(e)
            if problem:
                check.fail("warm-up: " + problem)
            barrier.wait()
            end = start[0] + job.seconds
            while (sent := time.perf_counter()) < end:
                try:
                    problem = one()
                except Exception as e:  # noqa: BLE001 - every failure is counted
                    problem = _describe(e)
                if problem:
                    check.fail(problem)
                else:
                    latencies.append(time.perf_counter() - sent)
        with check.lock:
            check.result.latencies.extend(latencies)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(job.clients)]
    for t in threads:
        t.start()
    start[0] = time.perf_counter() + 0.01
    barrier.wait()
    cpu0, srv0 = time.process_time(), process_cpu_seconds(job.server_pid)
    for t in threads:
        t.join()
    check.result.elapsed = time.perf_counter() - start[0]
    check.result.client_cpu = time.process_time() - cpu0
    check.result.server_cpu = process_cpu_seconds(job.server_pid) - srv0
    return check.result


def drive(job: Job, client: str) -> LoadResult:
    """Run one closed-loop load case from this (child) process; see the module docstring."""
    if client == "aio":
        return asyncio.run(_drive_aio(job))
    return _drive_threads(job)


# --------------------------------------------------------------------------------------------------------
# In-process reference rates


@dataclass
class Reference:
    name: str
    rate: float  # calls/s, one thread


def reference_rates(setup: Setup, seconds: float) -> dict[str, Reference]:
    """Calls/s of the in-process work behind each RPC, for the same statements and keys."""
    from modelsec.attestations.bundle import sign_payload, sign_statement
    from modelsec.attestations.predicates.oms import parse_manifest
    from modelsec.attestations.statement import parse_statement
    from modelsec.limits import Limits
    from modelsec.policy import PolicySet
    from modelsec.signer import load_private_key_file
    from modelsec.signer.keys import KeyBackend
    from modelsec.verifier import verify_attestations

    keys = {
        "p256": load_private_key_file(setup.root / "keys" / "ecdsa-p256.key.pem"),
        "sm2": load_private_key_file(setup.root / "keys" / "sm2.key.pem"),
    }
    limits = Limits()

    def servicer_work(raw: bytes, key: KeyBackend) -> bytes:  # what SigningServicer.SignStatement does
        parsed = parse_statement(raw, what="statement")
        parse_manifest(parsed, what="statement", limits=limits)
        return sign_payload(raw, key)

    refs: dict[str, Reference] = {}
    for alg, key in keys.items():
        raw = setup.statements[alg]
        statement = parse_statement(raw, what="statement")
        refs[f"sign {alg}"] = Reference(
            f"sign_statement(), {alg}", ops_per_second(partial(sign_statement, statement, key), seconds)
        )
        refs[f"servicer {alg}"] = Reference(
            f"parse_statement + parse_manifest + sign_payload, {alg}",
            ops_per_second(partial(servicer_work, raw, key), seconds),
        )
    raw = setup.statements["p256"]
    refs["parse"] = Reference(
        "parse_statement + parse_manifest (no signature), p256",
        ops_per_second(
            lambda: parse_manifest(parse_statement(raw, what="s"), what="s", limits=limits), seconds
        ),
    )
    policy = PolicySet.from_file(setup.policy).policies[0]
    bundle = sign_statement(parse_statement(raw, what="statement"), keys["p256"])
    verdict = verify_attestations(setup.root_digest, [bundle], policy, require_signatures=True)
    if not verdict.ok:
        raise RuntimeError(f"the reference bundle does not verify: {verdict}")
    refs["verify"] = Reference(
        "verify_attestations(require_signatures=True), 1 p256 bundle",
        ops_per_second(
            lambda: verify_attestations(setup.root_digest, [bundle], policy, require_signatures=True),
            seconds,
        ),
    )
    return refs


# --------------------------------------------------------------------------------------------------------
# Main


@dataclass
class Row:
    case: str
    clients: int
    result: LoadResult
    local: float  # in-process calls/s of the matching reference

    @property
    def rate(self) -> float:
        r = self.result
        return len(r.latencies) / r.elapsed if r.elapsed > 0 else float("nan")

    def cells(self) -> list[str]:
        lat = sorted(self.result.latencies)
        n = max(1, len(lat))
        r = self.result
        return [
            self.case,
            str(self.clients),
            str(len(lat)),
            f"{self.rate:,.0f}",
            f"{percentile(lat, 50) * 1000:.2f}",
            f"{percentile(lat, 99) * 1000:.2f}",
            f"{(lat[-1] if lat else float('nan')) * 1000:.1f}",
            str(r.errors),
            f"{r.server_cpu / r.elapsed:.2f}" if r.elapsed > 0 else "n/a",
            f"{r.server_cpu / n * 1e6:,.0f}",
            f"{r.client_cpu / n * 1e6:,.0f}",
            f"{self.rate / self.local:.2f}",
        ]


HEADER = [
    "case",
    "clients",
    "requests",
    "req/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "errors",
    "srv cores",
    "srv us/req",
    "cli us/req",
    "of local",
]


def check_bundles(setup: Setup, alg: str, bundles: list[bytes]) -> list[str]:
    """Problems with bundles the service returned: each must verify and carry the statement sent."""
    from modelsec.attestations.bundle import parse_bundle
    from modelsec.policy import PolicySet
    from modelsec.verifier import verify_bundle_signature

    keys = PolicySet.from_file(setup.policy).policies[0].keys
    problems = []
    if not bundles:
        problems.append(f"SignStatement {alg}: no bundle came back to check")
    for i, data in enumerate(bundles):
        bundle = parse_bundle(data, source=f"{alg} answer {i}")
        try:
            key = verify_bundle_signature(bundle, keys, role="weights")
        except Exception as e:  # noqa: BLE001 - reported as a check failure
            problems.append(f"SignStatement {alg}: answer {i} does not verify: {e}")
            continue
        if bundle.envelope.payload != setup.statements[alg]:
            problems.append(f"SignStatement {alg}: answer {i} signs other bytes than the statement sent")
        expected = "ecdsa-p256" if alg == "p256" else "sm2"
        if key.algorithm.value != expected:
            problems.append(f"SignStatement {alg}: answer {i} verified with a {key.algorithm.value} key")
    return problems


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    request: bytes
    key_version: str
    local: float  # in-process calls/s of the same work


def run_cases(
    setup: Setup,
    args: argparse.Namespace,
    refs: dict[str, Reference],
    seconds: float,
    levels: list[int],
    workers: int = 1,
) -> tuple[list[Row], list[str]]:
    """Start the server, run every case at every level from a spawn child; returns rows and failures."""
    from modelsec.v1 import signing_pb2, verification_pb2

    rows: list[Row] = []
    failures: list[str] = []
    log = setup.root / f"server-{workers}.log"
    spawn = multiprocessing.get_context("spawn")
    with (
        running_server(setup, log, args, failures, workers) as server,
        concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool,
    ):
        print(f"server pid {server.pid} on {server.target} (metrics on {HOST}:{server.metrics_port})")

        def job(method: str, request: bytes, key_version: str, clients: int, seconds: float) -> Job:
            return Job(server.target, setup.token, method, request, key_version, clients, seconds, server.pid)

        sign = {
            alg: signing_pb2.SignStatementRequest(
                key_version=KEY_VERSIONS[alg], statement=setup.statements[alg]
            ).SerializeToString()
            for alg in ("p256", "sm2")
        }
        # The VerifyBundle case sends the service's own output: a P-256 bundle it signed in this warm-up.
        warm = pool.submit(drive, job(SIGN_METHOD, sign["p256"], KEY_VERSIONS["p256"], 1, 0.2), args.client)
        first = warm.result()
        if first.errors or not first.bundles:
            raise RuntimeError(f"warm-up SignStatement failed: {first.error_samples}")
        failures += check_bundles(setup, "p256", first.bundles)
        verify = verification_pb2.VerifyBundleRequest(
            root_digest=setup.root_digest, bundles=[first.bundles[0]], require_signatures=True
        ).SerializeToString()
        cases = [
            Case(
                "SignStatement p256", SIGN_METHOD, sign["p256"], KEY_VERSIONS["p256"], refs["sign p256"].rate
            ),
            Case("SignStatement sm2", SIGN_METHOD, sign["sm2"], KEY_VERSIONS["sm2"], refs["sign sm2"].rate),
            Case("VerifyBundle p256", VERIFY_METHOD, verify, "", refs["verify"].rate),
        ]
        for case in cases:
            for n in levels:
                result = pool.submit(
                    drive, job(case.method, case.request, case.key_version, n, seconds), args.client
                )
                label = case.name if workers == 1 else f"{case.name} x{workers} workers"
                row = Row(label, n, result.result(), case.local)
                rows.append(row)
                print("  " + "  ".join(row.cells()) + f"  (load {load_average()})", flush=True)
                for sample in row.result.error_samples:
                    print(f"    error: {sample}")
                if case.method == SIGN_METHOD:
                    failures += check_bundles(setup, case.name.split()[-1], row.result.bundles)
        codes = server_codes(server.metrics_port)
    bad = {k: v for k, v in codes.items() if k[1] != "OK" and v}
    ok = {k[0].rsplit("/", 1)[-1]: int(v) for k, v in codes.items() if k[1] == "OK"}
    print(f"server counters (OK): {ok}" + (f"; not OK: {bad}" if bad else "; no other status"))
    if bad:
        failures.append(f"the server counted calls with a status other than OK: {bad}")
    sent = sum(len(r.result.latencies) + r.result.errors for r in rows)
    if sum(ok.values()) < sent:
        failures.append(f"the server counted {sum(ok.values())} OK calls, fewer than the {sent} answered")
    log_lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    print(f"server log: {len(log_lines)} line(s) at {args.log_level} level")
    if args.log_level == "warning":
        for ln in log_lines[:5]:
            print(f"    {ln[:200]}")
    return rows, failures


def print_targets(rows: list[Row]) -> None:
    """The issue 7 targets, judged at TARGET_CLIENTS clients."""
    for case, label, min_rate, max_p99 in (
        ("SignStatement p256", "ECDSA P-256 SignStatement", 1000.0, 20.0),
        ("SignStatement sm2", "SM2 SignStatement", 500.0, None),
    ):
        row = next((r for r in rows if r.case == case and r.clients == TARGET_CLIENTS), None)
        want = f">= {min_rate:,.0f} req/s" + (f" and p99 <= {max_p99:g} ms" if max_p99 else "")
        if row is None:
            print(f"target {label} {want} at {TARGET_CLIENTS} clients: not measured")
            continue
        p99 = percentile(sorted(row.result.latencies), 99) * 1000
        met = row.rate >= min_rate and (max_p99 is None or p99 <= max_p99)
        print(
            f"target {label} {want} at {TARGET_CLIENTS} clients: {'met' if met else 'MISSED'} "
            f"({row.rate:,.0f} req/s, p99 {p99:.2f} ms)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per case (default 30)")
    parser.add_argument("--quick", action="store_true", help="3 s per case (smoke run)")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated client counts")
    parser.add_argument("--client", choices=["aio", "threads"], default="aio", help="load generator kind")
    parser.add_argument("--auth", choices=["token", "anonymous"], default="token", help="client identity")
    parser.add_argument("--sm2-backend", default="openssl", help="the server's MODELSEC_SM2_BACKEND")
    parser.add_argument(
        "--log-level", choices=["warning", "info"], default="warning", help="the server's --log-level"
    )
    parser.add_argument("--reference-seconds", type=float, default=1.5, help="per in-process reference")
    parser.add_argument(
        "--layers", type=int, default=2, help="model blocks: 6 tensors each (default 2: a 14-tensor manifest)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (server log)")
    parser.add_argument(
        "--workers",
        default="1",
        help="comma-separated `modelsec serve --workers` counts, e.g. 1,2 (same run)",
    )
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else args.duration
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]

    import grpc
    from google.protobuf import __version__ as protobuf_version

    from modelsec.signer.schemes.sm2 import api as sm2

    for line in machine_lines():
        print(line)
    print(f"grpcio {grpc.__version__}, protobuf {protobuf_version}")
    print(f"load average before: {load_average()}; cpu pressure: {cpu_pressure()}")
    backend = sm2.backend_by_name(args.sm2_backend)
    version = getattr(backend, "version", "")
    shell = os.environ.get(sm2.BACKEND_ENV, "unset")
    print(
        f"SM2 backend: {backend.name}{f' ({version})' if version else ''}; the server runs with "
        f"{sm2.BACKEND_ENV}={args.sm2_backend} (this shell: {shell})"
    )
    auth = "bearer token (identity 'bench')" if args.auth == "token" else "anonymous (allowAnonymous)"
    print(f"server: modelsec serve, plaintext {HOST}, {auth}, --log-level {args.log_level}, metrics port on")
    client = (
        "grpc.aio, one event loop, one channel per client"
        if args.client == "aio"
        else "blocking stubs, one thread and one channel per client"
    )
    print(f"client: {client}, in one spawn child process; closed loop; {levels} clients, {seconds:g} s each")

    tmp = Path(tempfile.mkdtemp(prefix="modelsec-bench-grpc-"))
    try:
        setup = make_setup(tmp, args.auth, args.layers)
        print(
            f"model: {setup.files} files, {setup.tensors} tensors, root sha256:{setup.root_digest[:16]}...; "
            f"statements: p256 {len(setup.statements['p256'])} bytes (sha256 manifest), "
            f"sm2 {len(setup.statements['sm2'])} bytes (sm3 manifest)"
        )
        print("\nin-process reference (this process, one thread, median of 3):")
        refs = reference_rates(setup, args.reference_seconds)
        table = [[r.name, f"{r.rate:,.0f}", f"{1e6 / r.rate:,.0f}"] for r in refs.values()]
        print(render_table(["work", "calls/s", "us/call"], table, right=(1, 2)) + "\n")
        rows, failures = [], []
        for workers in [int(x) for x in args.workers.split(",") if x.strip()]:
            more_rows, more_failures = run_cases(setup, args, refs, seconds, levels, workers)
            rows += more_rows
            failures += more_failures
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(render_table(HEADER, [r.cells() for r in rows], right=range(1, len(HEADER))))
    print(
        "\nsrv cores: server CPU seconds / wall seconds (all its threads); srv/cli us/req: CPU per answer;\n"
        "of local: req/s / in-process calls/s of the same work (sign_statement, verify_attestations)"
    )
    print(f"load average after: {load_average()}; cpu pressure: {cpu_pressure()}")
    print_targets(rows)
    errors = sum(r.result.errors for r in rows)
    if errors:
        failures.append(f"{errors} request(s) failed")
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print("errors: 0")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
