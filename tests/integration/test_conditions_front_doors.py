"""Every front door allows and refuses alike on CEL conditions and lineage (issue 29).

One shared table of cases (builder identity, source repository, dataset digest, and base-model lineage three
generations deep with an unsigned link, a cycle and a link signed by a key the requirement does not name),
each a model of its own whose SLSA provenance and ancestors are filed in one directory store, decided by:

* the loader (`load_model`), and the runtime guard's verification (`open_snapshot` in process: what is
  tested is the decision, not the `.pth` start-up, which `test_guard_*` cover);
* the webhook (`Reviewer` with the store as its `--store`, the policy naming no store, a real
  AdmissionReview): the lineage links must be read from the store the webhook reads;
* gRPC `VerifyModel` (a server of its own: the session `grpc_server` runs the default test policy, this one
  needs the conditions policy);
* `modelsec verify` (in process).

`VerifyBundle` gets the model's lineage in the request itself: the ancestors' provenance is evidence when the
chain goes through it, and still vetoes when it does not.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import AttestationError
from modelsec.policy import PolicySet
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import load_model
from modelsec.verifier.attestations import store_bundle
from modelsec.verifier.guard.snapshot import open_snapshot
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.conftest import write_tiny_model
from tests.support.policies import write_policy_doc
from tests.support.provenance import GITHUB_BUILDER, SLSA_PROVENANCE_V1, signed_provenance
from tests.support.service import InThreadServer, write_server_config
from tests.unit.webhook.test_review import answer, review_body

pytestmark = pytest.mark.integration

REGISTRY = "oci://registry.internal/lineage"
APPROVED = "0" * 63 + "1"  # the approved base model
DATASET = "d" * 64
REPOSITORY = "https://github.com/acme/models"
CHECKS = {
    "builder": f"predicate.runDetails.builder.id == '{GITHUB_BUILDER}'",
    "source": f"predicate.buildDefinition.externalParameters.workflow.repository == '{REPOSITORY}'",
    "dataset": "predicate.buildDefinition.resolvedDependencies.exists(d, d.name == 'dataset' && "
    f"d.digest.sha256 == '{DATASET}')",
}


@dataclass(frozen=True)
class Case:
    """A model whose provenance differs from the good one by `change`, and its ancestors by `chain`."""

    name: str
    change: dict[str, Any]
    chain: str  # "good", "unsigned", "cycle", "untrusted"
    refusal: str  # "" for allowed; else a fragment every door's refusal names ({gen1}/{gen2} filled in)


CASES = [
    Case("allowed", {}, "good", ""),
    Case("builder", {"builder": "https://evil.example/runner"}, "good", "condition builder: "),
    Case("source", {"repository": "https://github.com/mallory/models"}, "good", "condition source: "),
    Case("dataset", {"datasets": ("e" * 64,)}, "good", "condition dataset: "),
    Case("unsigned link", {}, "unsigned", "link 2 (sha256:{gen1}): no provenance signed by a trusted signer"),
    Case("cycle", {}, "cycle", "link 3 (sha256:{gen2}): cycle back to sha256:{gen1}"),
    Case(
        "untrusted link", {}, "untrusted", "link 2 (sha256:{gen1}): no provenance signed by a trusted signer"
    ),
]


@dataclass(frozen=True)
class Built:
    model: Path
    root: str
    gen1: str
    gen2: str
    refusal: str


def _generations(name: str) -> tuple[str, str]:
    gen1, gen2 = (hashlib.sha256(f"{name}/{g}".encode()).hexdigest() for g in ("gen1", "gen2"))
    return gen1, gen2


def _forged(bundle: bytes, statement: bytes) -> bytes:
    """`bundle` with its DSSE payload swapped for `statement`: its signature covers another payload."""
    doc = json.loads(bundle)
    doc["dsseEnvelope"]["payload"] = base64.b64encode(statement).decode()
    return json.dumps(doc).encode()


@pytest.fixture(scope="module")
def world(key_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root_dir = tmp_path_factory.mktemp("front-doors").resolve()
    store = root_dir / "store"
    ci = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    other = load_private_key_file(key_dir / "other.key.pem")
    built: dict[str, Built] = {}
    for seed, case in enumerate(CASES, start=100):
        model = write_tiny_model(root_dir / case.name.replace(" ", "-"), shards=1, seed=seed)
        root = sign_model(model, [ci]).root_digest
        store_bundle(store, (model / "model.sig").read_bytes())  # the webhook reads no model directory
        gen1, gen2 = _generations(case.name)
        store_bundle(store, signed_provenance(root, ci, base=gen1, **{"datasets": (DATASET,), **case.change}))
        gen1_bundle = signed_provenance(gen1, other if case.chain == "untrusted" else ci, base=gen2)
        if case.chain == "unsigned":
            # GEN1's signed provenance, carrying a forged statement that skips GEN2 for a shorter path.
            forged = signed_provenance(gen1, ci, base=APPROVED, commit="f" * 40)
            gen1_bundle = _forged(
                gen1_bundle, base64.b64decode(json.loads(forged)["dsseEnvelope"]["payload"])
            )
        store_bundle(store, gen1_bundle)
        store_bundle(store, signed_provenance(gen2, ci, base=gen1 if case.chain == "cycle" else APPROVED))
        refusal = case.refusal.format(gen1=gen1, gen2=gen2)
        built[case.name] = Built(model, root, gen1, gen2, refusal)
    conditions: list[dict[str, Any]] = [
        {"name": name, "predicateType": SLSA_PROVENANCE_V1, "signers": ["ci"], "condition": source}
        for name, source in CHECKS.items()
    ]
    conditions.append(
        {
            "name": "lineage",
            "predicateType": SLSA_PROVENANCE_V1,
            "signers": ["ci"],
            "lineage": {"from": [f"sha256:{APPROVED}"], "maxDepth": 3},
        }
    )
    keys = [
        {"path": str(key_dir / "ecdsa-p256.pub.pem"), "name": "ci"},
        {"path": str(key_dir / "other.pub.pem"), "name": "elsewhere"},
    ]

    def doc(**extra: Any) -> dict[str, Any]:
        entry = {"name": "models", "match": [f"file://{root_dir}/**", f"{REGISTRY}/**"], "keys": keys}
        bundles_only = {"name": "bundles", "match": ["oci://nowhere.invalid/**"], "keys": keys}
        for e in (entry, bundles_only):
            e["attestations"] = {"conditions": conditions}
        entry.update(extra)
        return {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [entry, bundles_only],
        }

    path = write_policy_doc(root_dir / "policy.json", doc(attestationStore=str(store)))
    policies = PolicySet.from_file(path)
    # The webhook as deployed with `--store DIR`: the policy names no store.
    webhook_policies = PolicySet.from_mapping(doc(), base_dir=root_dir, source="webhook-policy")
    reviewer = Reviewer(
        webhook_policies, DirectoryStore(store), WebhookConfig(cache_ttl_seconds=0), generation="g"
    )
    server = InThreadServer(write_server_config(root_dir / "server", key_dir, policy=str(path)))
    client = ModelsecClient(server.target, ChannelOptions(plaintext=True, timeout=30))
    try:
        yield {
            "built": built,
            "policy_path": path,
            "policies": policies,
            "reviewer": reviewer,
            "client": client,
            "ci": ci,
            "other": other,
        }
    finally:
        client.close()
        server.stop()


def _loader(w: dict[str, Any], b: Built, cli: Any) -> str:
    try:
        load_model(b.model, w["policies"])
    except AttestationError as e:
        return e.diagnostics()
    return ""


def _guard(w: dict[str, Any], b: Built, cli: Any) -> str:
    try:
        open_snapshot(b.model, w["policies"])
    except AttestationError as e:
        return e.diagnostics()
    return ""


def _webhook(w: dict[str, Any], b: Built, cli: Any) -> str:
    response = answer(w["reviewer"], review_body("Pod", f"{REGISTRY}/{b.model.name}@sha256:{b.root}"))
    return "" if response["allowed"] else str(response["status"]["message"]) or "refused"


def _grpc(w: dict[str, Any], b: Built, cli: Any) -> str:
    response = w["client"].verify_model(str(b.model))
    if response.ok:
        return ""
    assert response.error_kind == "AttestationError", response.error
    return str(response.error) or "refused"


def _verify_command(w: dict[str, Any], b: Built, cli: Any) -> str:
    result = cli("verify", b.model, "--policy", w["policy_path"])
    assert result.returncode in (0, 1), result.stderr
    return "" if result.returncode == 0 else result.stderr or "refused"


DOORS = {"loader": _loader, "guard": _guard, "webhook": _webhook, "grpc": _grpc, "verify": _verify_command}


@pytest.mark.parametrize("door", DOORS)
def test_every_front_door_allows_and_refuses_alike(world: dict[str, Any], door: str, cli: Any) -> None:
    answers = {case.name: DOORS[door](world, world["built"][case.name], cli) for case in CASES}
    for case in CASES:
        b = world["built"][case.name]
        if not b.refusal:
            assert answers[case.name] == "", f"{door} refused {case.name}: {answers[case.name]}"
        else:
            assert b.refusal in answers[case.name], f"{door} on {case.name}: {answers[case.name]!r}"


def test_verify_bundle_takes_the_lineage_sent_with_the_model(world: dict[str, Any]) -> None:
    """VerifyBundle under a policy with no store: the ancestors' provenance in the request completes the
    chain and counts as evidence; a provenance statement about a model no chain reaches still vetoes."""
    b = world["built"]["allowed"]
    ci = world["ci"]
    model = [
        (b.model / "model.sig").read_bytes(),
        signed_provenance(b.root, ci, base=b.gen1, datasets=(DATASET,)),
    ]
    lineage = [signed_provenance(b.gen1, ci, base=b.gen2), signed_provenance(b.gen2, ci, base=APPROVED)]
    client = world["client"]
    verdict = client.verify_bundle(
        b.root, [*model, *lineage], policy="bundles", require_signatures=True
    ).verdict
    assert verdict.ok, (list(verdict.missing), list(verdict.ignored))
    assert any(f"lineage sha256:{b.root} <- sha256:{b.gen1}" in s for s in verdict.satisfied)
    # Without the ancestors the chain is missing (the policy reads no store).
    verdict = client.verify_bundle(b.root, model, policy="bundles", require_signatures=True).verdict
    assert not verdict.ok
    assert any(f"link 2 (sha256:{b.gen1}): no provenance signed" in m for m in verdict.missing)
    # A stranger's provenance, sent along, is no link of the chain: it is not evidence and vetoes.
    stranger = signed_provenance("5" * 64, ci, base=APPROVED)
    verdict = client.verify_bundle(
        b.root, [*model, *lineage, stranger], policy="bundles", require_signatures=True
    ).verdict
    assert not verdict.ok and not verdict.missing
    assert any(f"is about model {'5' * 64}" in i for i in verdict.ignored)
    # An ancestor signed by a key the requirement does not name is no link either.
    untrusted = [signed_provenance(b.gen1, world["other"], base=b.gen2), lineage[1]]
    verdict = client.verify_bundle(
        b.root, [*model, *untrusted], policy="bundles", require_signatures=True
    ).verdict
    assert not verdict.ok
    assert any(
        f"link 2 (sha256:{b.gen1}): no provenance signed by a trusted signer" in m for m in verdict.missing
    )
