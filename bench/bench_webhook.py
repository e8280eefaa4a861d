"""Admission webhook under load: decisions/s and p50/p99 latency over real TLS on loopback (issue 8).

Usage: python bench/bench_webhook.py [--seconds 30] [--quick] [--rate 200] [--concurrency 1,8,64]

Set-up (a temporary directory): a throwaway CA and a serving certificate for 127.0.0.1 (`cryptography`),
an ECDSA P-256 and an SM2 key pair, two tiny safetensors models, their bundles filed in a directory
attestation store, and one policy file with two policies:

* `ecdsa` (`oci://bench.local/ecdsa/**`): trusts the P-256 key, `requireAlgorithms: [ecdsa-p256]`; its
  model is signed with P-256 only (`model.sig`).
* `sm2` (`oci://bench.local/sm2/**`): trusts both keys, `requireAlgorithms: [ecdsa-p256, sm2]`; its model
  is signed with both (`model.sig`, `model.sm2.sig`), so an uncached decision verifies both signatures.

Why two models: `verify_attestations` accepts only when *no* bundle about the digest is refused, and a
bundle whose key the policy does not trust is refused; an ECDSA-only policy over a digest that also has an
SM2 bundle in the store is therefore a deny.

Two servers, one after the other, each `modelsec webhook serve` as a subprocess on a free 127.0.0.1 port
(audit log to a file): **cached** (default `--cache-ttl 60`: every request names the same digest, so after
the first one each decision is a cache hit) and **uncached** (`--cache-ttl 0`: the positive cache is
disabled, so every request reads the store and verifies the bundle). After each server stops, its audit log
is checked: the uncached server must have logged no cached result, the cached one only a few misses.

Load comes from a separate process (a `multiprocessing` spawn child): one thread per connection, each a
persistent HTTP/1.1 keep-alive `http.client.HTTPSConnection` that checks the server certificate against the
CA (as kube-apiserver does with `caBundle`). Each request is a Pod AdmissionReview with a unique uid and
one model reference; a response counts as an error unless it is HTTP 200, echoes the uid and has
`allowed: true`. Closed loop: each connection sends its next request when the previous answer arrives; the
latency is send-to-answer; decisions/s counts good answers over the run. The fixed-rate run sends
`--rate` requests/s (cached, ECDSA, spread over 16 connections) on a fixed schedule and measures each
latency from its *scheduled* send time, so a stalled server cannot hide queueing (no coordinated
omission). Target (issue 8): p99 <= 50 ms at 200 requests/s cached.

Exit status: 1 if any request failed or the cache check failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import http.client
import ipaddress
import json
import multiprocessing
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

try:  # bench/_common.py, when run as `python bench/bench_webhook.py`
    from _common import console_script, load_average, machine_lines, percentile, render_table
except ImportError:  # pragma: no cover - run from elsewhere
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import console_script, load_average, machine_lines, percentile, render_table

HOST = "127.0.0.1"
POLICIES = ("ecdsa", "sm2")
RATE_CONNECTIONS = 16
UID_MARK = "__BENCH_UID__"


# --------------------------------------------------------------------------------------------------------
# Set-up: CA, serving certificate, keys, signed model, store, policy


def _write_tls(root: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a serving certificate for 127.0.0.1; returns (ca.crt, tls.crt, tls.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(hours=6))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("modelsec-bench-ca"))
        .issuer_name(name("modelsec-bench-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("modelsec-webhook.modelsec-system.svc"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("modelsec-webhook.modelsec-system.svc"),
                    x509.IPAddress(ipaddress.ip_address(HOST)),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = root / "ca.crt", root / "tls.crt", root / "tls.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


def _write_tiny_model(model: Path, seed: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    model.mkdir(parents=True)
    tensors = {
        "layers.0.weight": rng.standard_normal((8, 16)).astype(np.float32),
        "layers.0.bias": rng.standard_normal((8,)).astype(np.float16),
    }
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    (model / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 16}))


@dataclass
class Setup:
    root: Path
    ca: Path
    cert: Path
    key: Path
    policy: Path
    store: Path
    digests: dict[str, str]


def make_setup(root: Path) -> Setup:
    """Everything the server needs, under `root`."""
    from modelsec.algorithms import SignatureAlgorithm
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem
    from modelsec.verifier.attestations import store_bundle

    ca, cert, key = _write_tls(root)
    trust = root / "trust"
    trust.mkdir()
    signers = []
    for algorithm, stem in ((SignatureAlgorithm.ECDSA_P256, "p256"), (SignatureAlgorithm.SM2, "sm2")):
        private, public = generate_private_key_pem(algorithm)
        (trust / f"{stem}.key.pem").write_bytes(private)
        (trust / f"{stem}.pub.pem").write_bytes(public)
        signers.append(load_private_key_file(trust / f"{stem}.key.pem"))
    # Two tiny models with different bytes (so different root digests): `ecdsa` signed with P-256 only,
    # `sm2` signed with both keys. A store bundle whose key the matched policy does not trust is a refusal
    # (verify_attestations: "nothing refused"), so the ECDSA-only policy cannot share a digest with an
    # SM2 bundle.
    store = root / "store"
    digests: dict[str, str] = {}
    for policy_name, seed, chosen in (("ecdsa", 0, signers[:1]), ("sm2", 1, signers)):
        model = root / f"model-{policy_name}"
        _write_tiny_model(model, seed)
        signed = sign_model(model, chosen)
        for bundle in ("model.sig", "model.sm2.sig")[: len(chosen)]:
            store_bundle(store, (model / bundle).read_bytes())
        filed = list((store / "sha256" / signed.root_digest).glob("*.sig"))
        if len(filed) != len(chosen):
            raise RuntimeError(f"expected {len(chosen)} bundles for {policy_name}, found {len(filed)}")
        digests[policy_name] = signed.root_digest
    policy = root / "policy.json"
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "ecdsa",
                "match": ["oci://bench.local/ecdsa/**"],
                "keys": ["trust/p256.pub.pem"],
                "requireAlgorithms": ["ecdsa-p256"],
                "requireDigest": True,
            },
            {
                "name": "sm2",
                "match": ["oci://bench.local/sm2/**"],
                "keys": ["trust/p256.pub.pem", "trust/sm2.pub.pem"],
                "requireAlgorithms": ["ecdsa-p256", "sm2"],
                "requireDigest": True,
            },
        ],
        "noMatch": "deny",
    }
    policy.write_text(json.dumps(doc, indent=2) + "\n")
    return Setup(root, ca, cert, key, policy, store, digests)


def review_template(reference: str) -> bytes:
    """A Pod CREATE AdmissionReview naming `reference`; `UID_MARK` stands for the uid."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "bench",
            "namespace": "ml-serving",
            "annotations": {"modelsec.dev/models": reference},
        },
        "spec": {"containers": [{"name": "server", "image": "registry.local/runtime/vllm:1"}]},
    }
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    doc = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID_MARK,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": "bench",
            "namespace": "ml-serving",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:ml-serving:deployer"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    return json.dumps(doc).encode()


