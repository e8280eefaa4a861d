"""Admission webhook with the `oci://` attestation store against the directory store (issue 17).

Usage: python bench/bench_webhook_oci.py [--seconds 20] [--quick] [--rate 200] [--servers 3]

Set-up: `bench_webhook.make_setup` (TLS, keys, the `ecdsa` policy and model, its `model.sig` filed in a
directory store), then one real registry on loopback (Debian's `docker-registry`, CNCF distribution 2.8,
TLS + htpasswd, started as the tests start it: `tests/oci_support.py`), into which `push_model` pushes the
same model as a ModelPack artifact with `model.sig` (and the binding) as referrers. The evidence is the
same in both stores; only where the webhook reads it differs.

For each store (directory, `oci://REGISTRY/models/ecdsa`) and cache mode (`--cache-ttl 60`: after the
first request each decision is a cache hit; `--cache-ttl 0`: every decision reads the store and verifies),
`--servers` `modelsec webhook serve` processes run on loopback ports (all reading the one registry) and one
load process sends `--rate` Pod AdmissionReviews/s in all, on a fixed schedule spread over the servers
(16 keep-alive TLS connections in all; latency from the scheduled send time, so queueing is counted: see
`bench_webhook.drive`). Each review names `oci://bench.local/ecdsa/tiny@sha256:<model root digest>`.

Printed: p50/p99/max per case and the p99 ratio OCI / directory per cache mode, measured in the same run.
The audit logs are checked as in `bench_webhook` (uncached: no cached answer; cached: >= 90% cached).

Exit status: 1 if any request failed, the registry is missing, or a cache check failed; 0 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_common.py, bench_webhook.py
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests/oci_support.py (the registry)

from _common import load_average, machine_lines, percentile, render_table
from bench_webhook import (
    RATE_CONNECTIONS,
    LoadResult,
    Setup,
    audit_counts,
    drive,
    make_setup,
    review_template,
    running_server,
)


@contextlib.contextmanager
def servers(setup: Setup, store: str, ttl: float, count: int, logs: list[Path]) -> Iterator[list[int]]:
    """`count` webhook processes reading `store` (credentials from this process's environment)."""
    with contextlib.ExitStack() as stack:
        configured = dataclasses.replace(setup, store=store)  # type: ignore[arg-type]  # a URI, passed as text
        yield [stack.enter_context(running_server(configured, ttl, log)) for log in logs[:count]]


def drive_all(
    pool: concurrent.futures.Executor,
    ports: list[int],
    ca_pem: str,
    template: bytes,
    seconds: float,
    rate: float,
) -> LoadResult:
    """`rate` requests/s in all, an equal share per server from its own load process; results merged."""
    share = max(1, RATE_CONNECTIONS // len(ports))
    futures = [pool.submit(drive, p, ca_pem, template, share, seconds, rate / len(ports)) for p in ports]
    merged = LoadResult()
    for f in futures:
        r = f.result()
        merged.latencies += r.latencies
        merged.errors += r.errors
        merged.error_samples += r.error_samples
        merged.elapsed = max(merged.elapsed, r.elapsed)
    return merged


def cells(case: str, servers_: int, result: LoadResult) -> list[str]:
    lat = sorted(result.latencies)
    achieved = len(lat) / result.elapsed if result.elapsed > 0 else float("nan")
    return [
        case,
        str(servers_),
        str(len(lat)),
        f"{achieved:,.0f}",
        f"{percentile(lat, 50) * 1000:.2f}",
        f"{percentile(lat, 99) * 1000:.2f}",
        f"{(lat[-1] if lat else float('nan')) * 1000:.1f}",
        str(result.errors),
    ]


def main(argv: list[str] | None = None) -> int:
    from tests.oci_support import PASSWORD, USER, registry_missing_reason, run_registry

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each case")
    parser.add_argument("--quick", action="store_true", help="3 s per case (smoke run)")
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s in all")
    parser.add_argument("--servers", type=int, default=3, help="webhook processes sharing the registry")
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    missing = registry_missing_reason()
    if missing:
        print(f"FAIL: {missing}")
        return 1

    for line in machine_lines():
        print(line)
    print(f"load average before: {load_average()}")
    print(
        f"stores (directory, oci) x (cached, uncached): {args.servers} webhook processes, "
        f"{args.rate:g} requests/s in all for {seconds:g} s each"
    )
    rows: list[list[str]] = []
    p99: dict[tuple[str, str], float] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="modelsec-bench-webhook-oci-") as tmp:
        root = Path(tmp)
        setup = make_setup(root)
        with run_registry(root / "registry") as registry:
            from modelsec.distribution.push_pull import push_model
            from modelsec.policy import Policy
            from modelsec.registry.client import RegistryOptions
            from modelsec.signer import load_private_key_file

            os.environ.update(registry.env())  # the webhook processes read the registry credentials here
            options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)
            pushed = push_model(
                root / "model-ecdsa",
                f"oci://{registry.address}/models/ecdsa:v1",
                Policy.from_key_files([setup.root / "trust" / "p256.pub.pem"]),
                load_private_key_file(setup.root / "trust" / "p256.key.pem"),
                options=options,
            )
            print(
                f"model sha256:{pushed.root_digest[:16]}... pushed to oci://{registry.address}/models/ecdsa "
                f"({pushed.manifest_digest[:23]}..., {len(pushed.referrers)} referrers)"
            )
            stores = {"directory": str(setup.store), "oci": f"oci://{registry.address}/models/ecdsa"}
            template = review_template(f"oci://bench.local/ecdsa/tiny@sha256:{setup.digests['ecdsa']}")
            ca_pem = setup.ca.read_text()
            spawn = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(args.servers, mp_context=spawn) as pool:
                for cache, ttl in (("cached", 60.0), ("uncached", 0.0)):
                    for kind, store in stores.items():
                        logs = [root / f"{kind}-{cache}-{i}.log" for i in range(args.servers)]
                        with servers(setup, store, ttl, args.servers, logs) as ports:
                            result = drive_all(pool, ports, ca_pem, template, seconds, args.rate)
                        case = f"{cache} {kind}"
                        rows.append(cells(case, args.servers, result))
                        print("  " + "  ".join(rows[-1]), flush=True)
                        for sample in result.error_samples:
                            print(f"    error: {sample}")
                        if result.errors:
                            failures.append(f"{case}: {result.errors} request(s) failed")
                        p99[cache, kind] = percentile(sorted(result.latencies), 99)
                        counts = [audit_counts(log) for log in logs]
                        cached = sum(c["cached"] for c in counts)
                        decisions = sum(c["decisions"] for c in counts)
                        if cache == "uncached" and cached:
                            failures.append(f"{case}: a server answered from its cache")
                        if cache == "cached" and cached < 0.9 * decisions:
                            failures.append(f"{case}: fewer than 90% of references answered from the cache")

    print()
    header = ["case", "servers", "requests", "decisions/s", "p50 ms", "p99 ms", "max ms", "errors"]
    print(render_table(header, rows, right=range(1, 8)))
    for cache in ("cached", "uncached"):
        ratio = p99[cache, "oci"] / p99[cache, "directory"]
        print(
            f"p99 at {args.rate:g} requests/s, {cache}: oci {p99[cache, 'oci'] * 1000:.2f} ms / directory "
            f"{p99[cache, 'directory'] * 1000:.2f} ms = {ratio:.2f}x"
        )
    print(f"load average after: {load_average()}")
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print("errors: 0")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
