"""One digest from CI to device memory, played as the API server and the kubelet would (issue 28).

Real parts on loopback: the session `registry` (Debian `docker-registry` 2.8 with TLS and htpasswd, so the
referrers tag-schema fallback), tiny BERT models that transformers really loads, signed and pushed BY TAG.
The path, for an `InferenceService` whose predictor names the model as KServe's storage initializer takes it
(`storageUri: modelsec+oci://REGISTRY/REPOSITORY:TAG`):

1. `mutate`: the mutating review (`Mutator`, as `modelsec webhook serve` builds it: evidence and bindings
   read from the registry, no `--store`); its JSON patch is applied with `jsonpatch`, as the API server does;
2. `validate`: the validating review of the patched object;
3. `initialize`: `modelsec storage-initializer SRC DEST` with SRC the patched `storageUri` (what KServe
   appends to the ClusterStorageContainer's command) into a fresh directory;
4. `serve`: a real serving process whose environment is exactly what the patch injected into the predictor
   (`MODELSEC_MODEL_DIGEST`, `MODELSEC_POLICY` naming the guard policy), the runtime guard installed by the
   package's `.pth`, loading `AutoModel.from_pretrained(DEST)` and printing a digest of every weight.

Then the same path with each attack, refused at the first step that can see it and with nothing loaded. A
second test runs three `modelsec webhook serve` processes, with no shared volume, on the one registry.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelsec.distribution.push_pull import PushResult, bound_root_digests, push_model
from modelsec.policy import Policy, PolicySet
from modelsec.registry.client import MANIFEST_MEDIA_TYPE, RegistryClient, RegistryOptions
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.stores.oci import OciAttestationStore
from modelsec.webhook.mutate import Mutator, registry_resolver
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.support.oci import PASSWORD, USER, Registry, flood_referrers

pytestmark = [pytest.mark.integration, pytest.mark.slow]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jsonpatch = pytest.importorskip("jsonpatch")

REPO = "models/cluster"
JUNK = 300
SERVE = """
import hashlib, json, sys
import torch
torch.set_num_threads(1)
from modelsec.verifier.guard import hook
print(json.dumps({"guard": hook.installed()}), flush=True)
import transformers
model = transformers.AutoModel.from_pretrained(sys.argv[1])
weights = {k: hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest()
           for k, v in model.state_dict().items()}
print(json.dumps({"loaded": weights}), flush=True)
"""


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bert(out: Path, seed: int) -> Path:
    """A tiny BERT (2 layers, hidden 16) with weights drawn from `seed`, saved by transformers."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    transformers.BertModel(config).save_pretrained(out)
    return out


def _weights(model_dir: Path) -> dict[str, str]:
    """The digest of every tensor of the signed safetensors files, as the serving process prints them."""
    from safetensors.torch import load_file

    out: dict[str, str] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            out[name] = hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()
    return out


@dataclass
class Cluster:
    """The models pushed for the scenario, and what the webhooks, initializer and guard are given."""

    registry: Registry
    options: RegistryOptions
    policies: PolicySet
    policy_file: Path  # the webhooks' and the storage initializer's policy
    guard_policy: Path  # what the predictor's MODELSEC_POLICY names (the policy's guardPolicy)
    serving: Path  # where the predictors' /mnt/models live (the guard policy matches below it)
    models: dict[str, Path]
    pushed: dict[str, PushResult]
    outage: str  # a registry host:port where nothing listens

    def uri(self, name: str, tag: str = "v1") -> str:
        return f"modelsec+oci://{self.registry.address}/{REPO}/{name}:{tag}"

    def webhooks(self) -> tuple[Reviewer, Mutator]:
        """Both webhooks as `modelsec webhook serve` builds them with no `--store`."""
        options = self.options
        reviewer = Reviewer(
            self.policies,
            None,
            WebhookConfig(),
            bindings=lambda reference, policy: bound_root_digests(reference, policy, options=options),
            registry=options,
        )
        return reviewer, Mutator(reviewer, registry_resolver(options))