# --------------------------------------------------------------------------------------------------------
# The server subprocess


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _client_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


@contextlib.contextmanager
def running_server(setup: Setup, cache_ttl: float, log: Path) -> Iterator[int]:
    """`modelsec webhook serve` on a free loopback port, up once /healthz answers; yields the port."""
    argv = [console_script("modelsec") or "modelsec"]
    port = _free_port()
    argv += ["webhook", "serve", "--policy", str(setup.policy), "--store", str(setup.store)]
    argv += ["--tls-cert", str(setup.cert), "--tls-key", str(setup.key), "--host", HOST, "--port", str(port)]
    argv += ["--cache-ttl", f"{cache_ttl:g}"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        context = _client_context(setup.ca)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"server exited {proc.returncode}: " + " | ".join(tail))
            if time.monotonic() > deadline:
                raise RuntimeError("server did not answer /healthz within 30 s")
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
        yield port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def audit_counts(log: Path) -> dict[str, int]:
    """Decisions in a server's audit log: total, references answered from the cache, references verified."""
    counts = {"decisions": 0, "cached": 0, "verified": 0}
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") != "admission-decision":
            continue
        counts["decisions"] += 1
        for ref in rec.get("references", []):
            counts["cached" if ref.get("cached") else "verified"] += 1
    return counts


