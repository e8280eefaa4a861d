"""Admission latency with the evidence in the registry, against a directory store in the same run (issue 28).

Usage: python bench/bench_webhook_registry.py [--seconds 10] [--rate 200] [--rounds 2] [--auth token|htpasswd]
       [--profile N]

Set-up (a temporary directory): a real CNCF distribution registry (Debian `docker-registry` 2.8, TLS on
loopback, started as the tests start it: `tests/support/oci.py`; the tag-schema fallback of the referrers
API), a tiny safetensors model signed with ECDSA P-256 and pushed with `modelsec push` (its signature and
binding attached as referrers), and the same signature filed in a directory store.

Registry authentication (`--auth`, printed with the figures; the same registry serves both stores):
`token` (default), the Docker token authentication that public registries (Docker Hub, GHCR, Harbor, Quay)
use: a token server on loopback grants ES256 JWTs valid 300 s, the client keeps its token, and the
registry checks a JWT signature per request. `htpasswd`: Basic credentials that the registry checks with
bcrypt (cost 5, htpasswd's default) on every request, about 2 ms of the registry's CPU each here, on the
same 2 cores as the webhook and the load (the set-up of the earlier runs).

Each configuration decides Pod AdmissionReviews that name the model image by its OCI manifest digest (a
modelcar, as a cluster names it: the binding is read, then the evidence of the bound model root digest), in
process (`Reviewer.review`: the decision, without the HTTPS transport that every configuration shares, so
the ratios are the strictest form), on a fixed schedule of `rate` requests/s from 8 threads. Each latency
is measured from the request's *scheduled* time, so a stall cannot hide queueing (no coordinated omission).
Both stores read the bindings from the registry through the process's shared client, as
`modelsec webhook serve` does:

* `directory`: `--store DIR`; `registry`: no store, the evidence read from the artifact's referrers;
* `cached`: positive cache on (60 s) and registry evidence kept for its TTL (60 s): after the first request
  no registry request is made;
* `uncached`: the decision cache and the evidence cache disabled (TTL 0): every decision reads the
  bindings (and, for `registry`, the bundles) from the registry: the tags and the referrers listing on
  every decision. What is fetched by digest and cannot change (referrer manifests and bundle blobs, checked
  against their digests) stays in the client's content cache, as in a running webhook.

A rate is *sustained* when the run ends within 2 % + 0.2 s of its schedule (a backlog that grows, the
sign of an over-committed machine, makes p99 measure the queue and not the store). The cached
configurations run at `--rate`. The uncached ones run at `--rate` when the directory store sustains it;
otherwise they step down a ladder of rates (200, 150, 100, 75, 50, ... req/s), alternating for `--rounds`
rounds at each, to the highest rate both sustain in every round (the highest common rate; the directory
store's own sustained rate and each step's p99 are printed too). Each p99 is over all rounds of its
rate. The registry requests and new connections per decision are counted from urllib3's log; the CPU per
decision of this process (the webhook and the load generator) and of the registry process are read from
/proc (the registry shares the machine's cores: what it spends, the webhook cannot).

Targets (issue 28): p99 of `registry, uncached` <= 3x `directory, uncached`; `registry, cached` <= 1.2x
`directory, cached`, at the same rate in the same run. Exit status 1 if a request was not allowed or a
target was missed. `--profile N` prints a cProfile of N sequential uncached decisions per store instead.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import cProfile
import io
import logging
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the registry the tests start
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine_lines, percentile, pod_review, render_table, signed_model_in_registry  # noqa: E402

THREADS = 8
AUTH = {
    "token": "token (Docker token auth: ES256 JWT from a loopback token server, 300 s, kept by the client)",
    "htpasswd": "htpasswd (Basic, bcrypt cost 5 checked by the registry on every request)",
}
SORT = "cumulative"
LADDER = (200.0, 150.0, 100.0, 75.0, 50.0, 35.0, 25.0, 15.0, 10.0, 5.0)  # uncached rates tried, req/s



class _Traffic(logging.Handler):
    """Counts the registry requests and new connections urllib3 logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.requests = self.connections = 0
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        with self._lock:
            if message.startswith(("Starting new", "Resetting dropped")):
                self.connections += 1
            elif '"' in message:
                self.requests += 1


