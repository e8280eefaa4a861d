"""Server CPU per cached admission decision under `wrk`: directory and registry stores, one run (issue 32).

Usage: python bench/bench_webhook_wrk.py [--seconds 10] [--rounds 3] [--connections 64] [--threads 2]

Set-up (a temporary directory): a real CNCF distribution registry (Debian `docker-registry`, TLS and
htpasswd on loopback, started as the tests start it: `tests/support/oci.py`), a tiny safetensors model
signed with ECDSA P-256 and pushed with `modelsec push` (its signature and binding attached as referrers),
the same signature filed in a directory store, a policy trusting the key for `oci://REGISTRY/models/**`,
and a throwaway TLS CA and serving certificate (`bench_webhook`).

Two `modelsec webhook serve` processes run at once on loopback, with the default caches (positive results
60 s, registry evidence 60 s) and one change to the connection bounds: a client may keep `--connections`
idle connections (the default, 32 per client, would close some of wrk's and add TLS handshakes):

* `directory`: `--store DIR` (the directory store is read, or its revision checked, on every decision);
* `registry`: no `--store`, the evidence read from the artifact's referrers (kept for `--evidence-ttl`).

Every request is the same Pod AdmissionReview naming the model image by its OCI manifest digest (a modelcar:
the binding is read, then the evidence of the bound model root digest), so after the first decision each
one is a cache hit. Load: Debian's `wrk` with `--connections` keep-alive HTTPS connections for `--seconds`,
the two servers alternating for `--rounds` rounds. Server CPU per decision: the server process's
utime + stime (`/proc/<pid>/stat`, both its threads and its event loop) over the run, divided by the
requests `wrk` completed. After each server stops its audit log is checked: every decision allowed, and
at least 99 % of the references answered from the cache.

`--baseline-rev REV` adds, for each store, a server running the package as it was at git revision REV
(`git archive`, served through a copy of the editable install's link tree pointed at it, so the same venv
runs both), in the same rounds: the rows then compare the code, not the machine's load. `--connections 1
--threads 1` makes every request pay its own wake-ups, as an idle machine's unsaturated server does.

Target (issue 32): <= 500 us of server CPU per cached decision for each store (median of rounds); the
ratio to the target is printed. Exit status 1 if `wrk` or the registry is missing, a request failed or was
refused, or the cache check failed (a missed target is printed, not an error).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the registry the tests start
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    baseline_tree,
    load_average,
    machine_lines,
    pod_review,
    render_table,
    signed_model_in_registry,
)
from bench_webhook import HOST, _client_context, _free_port, _write_tls  # noqa: E402

TARGET_US = 500.0
# `modelsec webhook serve`, with one change: a client may keep as many idle connections as wrk opens. The
# default (32 per client address, above the API server's pool of 25) would close wrk's oldest idle
# connections, and the TLS handshakes of the reconnections would be counted as decision CPU.
_LAUNCHER = """
import sys
from modelsec.cli.main import main
from modelsec.webhook import server
serve = server.serve
limits = server.ConnectionLimits(
    max_idle_per_client={idle}, max_idle={idle} + 64, max_connections={idle} + 128
)
server.serve = lambda *args, **kwargs: serve(*args, **{{**kwargs, "limits": limits}})
sys.exit(main(sys.argv[1:], prog_name="modelsec"))
"""
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads), in seconds (`proc(5)`, fields 14 and 15)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


@contextlib.contextmanager
def server(argv: list[str], env: dict[str, str], log: Path, ca: Path, port: int) -> Iterator[int]:
    """A `modelsec webhook serve` process, up once /healthz answers; yields its pid."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    try:
        context, deadline = _client_context(ca), time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("server did not answer /healthz within 60 s")
            conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=2)
            try:
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.1)
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post(port: int, ca: Path, body: bytes) -> dict[str, object]:
    conn = http.client.HTTPSConnection(HOST, port, context=_client_context(ca), timeout=30)
    try:
        conn.request("POST", "/validate", body, {"Content-Type": "application/json"})
        answer: dict[str, object] = json.loads(conn.getresponse().read())
        return answer
    finally:
        conn.close()


def run_wrk(port: int, script: Path, seconds: float, connections: int, threads: int) -> tuple[int, int, str]:
    """`wrk` against /validate: (requests completed, failed: non-2xx, socket errors), and its output."""
    argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s", "-s", str(script)]
    out = subprocess.run(
        [*argv, f"https://{HOST}:{port}/validate"], check=True, capture_output=True, text=True
    ).stdout
    done = re.search(r"(\d+) requests in", out)
    if done is None:
        raise RuntimeError(f"wrk printed no request count:\n{out}")
    failed = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failed += sum(int(n) for n in errors.groups()) if errors else 0
    return int(done.group(1)), failed, out