def _push(root: Path, key_dir: Path, options: RegistryOptions, reference: str, seed: int, key: str) -> Any:
    model = _bert(root / f"model-{seed}", seed)
    signer = load_private_key_file(key_dir / f"{key}.key.pem")
    sign_model(model, [signer])
    policy = Policy.from_key_files([key_dir / f"{key}.pub.pem"])
    return model, push_model(model, reference, policy, signer, options=options)


def _push_unsigned(client: RegistryClient, manifest_digest: str) -> None:
    """`unsigned:v1`: the layers of `served` under a manifest of its own, with no referrers."""
    doc = json.loads(client.get_manifest(f"{REPO}/served", manifest_digest)[0])
    doc["annotations"] = {"unsigned": "yes"}
    for blob in [*doc["layers"], doc["config"]]:
        # cross-repository blobs are not shared by distribution's API: copied under the new name
        payload = client.get_blob(f"{REPO}/served", blob["digest"], 2**24, what=blob["digest"])
        client.put_blob(f"{REPO}/unsigned", blob["digest"], len(payload), payload)
    client.put_manifest(f"{REPO}/unsigned", "v1", json.dumps(doc).encode(), MANIFEST_MEDIA_TYPE)
    client.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, key_dir: Path, registry: Registry) -> Cluster:
    root = tmp_path_factory.mktemp("cluster").resolve()
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)
    outage = f"127.0.0.1:{_closed_port()}"
    serving = root / "pods"
    serving.mkdir()
    guard_policy = root / "guard-policy.yaml"
    guard_policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: predictor\n    match: ['file://{serving}/**']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
    )
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "cluster-models",
                "match": [f"oci://{registry.address}/{REPO}/**", f"oci://{outage}/**"],
                "keys": [str(key_dir / "ecdsa-p256.pub.pem")],
                "guardPolicy": str(guard_policy),
            }
        ],
    }
    policy_file = root / "policy.json"
    policy_file.write_text(json.dumps(doc))
    models: dict[str, Path] = {}
    pushed: dict[str, PushResult] = {}
    # One distinct seed per model: blobs are shared by every repository of the registry.
    for name, seed, key in (
        ("served", 2801, "ecdsa-p256"),
        ("moved", 2802, "ecdsa-p256"),  # the tag later moves to `moved-to`
        ("tampered", 2803, "ecdsa-p256"),
        ("replaced", 2804, "ecdsa-p256"),
        ("flooded", 2805, "ecdsa-p256"),
    ):
        ref = f"oci://{registry.address}/{REPO}/{name}:v1"
        models[name], pushed[name] = _push(root, key_dir, options, ref, seed, key)
    _push_unsigned(RegistryClient(registry.address, options), pushed["served"].manifest_digest)
    return Cluster(
        registry,
        options,
        PolicySet.from_file(policy_file),
        policy_file,
        guard_policy,
        serving,
        models,
        pushed,
        outage,
    )


def _isvc(storage_uri: str) -> dict[str, Any]:
    """An InferenceService whose predictor names its model as KServe's storage initializer takes it."""
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "bert", "namespace": "ml-serving"},
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "huggingface"},
                    "storageUri": storage_uri,
                    "env": [{"name": "PORT", "value": "8080"}],
                }
            }
        },
    }