TRAFFIC = _Traffic()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pin(registry_pid: int, cpu: int) -> None:
    """Every thread of the registry onto `cpu` (threads it starts later inherit it); this process off it."""
    others = set(os.sched_getaffinity(0)) - {cpu}
    if cpu not in os.sched_getaffinity(0) or not others:
        raise SystemExit(f"--registry-cpu {cpu}: needs that CPU and at least one other")
    for task in Path(f"/proc/{registry_pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {cpu})
    os.sched_setaffinity(0, others)
    print(f"registry pinned to CPU {cpu}, webhook and load generator to {sorted(others)} (both stores alike)")


def run_at_rate(reviewer: Any, image: str, rate: float, seconds: float, registry_pid: int) -> dict[str, Any]:
    """Decide `rate * seconds` requests on schedule: latencies (ms, from each scheduled send), refusals,
    whether the rate was sustained, the registry requests and new connections per decision, and the CPU
    per decision of this process (the webhook and the load) and of the registry process."""
    total = max(1, int(rate * seconds))
    cpu0, registry_cpu0 = time.process_time(), _cpu_seconds(registry_pid)
    latencies: list[float] = []
    refused = 0
    lock = threading.Lock()
    requests0, connections0 = TRAFFIC.requests, TRAFFIC.connections
    start = time.perf_counter() + 0.05

    def one(index: int) -> None:
        nonlocal refused
        scheduled = start + index / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        decision = reviewer.review(pod_review(image, f"uid-{index}"))
        elapsed = (time.perf_counter() - scheduled) * 1000
        with lock:
            latencies.append(elapsed)
            refused += not decision.allowed

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(total)))
    overrun = time.perf_counter() - start - total / rate
    return {
        "latencies": sorted(latencies),
        "refused": refused,
        "sustained": overrun <= 0.02 * total / rate + 0.2,
        "requests": (TRAFFIC.requests - requests0) / total,
        "connections": (TRAFFIC.connections - connections0) / total,
        "cpu": (time.process_time() - cpu0) / total * 1000,
        "registry_cpu": (_cpu_seconds(registry_pid) - registry_cpu0) / total * 1000,
    }


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "latencies": sorted(x for r in runs for x in r["latencies"]),
        "refused": sum(r["refused"] for r in runs),
        "sustained": all(r["sustained"] for r in runs),
        "requests": sum(r["requests"] for r in runs) / len(runs),
        "connections": sum(r["connections"] for r in runs) / len(runs),
        "cpu": sum(r["cpu"] for r in runs) / len(runs),
        "registry_cpu": sum(r["registry_cpu"] for r in runs) / len(runs),
    }