# --------------------------------------------------------------------------------------------------------
# The load generator (runs in a separate process)


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)  # seconds, good answers only
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    elapsed: float = 0.0


def drive(
    port: int,
    ca_pem: str,
    template: bytes,
    connections: int,
    seconds: float,
    rate: float | None,
) -> LoadResult:
    """Send AdmissionReviews over `connections` keep-alive TLS connections for `seconds`.

    `rate` None: closed loop (each connection sends when its previous answer arrived). Otherwise a fixed
    schedule of `rate` requests/s shared round-robin by the connections, latency counted from the scheduled
    send time.
    """
    context = ssl.create_default_context(cadata=ca_pem)
    head, tail = template.split(UID_MARK.encode())
    headers = {"Content-Type": "application/json"}
    lock = threading.Lock()
    result = LoadResult()
    barrier = threading.Barrier(connections + 1, timeout=120)  # a stuck connection breaks, never hangs
    start = [0.0]

    def fail(message: str) -> None:
        with lock:
            result.errors += 1
            if len(result.error_samples) < 5:
                result.error_samples.append(message)

    def one(conn: http.client.HTTPSConnection, uid: str) -> str | None:
        """One review; None when it is a good answer, else what was wrong."""
        conn.request("POST", "/validate", body=head + uid.encode() + tail, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            return f"HTTP {response.status}: {data[:200]!r}"
        answer = json.loads(data).get("response", {})
        if answer.get("uid") != uid:
            return f"uid {answer.get('uid')!r} != {uid!r}"
        if answer.get("allowed") is not True:
            return f"allowed={answer.get('allowed')!r}: {answer.get('status')}"
        return None

    def worker(index: int) -> None:
        conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=10)
        latencies: list[float] = []
        try:
            try:
                problem = one(conn, f"bench-warmup-{index}")  # handshake and first decision, not timed
            except Exception as e:  # noqa: BLE001 - every failure is counted
                problem = f"{type(e).__name__}: {e}"
            if problem:
                fail("warm-up: " + problem)
                conn.close()
                conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=10)
            barrier.wait()
            t0 = start[0]
            end = t0 + seconds
            n = 0
            while True:
                if rate is None:
                    sent = time.perf_counter()
                    if sent >= end:
                        break
                else:
                    sent = t0 + (index + n * connections) / rate
                    if sent >= end:
                        break
                    delay = sent - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                uid = f"bench-{index}-{n}"
                n += 1
                try:
                    problem = one(conn, uid)
                except Exception as e:  # noqa: BLE001 - every failure is counted, then a fresh connection
                    problem = f"{type(e).__name__}: {e}"
                    conn.close()
                    conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=10)
                if problem:
                    fail(problem)
                else:
                    latencies.append(time.perf_counter() - sent)
        finally:
            conn.close()
            with lock:
                result.latencies.extend(latencies)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(connections)]
    for t in threads:
        t.start()
    start[0] = time.perf_counter() + 0.05
    barrier.wait()
    for t in threads:
        t.join()
    result.elapsed = time.perf_counter() - start[0]
    return result


# --------------------------------------------------------------------------------------------------------
# Main


