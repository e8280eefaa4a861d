"""Admission p99 with three CEL conditions against the same policy without them (issue 29).

Usage: python bench/bench_conditions.py [--seconds 1.5] [--rate 100] [--rounds 10]

Set-up (a temporary directory): an ECDSA P-256 key pair, a tiny safetensors model signed with it, and a
directory store holding its signature and a signed SLSA v1 provenance statement about it (the shape
`tests/support/provenance.py` builds: GitHub Actions builder, source repository, a dataset digest). Two
policies over the same key and the same store:

* `plain`: the key, no attestation requirement (the provenance in the store is ignored, unread past its
  predicate type);
* `conditions`: the same, plus the three slsa-verifier-style checks of the verifying docs as CEL conditions
  (builder identity, source repository, dataset digest) on `https://slsa.dev/provenance/v1`.

The store is the webhook's own (`--store DIR`; the policies name none). Each policy is decided by the
webhook's `Reviewer.review` in process (the decision without the HTTPS
transport that both share, so the ratio is the strictest form), with the harness of
`bench/bench_webhook_registry.py` (`run_at_rate`: a fixed schedule of `--rate` requests/s from 8 threads,
each latency measured from its scheduled send time, so a stall cannot hide queueing):

* `cached`: the positive decision cache on (60 s): after the first request, a decision is a cache hit;
* `uncached`: the decision cache off (TTL 0): every decision reads the store, parses and verifies both
  bundles and, for `conditions`, judges the three conditions. What stays cached is what cannot change: the
  compiled conditions (compiled once at policy load) and a condition's value over a statement's exact
  signed bytes (`modelsec.policy.cel.ConditionInput`: keyed by the payload's SHA-256). The cost of the
  three conditions over a statement never seen before is printed separately.

Configurations alternate for `--rounds` short rounds (on a shared machine a burst of other work then lands
on every configuration alike, not on one); each p99 is over all its rounds; the load average is printed.
Target (issue 29): p99 with
the conditions <= 1.2x the p99 without them, cached and uncached, at the same rate in the same run. The
cost of one condition evaluation and of one uncached decision (sequential, median) is printed too. Exit
status 1 if a request was not allowed or a target was missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the provenance helper the tests use
sys.path.insert(0, str(ROOT / "bench"))

from _common import load_average, machine_lines, percentile, pod_review, render_table  # noqa: E402
from bench_webhook_registry import THREADS, run_at_rate  # noqa: E402

TARGET = 1.2
REGISTRY = "registry.internal/models"


def _policy_doc(conditions: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "models",
        "match": [f"oci://{REGISTRY}/**"],
        "keys": [{"path": "key.pub.pem", "name": "ci"}],
    }
    if conditions:
        entry["attestations"] = {
            "conditions": [
                {
                    "name": name,
                    "predicateType": "https://slsa.dev/provenance/v1",
                    "signers": ["ci"],
                    "condition": source,
                }
                for name, source in conditions.items()
            ]
        }
    return {"apiVersion": "modelsec.dev/v1alpha1", "kind": "ModelPolicy", "policies": [entry]}


def _sequential_ms(fn: Any, count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per run")
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds per configuration")
    args = parser.parse_args(argv)

    from modelsec.policy import PolicySet
    from modelsec.policy.cel import ConditionInput
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem
    from modelsec.verifier.attestations import store_bundle
    from modelsec.verifier.stores.directory import DirectoryStore
    from modelsec.webhook.review import Reviewer, WebhookConfig
    from tests.conftest import write_tiny_model
    from tests.support.provenance import GITHUB_BUILDER, provenance_statement, signed_provenance

    dataset = "d" * 64
    checks = {
        "builder": f"predicate.runDetails.builder.id == '{GITHUB_BUILDER}'",
        "source": "predicate.buildDefinition.externalParameters.workflow.repository == "
        "'https://github.com/acme/models'",
        "dataset": "predicate.buildDefinition.resolvedDependencies.exists(d, d.name == 'dataset' && "
        f"d.digest.sha256 == '{dataset}')",
    }
    with tempfile.TemporaryDirectory(prefix="bench-conditions-") as tmp:
        root = Path(tmp)
        private, public = generate_private_key_pem("ecdsa-p256")
        (root / "key.pem").write_bytes(private)
        (root / "key.pub.pem").write_bytes(public)
        signer = load_private_key_file(root / "key.pem")
        model = write_tiny_model(root / "model", shards=1)
        digest = sign_model(model, [signer]).root_digest
        store = root / "store"
        store_bundle(store, (model / "model.sig").read_bytes())
        store_bundle(store, signed_provenance(digest, signer, datasets=(dataset,)))
        image = f"{REGISTRY}/bench@sha256:{digest}"

        def policies(conditions: dict[str, str]) -> PolicySet:
            return PolicySet.from_mapping(_policy_doc(conditions), base_dir=root, source="bench")

        cached = WebhookConfig(cache_ttl_seconds=60)
        uncached = WebhookConfig(cache_ttl_seconds=0, evidence_ttl_seconds=0, evidence_negative_ttl_seconds=0)
        plain, with_conditions = policies({}), policies(checks)
        reviewers = {
            "plain, cached": Reviewer(plain, DirectoryStore(store), cached),
            "conditions, cached": Reviewer(with_conditions, DirectoryStore(store), cached),
            "plain, uncached": Reviewer(plain, DirectoryStore(store), uncached),
            "conditions, uncached": Reviewer(with_conditions, DirectoryStore(store), uncached),
        }
        for name, reviewer in reviewers.items():
            decision = reviewer.review(pod_review(image, "warm-up"))
            if not decision.allowed:
                print(f"{name}: warm-up decision refused: {decision.messages}")
                return 1

        compiled = [r.condition for r in with_conditions.policies[0].conditions if r.condition is not None]
        statement = provenance_statement(digest, datasets=(dataset,)).to_json_object()

        def first_sight() -> None:  # a statement never seen: converted once, nothing remembered
            prepared = ConditionInput(statement)
            for condition in compiled:
                condition.evaluate(prepared)

        condition_ms = _sequential_ms(first_sight, 200)
        decision_ms = {
            name: _sequential_ms(lambda r=reviewers[name]: r.review(pod_review(image, "seq")), 200)
            for name in ("plain, uncached", "conditions, uncached")
        }

        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in reviewers}
        for _ in range(max(1, args.rounds)):
            for name, reviewer in reviewers.items():
                runs[name].append(run_at_rate(reviewer, image, args.rate, args.seconds))

        print("\n".join(machine_lines()))
        print(f"load average: {load_average()}")
        print(
            f"in process (Reviewer.review), Pod naming the model by root digest, directory store, {THREADS} "
            f"threads, {args.rate:g} req/s, {args.seconds:g} s per run, {args.rounds} alternating rounds"
        )
        print(
            f"sequential medians: the three conditions over a statement never seen {condition_ms:.3f} ms; "
            "one uncached decision "
            + ", ".join(f"{name.split(',')[0]} {ms:.2f} ms" for name, ms in decision_ms.items())
        )
        rows, p99, refused = [], {}, 0
        for name, rs in runs.items():
            latencies = sorted(x for r in rs for x in r["latencies"])
            p99[name] = percentile(latencies, 99)
            not_allowed = sum(r["refused"] for r in rs)
            refused += not_allowed
            sustained = all(r["sustained"] for r in rs)
            rows.append(
                [
                    name,
                    "yes" if sustained else "NO",
                    str(len(latencies)),
                    str(not_allowed),
                    f"{percentile(latencies, 50):.2f}",
                    f"{p99[name]:.2f}",
                ]
            )
        print(
            render_table(
                ["configuration", "sustained", "requests", "not allowed", "p50 ms", "p99 ms"],
                rows,
                right=(1, 2, 3, 4, 5),
            )
        )
        missed = 0
        for what in ("cached", "uncached"):
            ratio = p99[f"conditions, {what}"] / p99[f"plain, {what}"]
            verdict = "PASS" if ratio <= TARGET else "FAIL"
            missed += verdict == "FAIL"
            print(
                f"p99 ratio three conditions / none, {what} at {args.rate:g} req/s: {ratio:.2f}x "
                f"(target <= {TARGET:g}x): {verdict}"
            )
        return 1 if refused or missed else 0


if __name__ == "__main__":
    sys.exit(main())