def audit(log: Path) -> tuple[int, int, int]:
    """(decisions, refused, references answered from the cache) in a server's audit log."""
    decisions = refused = cached = 0
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") != "admission-decision":
            continue
        decisions += 1
        refused += rec.get("allowed") is not True
        cached += sum(1 for ref in rec.get("references", []) if ref.get("cached"))
    return decisions, refused, cached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per store")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--baseline-rev", default="", help="git revision also served, for comparison")
    args = parser.parse_args(argv)

    from tests.support.oci import registry_missing_reason, run_registry

    missing = registry_missing_reason() or (
        "" if shutil.which("wrk") else "wrk not installed (apt-get install wrk)"
    )
    if missing:
        print(f"FAIL: {missing}")
        return 1
    failures: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-webhook-wrk-") as tmp,
        run_registry(Path(tmp) / "r") as reg,
    ):
        root = Path(tmp)
        ca, cert, key = _write_tls(root)
        _options, doc, pushed = signed_model_in_registry(root, reg)
        (root / "policy.json").write_text(json.dumps(doc))
        body = pod_review(f"{reg.address}/models/bench@{pushed.manifest_digest}", "bench-uid")
        (root / "review.json").write_bytes(body)
        script = root / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.body = io.open("{root / "review.json"}", "rb"):read("*a")\n'
        )
        env = {**os.environ, **reg.env()}
        launcher = _LAUNCHER.format(idle=args.connections)
        base = [sys.executable, "-c", launcher, "webhook", "serve", "--policy", str(root / "policy.json")]
        base += ["--tls-cert", str(cert), "--tls-key", str(key), "--host", HOST]
        stores = {"directory": ["--store", str(root / "store")], "registry": []}
        envs = dict.fromkeys(stores, env)
        if args.baseline_rev:
            old = {**env, "PYTHONPATH": str(baseline_tree(args.baseline_rev, root / "baseline"))}
            for name, extra in list(stores.items()):
                stores[f"{name} @{args.baseline_rev}"], envs[f"{name} @{args.baseline_rev}"] = extra, old
        ports = {name: _free_port() for name in stores}
        logs = {name: root / f"{name.replace(' ', '-')}.log" for name in stores}
        per_decision: dict[str, list[float]] = {name: [] for name in stores}
        requests: dict[str, int] = dict.fromkeys(stores, 0)
        loads: list[str] = [load_average()]
        with contextlib.ExitStack() as stack:
            pids = {
                name: stack.enter_context(
                    server(
                        [*base, "--port", str(ports[name]), *extra], envs[name], logs[name], ca, ports[name]
                    )
                )
                for name, extra in stores.items()
            }
            for name in stores:
                answer = post(ports[name], ca, body)
                response = answer.get("response")
                if not isinstance(response, dict) or response.get("allowed") is not True:
                    print(f"FAIL: warm-up decision of {name} refused: {answer}")
                    return 1
            for _ in range(args.rounds):
                for name in stores:
                    cpu0 = cpu_seconds(pids[name])
                    done, failed, out = run_wrk(
                        ports[name], script, args.seconds, args.connections, args.threads
                    )
                    cpu = cpu_seconds(pids[name]) - cpu0
                    loads.append(load_average())
                    if failed:
                        failures.append(f"{name}: {failed} failed requests\n{out}")
                    requests[name] += done
                    per_decision[name].append(cpu / max(done, 1) * 1e6)
                    print(f"  {name}: {done} requests, {cpu:.2f} CPU-s, {per_decision[name][-1]:.0f} us each")
        for name in stores:
            decisions, refused, cached = audit(logs[name])
            if refused:
                failures.append(f"{name}: {refused} decisions refused")
            if cached < 0.99 * (decisions - 1):
                failures.append(f"{name}: {cached} of {decisions} references answered from the cache")

    print("\n".join(machine_lines()))
    print(
        f"wrk: {args.connections} connections, {args.threads} threads, {args.seconds:g} s per run, "
        f"{args.rounds} alternating rounds; load average during: {'; '.join(loads)}"
    )
    header = ["store", "requests", "server CPU us/decision (median)", "rounds", "vs target 500 us"]
    rows = []
    for name, values in per_decision.items():
        median = statistics.median(values)
        rows.append(
            [
                name,
                str(requests[name]),
                f"{median:.0f}",
                ", ".join(f"{v:.0f}" for v in values),
                f"{median / TARGET_US:.2f}",
            ]
        )
    print(render_table(header, rows, right=(1, 2, 4)))
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