@dataclass
class Row:
    case: str
    connections: int
    result: LoadResult

    def cells(self) -> list[str]:
        lat = sorted(self.result.latencies)
        rate = len(lat) / self.result.elapsed if self.result.elapsed > 0 else float("nan")
        return [
            self.case,
            str(self.connections),
            str(len(lat)),
            f"{rate:,.0f}",
            f"{percentile(lat, 50) * 1000:.2f}",
            f"{percentile(lat, 99) * 1000:.2f}",
            f"{(lat[-1] if lat else float('nan')) * 1000:.1f}",
            str(self.result.errors),
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="duration of each closed-loop case")
    parser.add_argument("--quick", action="store_true", help="3 s per case (smoke run)")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated connection counts")
    parser.add_argument("--rate", type=float, default=200.0, help="fixed-rate run, requests/s (0: skip)")
    parser.add_argument("--target-p99-ms", type=float, default=50.0, help="p99 target of the fixed-rate run")
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]

    for line in machine_lines():
        print(line)
    print(f"load average before: {load_average()}")
    print(
        f"{len(POLICIES)} policies x (cached, uncached) x connections {levels}, {seconds:g} s each"
        + (f"; fixed rate {args.rate:g}/s cached for {seconds:g} s" if args.rate > 0 else "")
    )

    rows: list[Row] = []
    rate_row: Row | None = None
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="modelsec-bench-webhook-") as tmp:
        root = Path(tmp)
        setup = make_setup(root)
        ca_pem = setup.ca.read_text()
        print(
            f"ecdsa: model sha256:{setup.digests['ecdsa'][:16]}... (model.sig, P-256); "
            f"sm2: model sha256:{setup.digests['sm2'][:16]}... (model.sig P-256 + model.sm2.sig SM2)"
        )
        templates = {
            p: review_template(f"oci://bench.local/{p}/tiny@sha256:{setup.digests[p]}") for p in POLICIES
        }
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as client:
            for cache, ttl in (("cached", 60.0), ("uncached", 0.0)):
                log = root / f"server-{cache}.log"
                with running_server(setup, ttl, log) as port:
                    for policy in POLICIES:
                        for n in levels:
                            case = f"{cache} {policy}"
                            res = client.submit(drive, port, ca_pem, templates[policy], n, seconds, None)
                            row = Row(case, n, res.result())
                            rows.append(row)
                            print("  " + "  ".join(row.cells()), flush=True)
                            for sample in row.result.error_samples:
                                print(f"    error: {sample}")
                    if cache == "cached" and args.rate > 0:
                        case = f"cached ecdsa @{args.rate:g}/s"
                        res = client.submit(
                            drive, port, ca_pem, templates["ecdsa"], RATE_CONNECTIONS, seconds, args.rate
                        )
                        rate_row = Row(case, RATE_CONNECTIONS, res.result())
                        rows.append(rate_row)
                        print("  " + "  ".join(rate_row.cells()), flush=True)
                        for sample in rate_row.result.error_samples:
                            print(f"    error: {sample}")
                counts = audit_counts(log)
                print(
                    f"{cache} server audit log: {counts['decisions']} decisions, "
                    f"{counts['verified']} references verified, {counts['cached']} from the cache"
                )
                if cache == "uncached" and counts["cached"]:
                    failures.append("the uncached server answered from its cache")
                if cache == "cached" and counts["cached"] < 0.9 * counts["decisions"]:
                    failures.append("the cached server answered fewer than 90% of references from its cache")

    print()
    header = ["case", "conns", "requests", "decisions/s", "p50 ms", "p99 ms", "max ms", "errors"]
    print(render_table(header, [r.cells() for r in rows], right=range(1, 8)))
    print(f"\nload average after: {load_average()}")
    errors = sum(r.result.errors for r in rows)
    if rate_row is not None:
        lat = sorted(rate_row.result.latencies)
        p99 = percentile(lat, 99) * 1000
        verdict = "met" if p99 <= args.target_p99_ms else "MISSED"
        achieved = len(lat) / rate_row.result.elapsed
        print(
            f"target p99 <= {args.target_p99_ms:g} ms at {args.rate:g} requests/s cached: {verdict} "
            f"(p99 {p99:.2f} ms, achieved {achieved:.0f} requests/s)"
        )
    if errors:
        failures.append(f"{errors} request(s) failed")
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print("errors: 0")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
