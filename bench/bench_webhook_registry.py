"""Admission latency with the evidence in the registry, against a directory store in the same run (issue 28).

Usage: python bench/bench_webhook_registry.py [--seconds 10] [--rate 200]

Set-up (a temporary directory): a real CNCF distribution registry (Debian `docker-registry` 2.8, TLS and
htpasswd on loopback, started as the tests start it: `tests/support/oci.py`; the tag-schema fallback of the
referrers API), a tiny safetensors model signed with ECDSA P-256 and pushed with `modelsec push` (its
signature and binding attached as referrers), and the same signature filed in a directory store.

Each configuration decides Pod AdmissionReviews that name the model image by its OCI manifest digest (a
modelcar, as a cluster names it: the binding is read, then the evidence of the bound model root digest), in
process (`Reviewer.review`: the decision, without the HTTPS transport that every configuration shares, so
the ratios are the strictest form), on a fixed schedule of `--rate` requests/s from 8 threads. Each latency
is measured from the request's *scheduled* time, so a stall cannot hide queueing (no coordinated omission):

* `directory, cached` / `directory, uncached`: `--store DIR` (the bindings from the registry, as
  `modelsec webhook serve` reads them), positive cache on (60 s) / off; uncached, the bindings are read from
  the registry for every decision too (evidence TTL 0), as the webhook did before the evidence cache;
* `registry, cached`: no store, the registry's evidence kept for its TTL (`--evidence-ttl 60`) and the
  positive cache on: after the first request no registry request is made;
* `registry, uncached`: no store, evidence TTL 0 and the positive cache off: every decision lists the
  referrers and reads the bundles from the registry (bundle blobs are content-addressed, so the store keeps
  what it read once; the listing and the manifest are read every time).

Targets (issue 28): p99 of `registry, uncached` <= 3x `directory, uncached`; `registry, cached` <= 1.2x
`directory, cached`. Exit status 1 if a request was not allowed or a target was missed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the registry the tests start
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine_lines, percentile, render_table  # noqa: E402

THREADS = 8


def _pod(image: str, uid: str) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "name": "bench",
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bench", "namespace": "ml"},
                "spec": {"containers": [{"name": "model", "image": image}]},
            },
        },
    }
    return json.dumps(body).encode()


def run_at_rate(reviewer: Any, image: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """Latencies (ms, from each scheduled send) of `rate * seconds` decisions; how many were not allowed."""
    total = int(rate * seconds)
    start = time.perf_counter() + 0.05
    latencies: list[float] = []
    refused = 0
    lock = threading.Lock()

    def one(index: int) -> None:
        nonlocal refused
        scheduled = start + index / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        decision = reviewer.review(_pod(image, f"uid-{index}"))
        elapsed = (time.perf_counter() - scheduled) * 1000
        with lock:
            latencies.append(elapsed)
            refused += not decision.allowed

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(total)))
    return sorted(latencies), refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per configuration")
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s")
    args = parser.parse_args(argv)

    from modelsec.distribution.push_pull import bound_root_digests, push_model
    from modelsec.policy import Policy, PolicySet
    from modelsec.registry.client import RegistryOptions
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem
    from modelsec.verifier.attestations import store_bundle
    from modelsec.verifier.stores.directory import DirectoryStore
    from modelsec.webhook.review import Reviewer, WebhookConfig
    from tests.conftest import write_tiny_model
    from tests.support.oci import PASSWORD, USER, registry_missing_reason, run_registry

    missing = registry_missing_reason()
    if missing:
        print(f"skipped: {missing}")
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="bench-webhook-registry-") as tmp,
        run_registry(Path(tmp) / "r") as reg,
    ):
        root = Path(tmp)
        private, public = generate_private_key_pem("ecdsa-p256")
        (root / "key.pem").write_bytes(private)
        (root / "key.pub.pem").write_bytes(public)
        signer = load_private_key_file(root / "key.pem")
        model = write_tiny_model(root / "model", shards=1)
        sign_model(model, [signer])
        options = RegistryOptions(ca_file=reg.ca, username=USER, password=PASSWORD, timeout=5)
        pushed = push_model(
            model,
            f"oci://{reg.address}/models/bench:v1",
            Policy.from_key_files([root / "key.pub.pem"]),
            signer,
            options=options,
        )
        store_bundle(root / "store", (model / "model.sig").read_bytes())
        doc = {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [
                {"name": "models", "match": [f"oci://{reg.address}/models/**"], "keys": ["key.pub.pem"]}
            ],
        }
        policies = PolicySet.from_mapping(doc, base_dir=root, source="bench-policy")
        image = f"{reg.address}/models/bench@{pushed.manifest_digest}"

        def bindings(reference: str, policy: Policy) -> set[str]:
            return bound_root_digests(reference, policy, options=options)

        configs = {
            "directory, cached": (DirectoryStore(root / "store"), None, WebhookConfig(cache_ttl_seconds=60)),
            "directory, uncached": (
                DirectoryStore(root / "store"),
                None,
                WebhookConfig(cache_ttl_seconds=0, evidence_ttl_seconds=0, evidence_negative_ttl_seconds=0),
            ),
            "registry, cached": (None, options, WebhookConfig(cache_ttl_seconds=60, evidence_ttl_seconds=60)),
            "registry, uncached": (
                None,
                options,
                WebhookConfig(cache_ttl_seconds=0, evidence_ttl_seconds=0, evidence_negative_ttl_seconds=0),
            ),
        }
        p99: dict[str, float] = {}
        rows = []
        failed = 0
        for name, (store, registry, config) in configs.items():
            reviewer = Reviewer(policies, store, config, bindings=bindings, registry=registry)
            reviewer.review(_pod(image, "warm-up"))  # the first decision fills whatever is cached
            lat, refused = run_at_rate(reviewer, image, args.rate, args.seconds)
            failed += refused
            p99[name] = percentile(lat, 99)
            rows.append([name, str(len(lat)), str(refused), f"{percentile(lat, 50):.2f}", f"{p99[name]:.2f}"])
        print("\n".join(machine_lines()))
        print(
            f"admission at {args.rate:g} req/s for {args.seconds:g} s each, in process, model image by digest"
        )
        print(
            render_table(
                ["configuration", "requests", "not allowed", "p50 ms", "p99 ms"], rows, right=(1, 2, 3, 4)
            )
        )
        uncached = p99["registry, uncached"] / p99["directory, uncached"]
        cached = p99["registry, cached"] / p99["directory, cached"]
        print(f"p99 ratio registry/directory, uncached: {uncached:.2f}x (target <= 3x)")
        print(f"p99 ratio registry/directory, cached:   {cached:.2f}x (target <= 1.2x)")
        return 1 if failed or uncached > 3 or cached > 1.2 else 0


if __name__ == "__main__":
    sys.exit(main())