def _review(obj: dict[str, Any], uid: str = "uid-cluster") -> bytes:
    api, _, version = obj["apiVersion"].rpartition("/")
    gvk = {"group": api, "version": version, "kind": obj["kind"]}
    request = {
        "uid": uid,
        "kind": gvk,
        "requestKind": gvk,
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"]["namespace"],
        "operation": "CREATE",
        "object": obj,
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode()


def _apply(response: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """The object after the response's patch, applied as the API server applies it."""
    if "patch" not in response:
        return copy.deepcopy(obj)
    assert response["patchType"] == "JSONPatch"
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    return patched


@dataclass
class Outcome:
    """How far the path went: the step that refused (None: the model was served) and what it said."""

    refused_at: str | None
    reason: str = ""
    message: str = ""
    patched: dict[str, Any] | None = None
    dest: Path | None = None
    weights: dict[str, str] | None = None


class ClusterPath:
    """The path, step by step, for one InferenceService; each step stops the path when it refuses."""

    def __init__(self, cluster: Cluster, tmp: Path, cli: Any) -> None:
        self.cluster, self.tmp, self.cli = cluster, tmp, cli
        self.reviewer, self.mutator = cluster.webhooks()

    def admit(self, storage_uri: str) -> Outcome:
        """Steps 1-2: the mutating review, its patch applied, and the validating review of the result."""
        obj = _isvc(storage_uri)
        mutation = self.mutator.review(_review(obj))
        response = mutation.decision.response["response"]
        if not response["allowed"]:
            assert "patch" not in response and mutation.patch == ()
            return Outcome("mutate", mutation.decision.reason, response["status"]["message"])
        patched = _apply(response, obj)
        assert patched == mutation.patched
        return Outcome(None, patched=patched)

    def validate(self, outcome: Outcome) -> Outcome:
        assert outcome.patched is not None
        decision = self.reviewer.review(_review(outcome.patched))
        if not decision.allowed:
            message = decision.response["response"]["status"]["message"]
            return Outcome("validate", decision.reason, message, outcome.patched)
        return outcome

    def initialize(self, outcome: Outcome, source: str | None = None) -> Outcome:
        """Step 3: KServe's `SRC DEST` into a fresh emptyDir; SRC is the patched storageUri by default."""
        assert outcome.patched is not None
        src = source or outcome.patched["spec"]["predictor"]["model"]["storageUri"]
        dest = Path(tempfile.mkdtemp(prefix="pod-", dir=self.cluster.serving)) / "mnt-models"
        dest.mkdir()
        result = self.cli(
            "storage-initializer",
            "--policy",
            self.cluster.policy_file,
            src,
            dest,
            env=self.cluster.registry.env(),
        )
        if result.returncode != 0:
            record = json.loads(result.stderr.strip().splitlines()[-1])
            assert result.returncode == 1, result.stderr
            return Outcome(
                "initialize", record["error"]["kind"], record["error"]["message"], outcome.patched, dest
            )
        return Outcome(None, patched=outcome.patched, dest=dest)

    def serve(self, outcome: Outcome) -> Outcome:
        """Step 4: a real serving process with exactly the predictor's injected environment."""
        assert outcome.patched is not None and outcome.dest is not None
        container = outcome.patched["spec"]["predictor"]["model"]
        injected = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("MODELSEC_")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_")}
        env.update(injected, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        run = subprocess.run(
            [sys.executable, "-c", SERVE, str(outcome.dest)],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.tmp,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        assert lines and lines[0] == {"guard": True}, run.stderr  # the .pth installed the guard
        if run.returncode != 0:
            assert len(lines) == 1, run.stdout  # nothing was loaded
            return Outcome("serve", "", run.stderr, outcome.patched, outcome.dest)
        assert len(lines) == 2, run.stdout
        return Outcome(None, patched=outcome.patched, dest=outcome.dest, weights=lines[1]["loaded"])

    def run(self, storage_uri: str) -> Outcome:
        outcome = self.admit(storage_uri)
        for step in (self.validate, self.initialize, self.serve):
            if outcome.refused_at is not None:
                return outcome
            outcome = step(outcome)
        return outcome


def _injected(outcome: Outcome) -> dict[str, str]:
    assert outcome.patched is not None
    env = outcome.patched["spec"]["predictor"]["model"]["env"]
    return {e["name"]: e["value"] for e in env}


def _nothing_landed(dest: Path | None) -> None:
    assert dest is not None and dest.is_dir() and list(dest.iterdir()) == []


def test_one_digest_from_ci_to_device_memory_and_every_attack_stops_at_its_first_step(
    cluster: Cluster, key_dir: Path, tmp_path: Path, cli: Any
) -> None:
    path = ClusterPath(cluster, tmp_path, cli)
    address = cluster.registry.address

    # --- the path: pushed by tag, pinned at admission, verified, placed, loaded under the guard --------
    served = cluster.pushed["served"]
    outcome = path.run(cluster.uri("served"))
    assert outcome.refused_at is None, outcome
    pinned_uri = f"modelsec+oci://{address}/{REPO}/served@{served.manifest_digest}"
    assert outcome.patched is not None
    assert outcome.patched["spec"]["predictor"]["model"]["storageUri"] == pinned_uri
    assert _injected(outcome) == {
        "PORT": "8080",
        "MODELSEC_MODEL_DIGEST": f"oci://{address}/{REPO}/served@sha256:{served.root_digest}",
        "MODELSEC_POLICY": str(cluster.guard_policy),
    }
    assert outcome.weights == _weights(cluster.models["served"])  # every weight is the signed one

    # --- the tag moves to another signed model between the two reviews ---------------------------------
    moved = cluster.pushed["moved"]
    admitted = path.admit(cluster.uri("moved"))
    assert admitted.refused_at is None
    _, other = _push(
        tmp_path, key_dir, cluster.options, f"oci://{address}/{REPO}/moved:v1", seed=2806, key="ecdsa-p256"
    )
    assert other.manifest_digest != moved.manifest_digest
    # The validating review verifies the digest the mutation pinned (still signed): admitted; the
    # initializer pulls by that digest, so what the predictor loads is what was admitted, not the new tag.
    validated = path.validate(admitted)
    assert validated.refused_at is None, validated
    placed = path.initialize(validated)
    assert placed.refused_at is None, placed
    loaded = path.serve(placed)
    assert loaded.refused_at is None and loaded.weights == _weights(cluster.models["moved"])
    # A predictor handed the other model's files (an initializer that followed the tag) is refused by the
    # guard: the pin names the admitted root digest, and nothing is loaded.
    followed = path.initialize(validated, source=cluster.uri("moved"))
    assert followed.refused_at is None  # the other model is signed: it verifies on its own
    refused = path.serve(followed)
    assert refused.refused_at == "serve"
    assert "DigestMismatchError" in refused.message and "model root digest, pinned" in refused.message
    assert other.root_digest in refused.message

    # --- a layer of the artifact replaced in the registry's storage ------------------------------------
    tampered = cluster.pushed["tampered"]
    client = RegistryClient(address, cluster.options)
    manifest = json.loads(client.get_manifest(f"{REPO}/tampered", tampered.manifest_digest)[0])
    layer = next(
        x for x in manifest["layers"] if x["annotations"]["org.cncf.model.filepath"].endswith(".safetensors")
    )
    blob = cluster.registry.blob_path(layer["digest"])
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    outcome = path.run(cluster.uri("tampered"))
    # The manifest and its evidence are intact: admitted; the initializer reads the layer and refuses it.
    assert (outcome.refused_at, outcome.reason) == ("initialize", "DigestMismatchError"), outcome
    assert "model.safetensors" in outcome.message
    _nothing_landed(outcome.dest)

    # --- the tag moved to a manifest whose layer differs (the same config, other weights) --------------
    swapped = dict(manifest, annotations={"swapped": "yes"})
    donor = json.loads(client.get_manifest(f"{REPO}/served", served.manifest_digest)[0])
    donor_layer = next(
        x
        for x in donor["layers"]
        if x["digest"] != layer["digest"]
        and x["annotations"]["org.cncf.model.filepath"] == layer["annotations"]["org.cncf.model.filepath"]
    )
    swapped["layers"] = [donor_layer if x is layer else x for x in manifest["layers"]]
    body = client.get_blob(f"{REPO}/served", donor_layer["digest"], 2**24, what=donor_layer["digest"])
    client.put_blob(f"{REPO}/tampered", donor_layer["digest"], len(body), body)
    client.put_manifest(f"{REPO}/tampered", "v2", json.dumps(swapped).encode(), MANIFEST_MEDIA_TYPE)
    outcome = path.run(cluster.uri("tampered", "v2"))
    assert (outcome.refused_at, outcome.reason) == ("validate", "attestation"), outcome
    assert "no binding" in outcome.message

    # --- the weights signature replaced by one an untrusted key made -----------------------------------
    replaced = cluster.pushed["replaced"]
    store = OciAttestationStore.open(
        f"{address}/{REPO}/replaced", max_bundle_bytes=2**24, max_bundles=64, options=cluster.options
    )
    (signature,) = store.entries(replaced.root_digest)
    untrusted = shutil.copytree(cluster.models["replaced"], tmp_path / "untrusted")
    sign_model(untrusted, [load_private_key_file(key_dir / "other.key.pem")], force=True)
    store.put((untrusted / "model.sig").read_bytes())
    store.delete(replaced.root_digest, signature.id)
    outcome = path.run(cluster.uri("replaced"))
    assert (outcome.refused_at, outcome.reason) == ("validate", "attestation"), outcome
    bound = f"bound model root digest {replaced.root_digest}: missing signature: no weights signature"
    assert bound in outcome.message and outcome.dest is None  # nothing placed, nothing loaded

    # --- an unsigned model: the same layers under a manifest of its own, with no referrers ---------------
    outcome = path.run(cluster.uri("unsigned"))
    assert (outcome.refused_at, outcome.reason) == ("validate", "attestation"), outcome
    assert "no binding" in outcome.message

    # --- a registry outage: the tag cannot be resolved -------------------------------------------------
    outcome = path.run(f"modelsec+oci://{cluster.outage}/{REPO}/served:v1")
    assert (outcome.refused_at, outcome.reason) == ("mutate", "registry-unavailable"), outcome
    assert "registry cannot be read" in outcome.message

    # --- 300 junk referrers beside the real ones change nothing ----------------------------------------
    flooded = cluster.pushed["flooded"]
    subject = {"mediaType": MANIFEST_MEDIA_TYPE, "digest": flooded.manifest_digest}
    subject["size"] = len(client.get_manifest(f"{REPO}/flooded", flooded.manifest_digest)[0])
    flood_referrers(
        client, f"{REPO}/flooded", subject, "application/vnd.example.junk.v1+json", b'{"junk":1}', JUNK
    )
    assert len(client.referrers(f"{REPO}/flooded", flooded.manifest_digest)) == JUNK + len(flooded.referrers)
    client.close()
    outcome = path.run(cluster.uri("flooded"))
    assert outcome.refused_at is None, outcome
    assert outcome.weights == _weights(cluster.models["flooded"])


@contextlib.contextmanager
def _webhook_processes(cluster: Cluster, tls: dict[str, Path], count: int, logs: Path) -> Iterator[list[int]]:
    """`count` `modelsec webhook serve` processes (no `--store`, nothing shared but the registry)."""
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent))
    assert exe is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_")}
    env.update(MODELSEC_OCI_USERNAME=USER, MODELSEC_OCI_PASSWORD=PASSWORD)
    ports = [_closed_port() for _ in range(count)]
    processes = []
    try:
        for i, port in enumerate(ports):
            args = [exe, "webhook", "serve", "--policy", cluster.policy_file, "--tls-cert", tls["server"]]
            args += ["--tls-key", tls["server_key"], "--host", "127.0.0.1", "--port", str(port)]
            args += ["--registry-ca", cluster.registry.ca]
            log = open(logs / f"webhook-{i}.log", "wb")  # closed with the process, below
            processes.append((subprocess.Popen([str(a) for a in args], env=env, stdout=log, stderr=log), log))
        context = ssl.create_default_context(cafile=str(tls["ca"]))
        deadline = time.monotonic() + 60
        for (process, _), port in zip(processes, ports, strict=True):
            while _get(port, context, "/readyz") != 200:
                assert process.poll() is None and time.monotonic() < deadline, (
                    logs / "webhook-0.log"
                ).read_text()
                time.sleep(0.1)
        yield ports
    finally:
        for process, log in processes:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


def _get(port: int, context: ssl.SSLContext, path: str) -> int | None:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def _post(port: int, context: ssl.SSLContext, path: str, body: bytes) -> dict[str, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200
        response: dict[str, Any] = json.loads(reply.read())["response"]
    finally:
        conn.close()
    return {
        "allowed": response["allowed"],
        "message": response.get("status", {}).get("message"),
        "patch": json.loads(base64.b64decode(response["patch"])) if "patch" in response else None,
    }


def test_three_webhook_processes_reading_one_registry_decide_alike(
    cluster: Cluster, tls: dict[str, Path], tmp_path: Path
) -> None:
    address = cluster.registry.address
    served = cluster.pushed["served"]
    pinned = f"modelsec+oci://{address}/{REPO}/served@{served.manifest_digest}"
    objects = {
        "by-tag": _isvc(cluster.uri("served")),
        "pinned": _isvc(pinned),
        "unsigned": _isvc(cluster.uri("unsigned")),
        "unknown-tag": _isvc(cluster.uri("served", "no-such-tag")),
    }
    context = ssl.create_default_context(cafile=str(tls["ca"]))
    with _webhook_processes(cluster, tls, 3, tmp_path) as ports:
        answers = [
            {
                (name, path): _post(port, context, path, _review(obj, uid=f"uid-{name}"))
                for name, obj in objects.items()
                for path in ("/mutate", "/validate")
            }
            for port in ports
        ]
        # The validating review of each object as the mutation patched it.
        for answer, port in zip(answers, ports, strict=True):
            for name, obj in objects.items():
                patch = answer[name, "/mutate"]["patch"]
                if patch is not None:
                    patched = jsonpatch.apply_patch(obj, patch)
                    answer[name, "patched"] = _post(
                        port, context, "/validate", _review(patched, uid=f"uid-{name}")
                    )
    first = answers[0]
    assert answers[1] == first and answers[2] == first
    # What they agree on is the expected decision for each object.
    pin = f"oci://{address}/{REPO}/served@sha256:{served.root_digest}"
    env = "/spec/predictor/model/env/-"
    assert first["by-tag", "/mutate"] == {
        "allowed": True,
        "message": None,
        "patch": [
            {"op": "replace", "path": "/spec/predictor/model/storageUri", "value": pinned},
            {"op": "add", "path": env, "value": {"name": "MODELSEC_MODEL_DIGEST", "value": pin}},
            {
                "op": "add",
                "path": env,
                "value": {"name": "MODELSEC_POLICY", "value": str(cluster.guard_policy)},
            },
        ],
    }
    assert first["by-tag", "patched"] == {"allowed": True, "message": None, "patch": None}
    assert first["pinned", "/validate"] == first["by-tag", "patched"]
    assert first["pinned", "/mutate"]["patch"] == first["by-tag", "/mutate"]["patch"][1:]
    refused = {key: answer["message"] for key, answer in first.items() if not answer["allowed"]}
    assert sorted(refused) == [
        ("by-tag", "/validate"),
        ("unknown-tag", "/mutate"),
        ("unknown-tag", "/validate"),
        ("unsigned", "/validate"),
        ("unsigned", "patched"),
    ]
    assert "tags are mutable" in refused["by-tag", "/validate"]
    assert "no-such-tag" in refused["unknown-tag", "/mutate"]
    assert "no binding signed by a trusted key" in refused["unsigned", "patched"]