def _profile(reviewers: dict[str, Any], image: str, count: int) -> None:
    for name, reviewer in reviewers.items():
        profiler = cProfile.Profile()
        started, cpu = time.perf_counter(), time.process_time()
        profiler.enable()
        for index in range(count):
            reviewer.review(pod_review(image, f"profile-{index}"))
        profiler.disable()
        wall = (time.perf_counter() - started) / count * 1000
        cpu_ms = (time.process_time() - cpu) / count * 1000
        print(f"== {name}: {wall:.2f} ms wall, {cpu_ms:.2f} ms CPU (this process) per decision")
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(SORT).print_stats(30)
        print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per run")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="requests/s (cached; uncached if sustained)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per configuration")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N uncached decisions")
    parser.add_argument(
        "--auth",
        choices=("token", "htpasswd"),
        default="token",
        help="registry authentication: JWT bearer tokens, or Basic checked with bcrypt per request",
    )
    parser.add_argument(
        "--registry-cpu",
        type=int,
        default=None,
        metavar="N",
        help="pin the registry (every thread) to CPU N and this process (webhook, load generator) to the "
        "others, as where the registry runs on its own machine; applies to both stores alike",
    )
    args = parser.parse_args(argv)
    load_start = _load()
    logging.getLogger("urllib3.connectionpool").setLevel(logging.DEBUG)
    logging.getLogger("urllib3.connectionpool").addHandler(TRAFFIC)

    from modelsec.distribution.push_pull import bound_root_digests
    from modelsec.policy import Policy, PolicySet
    from modelsec.verifier.stores.directory import DirectoryStore
    from modelsec.webhook.review import Reviewer, WebhookConfig
    from tests.support.oci import registry_missing_reason, run_registry

    missing = registry_missing_reason()
    if missing:
        print(f"skipped: {missing}")
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="bench-webhook-registry-") as tmp,
        run_registry(Path(tmp) / "r", token_auth=args.auth == "token") as reg,
    ):
        root = Path(tmp)
        if args.registry_cpu is not None:
            _pin(reg.process.pid, args.registry_cpu)
        options, doc, pushed = signed_model_in_registry(root, reg)
        policies = PolicySet.from_mapping(doc, base_dir=root, source="bench-policy")
        image = f"{reg.address}/models/bench@{pushed.manifest_digest}"

        def bindings(reference: str, policy: Policy) -> set[str]:
            return bound_root_digests(reference, policy, options=options)

        cached = WebhookConfig(cache_ttl_seconds=60, evidence_ttl_seconds=60)
        uncached = WebhookConfig(cache_ttl_seconds=0, evidence_ttl_seconds=0, evidence_negative_ttl_seconds=0)
        reviewers = {
            "directory, cached": Reviewer(
                policies, DirectoryStore(root / "store"), cached, bindings=bindings
            ),
            "registry, cached": Reviewer(policies, None, cached, bindings=bindings, registry=options),
            "directory, uncached": Reviewer(
                policies, DirectoryStore(root / "store"), uncached, bindings=bindings
            ),
            "registry, uncached": Reviewer(policies, None, uncached, bindings=bindings, registry=options),
        }
        for reviewer in reviewers.values():
            # fills what is cached, opens the connection
            decision = reviewer.review(pod_review(image, "warm-up"))
            if not decision.allowed:
                print(f"warm-up decision refused: {decision.messages}")
                return 1
        if args.profile:
            print(f"registry authentication (both stores): {AUTH[args.auth]}")
            _profile({k: v for k, v in reviewers.items() if "uncached" in k}, image, args.profile)
            return 0

        # Cached: both at --rate, alternating rounds.
        results: dict[str, dict[str, Any]] = {}
        runs: dict[str, list[dict[str, Any]]] = {"directory, cached": [], "registry, cached": []}
        for _ in range(max(1, args.rounds)):
            for name in runs:
                runs[name].append(
                    run_at_rate(reviewers[name], image, args.rate, args.seconds, reg.process.pid)
                )
        results.update({name: _merge(r) for name, r in runs.items()})
        rates = {name: args.rate for name in runs}
        # Uncached: down the ladder from --rate until both stores sustain the rate in every round (the
        # highest common rate); the directory store's own sustained rate is the first it sustains.
        ladder = [args.rate] + [r for r in LADDER if r < args.rate]
        trace, directory_rate = [], None
        for rate in ladder:
            pair: dict[str, list[dict[str, Any]]] = {"directory, uncached": [], "registry, uncached": []}
            for _ in range(max(1, args.rounds)):
                for name in pair:
                    pair[name].append(
                        run_at_rate(reviewers[name], image, rate, args.seconds, reg.process.pid)
                    )
                if not pair["directory, uncached"][-1]["sustained"]:
                    break  # the directory store falls behind: no ratio at this rate
            step = {name: _merge(r) for name, r in pair.items() if r}
            sustained = {
                name: m["sustained"] and len(pair[name]) == max(1, args.rounds) for name, m in step.items()
            }
            line = f"{rate:g} req/s: " + ", ".join(
                f"{name.split(',')[0]} p99 {percentile(m['latencies'], 99):.1f} ms"
                f"{'' if sustained.get(name) else ' (not sustained)'}"
                for name, m in step.items()
                if m["latencies"]
            )
            trace.append(line)
            if sustained.get("directory, uncached") and directory_rate is None:
                directory_rate = rate
            if sustained.get("directory, uncached") and sustained.get("registry, uncached"):
                break
        uncached_rate = rate
        results.update(step)
        rates.update({name: uncached_rate for name in step})

        print("\n".join(machine_lines()))
        print(
            f"in process, model image by manifest digest, {THREADS} threads, {args.seconds:g} s per run, "
            f"{args.rounds} alternating rounds"
        )
        print(f"registry authentication (both stores): {AUTH[args.auth]}")
        print(f"load average (1, 5, 15 min): at the start {load_start}, at the end {_load()}")
        print("uncached ladder (sustained: the run ends within 2 % + 0.2 s of its schedule):")
        print("\n".join(f"  {line}" for line in trace))
        print(
            f"uncached: the directory store sustains {directory_rate if directory_rate else 'none'} "
            f"req/s here; highest common rate: {uncached_rate:g} req/s"
            + (
                ""
                if uncached_rate >= args.rate
                else f" ({args.rate:g} req/s is not sustained on this machine)"
            )
        )
        rows, p99 = [], {}
        failed = 0
        for name in reviewers:
            m = results[name]
            lat = m["latencies"]
            p99[name] = percentile(lat, 99)
            failed += m["refused"]
            rows.append(
                [
                    name,
                    f"{rates[name]:g}",
                    "yes" if m["sustained"] else "NO",
                    str(len(lat)),
                    str(m["refused"]),
                    f"{m['requests']:.2f}",
                    f"{m['connections']:.3f}",
                    f"{m['cpu']:.2f}",
                    f"{m['registry_cpu']:.2f}",
                    f"{percentile(lat, 50):.2f}",
                    f"{p99[name]:.2f}",
                ]
            )
        print(
            render_table(
                [
                    "configuration",
                    "req/s",
                    "sustained",
                    "requests",
                    "not allowed",
                    "registry req/decision",
                    "new conn/decision",
                    "CPU ms/decision",
                    "registry CPU ms/decision",
                    "p50 ms",
                    "p99 ms",
                ],
                rows,
                right=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
            )
        )
        ratios = {
            "uncached": (p99["registry, uncached"] / p99["directory, uncached"], 3.0, uncached_rate),
            "cached": (p99["registry, cached"] / p99["directory, cached"], 1.2, args.rate),
        }
        missed = 0
        for what, (ratio, target, rate) in ratios.items():
            verdict = "PASS" if ratio <= target else "FAIL"
            missed += verdict == "FAIL"
            print(
                f"p99 ratio registry/directory, {what} at {rate:g} req/s: {ratio:.2f}x "
                f"(target <= {target:g}x): {verdict}"
            )
        return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
