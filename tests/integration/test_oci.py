"""ModelPack push/pull and the oci:// store against a real registry (distribution 2.8, TLS + htpasswd)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from modelsec.attestations.bundle import sign_statement
from modelsec.attestations.predicates.oci_binding import binding_statement
from modelsec.distribution.push_pull import bound_root_digests, pull_model, push_model
from modelsec.errors import (
    BackendUnavailableError,
    DigestMismatchError,
    MalformedArtifactError,
    SignatureError,
)
from modelsec.policy import Policy
from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    RegistryOptions,
    canonical_json,
    descriptor,
)
from modelsec.registry.referrers import attach_bundle
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier import verify_attestations, verify_model
from modelsec.verifier.stores import open_store
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry

pytestmark = pytest.mark.integration


@pytest.fixture
def options(registry: Registry) -> RegistryOptions:
    return RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)


@pytest.fixture
def policy(key_dir: Path) -> Policy:
    return Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])


def _signed_model(root: Path, key_dir: Path, seed: int = 0) -> Path:
    model = write_tiny_model(root, seed=seed)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return model


def _push(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, repo: str, seed: int = 0
):
    model = _signed_model(tmp_path / f"model-{repo}-{seed}", key_dir, seed)
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    binder = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    return model, push_model(
        model, f"oci://{registry.address}/models/{repo}:v1", policy, binder, options=options
    )


def _client(registry: Registry, options: RegistryOptions) -> RegistryClient:
    return RegistryClient(registry.address, options)


def _nothing_landed(dest: Path) -> None:
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".modelsec-pull-")]


def test_push_lists_referrers_through_the_fallback_tag_and_pull_lands_verified(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, policy: Policy
) -> None:
    model, pushed = _push(tmp_path, key_dir, registry, options, "tiny")
    client = _client(registry, options)
    # distribution 2.8 has no referrers API: the listing comes from the sha256-<hex> tag
    assert client.request("GET", f"models/tiny/referrers/{pushed.manifest_digest}").status_code == 404
    listed = client.referrers("models/tiny", pushed.manifest_digest)
    assert [d["artifactType"] for d in listed] == [BUNDLE_ARTIFACT_TYPE, BUNDLE_ARTIFACT_TYPE]
    manifest = json.loads(client.get_manifest("models/tiny", pushed.manifest_digest)[0])
    assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    paths = sorted(layer["annotations"]["org.cncf.model.filepath"] for layer in manifest["layers"])
    assert "model-00001-of-00002.safetensors" in paths and "model.sig" not in paths

    dest = tmp_path / "pulled"
    result = pull_model(
        f"oci://{registry.address}/models/tiny@{pushed.manifest_digest}", dest, policy, options=options
    )
    assert result.root_digest == pushed.root_digest
    for name in paths:
        assert (dest / name).read_bytes() == (model / name).read_bytes()
    assert verify_model(dest, policy).root_digest == pushed.root_digest  # lands self-contained (model.sig)
    # admission by OCI digest: the trusted binding names the model root digest (by tag or by digest)
    for ref in (
        f"oci://{registry.address}/models/tiny:v1",
        f"oci://{registry.address}/models/tiny@{pushed.manifest_digest}",
    ):
        assert bound_root_digests(ref, policy, options=options) == {pushed.root_digest}
    stranger = Policy.from_key_files([key_dir / "other.pub.pem"])
    assert bound_root_digests(f"oci://{registry.address}/models/tiny:v1", stranger, options=options) == set()
    _nothing_landed(tmp_path / "other")


def test_oci_store_reads_the_model_bundles_but_not_the_binding(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, policy: Policy, monkeypatch
) -> None:
    _, pushed = _push(tmp_path, key_dir, registry, options, "store")
    for name, value in {"MODELSEC_OCI_USERNAME": USER, "MODELSEC_OCI_PASSWORD": PASSWORD}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MODELSEC_OCI_CA", str(registry.ca))
    store = open_store(f"oci://{registry.address}/models/store")
    store.check()
    bundles = store.entries(pushed.root_digest)
    assert len(bundles) == 1 and bundles[0].source.startswith(
        f"oci://{registry.address}/models/store@sha256:"
    )
    verdict = verify_attestations(pushed.root_digest, bundles, policy)
    assert verdict.ok, verdict.reasons()
    assert store.entries("0" * 64) == []
    # put() attaches another bundle as a referrer of the model's manifest (idempotent)
    other = _signed_model(tmp_path / "again", key_dir)
    entry, created = store.put((other / "model.sig").read_bytes())
    assert entry.root_digest == pushed.root_digest
    assert store.put((other / "model.sig").read_bytes())[1] is False
    assert len(store.entries(pushed.root_digest)) == 1 + created
    store.close()


def test_tampered_layer_is_refused_and_nothing_lands(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, policy: Policy
) -> None:
    # blobs are shared by every repository of the registry: this model's shard is unique to this test
    _, pushed = _push(tmp_path, key_dir, registry, options, "tampered", seed=7)
    manifest = json.loads(
        _client(registry, options).get_manifest("models/tampered", pushed.manifest_digest)[0]
    )
    shard = "model-00002-of-00002.safetensors"
    layer = next(x for x in manifest["layers"] if x["annotations"]["org.cncf.model.filepath"] == shard)
    blob = registry.blob_path(layer["digest"])
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    dest = tmp_path / "pulled"
    with pytest.raises(DigestMismatchError, match=shard):
        pull_model(
            f"oci://{registry.address}/models/tampered@{pushed.manifest_digest}",
            dest,
            policy,
            options=options,
        )
    _nothing_landed(dest)


def _put_manifest(client: RegistryClient, repo: str, layers: list[tuple[str, bytes]]) -> dict:
    descs = []
    for path, data in layers:
        desc = descriptor("application/vnd.cncf.model.weight.config.v1.raw", data)
        client.put_blob(repo, desc["digest"], len(data), data)
        descs.append({**desc, "annotations": {"org.cncf.model.filepath": path}})
    config = b"{}"
    client.put_blob(repo, descriptor("x", config)["digest"], 2, config)
    body = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "artifactType": "application/vnd.cncf.model.manifest.v1+json",
            "config": descriptor("application/vnd.cncf.model.config.v1+json", config),
            "layers": descs,
        }
    )
    desc = descriptor(MANIFEST_MEDIA_TYPE, body)
    client.put_manifest(repo, desc["digest"], body, MANIFEST_MEDIA_TYPE)
    return desc


@pytest.mark.parametrize(
    "path", ["../escape.txt", "/etc/evil", "a/../../b", "a\\..\\b", "model.sig", ".git/config"]
)
def test_layer_path_that_escapes_is_refused_before_anything_is_written(
    tmp_path: Path, registry: Registry, options: RegistryOptions, policy: Policy, path: str
) -> None:
    client = _client(registry, options)
    desc = _put_manifest(client, "models/traversal", [("config.json", b"{}"), (path, b"evil")])
    dest = tmp_path / "out" / "pulled"
    dest.parent.mkdir()
    with pytest.raises(MalformedArtifactError, match=r"org\.cncf\.model\.filepath"):
        pull_model(
            f"oci://{registry.address}/models/traversal@{desc['digest']}", dest, policy, options=options
        )
    _nothing_landed(dest)
    assert not (dest.parent / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()


def test_unsigned_artifact_is_refused(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, policy: Policy
) -> None:
    client = _client(registry, options)
    desc = _put_manifest(client, "models/unsigned", [("config.json", b"{}")])
    dest = tmp_path / "pulled"
    with pytest.raises(SignatureError, match="no binding"):
        pull_model(
            f"oci://{registry.address}/models/unsigned@{desc['digest']}", dest, policy, options=options
        )
    _nothing_landed(dest)
    # a model pushed (and bound) by a key the policy does not trust is refused the same way
    _, pushed = _push(tmp_path, key_dir, registry, options, "strangers")
    stranger = Policy.from_key_files([key_dir / "other.pub.pem"])
    with pytest.raises(SignatureError, match="no binding"):
        pull_model(
            f"oci://{registry.address}/models/strangers@{pushed.manifest_digest}",
            dest,
            stranger,
            options=options,
        )
    _nothing_landed(dest)


def test_swapped_referrer_is_not_evidence(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, policy: Policy
) -> None:
    _, a = _push(tmp_path, key_dir, registry, options, "swap", seed=1)
    _, b = _push(tmp_path, key_dir, registry, options, "swap", seed=2)
    client = _client(registry, options)
    # replace a's listing with b's referrers: b's binding (a trusted signature, of another manifest)
    index = json.loads(client.get_manifest("models/swap", b.manifest_digest.replace(":", "-"))[0])
    tag = a.manifest_digest.replace(":", "-")
    client.put_manifest("models/swap", tag, canonical_json(index), "application/vnd.oci.image.index.v1+json")
    dest = tmp_path / "pulled"
    with pytest.raises(SignatureError, match="refers to"):
        pull_model(f"oci://{registry.address}/models/swap@{a.manifest_digest}", dest, policy, options=options)
    _nothing_landed(dest)


def test_manifest_whose_files_differ_from_the_signed_manifest_is_refused(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, policy: Policy
) -> None:
    model, pushed = _push(tmp_path, key_dir, registry, options, "differ")
    client = _client(registry, options)
    manifest = json.loads(client.get_manifest("models/differ", pushed.manifest_digest)[0])
    forged = b'{"model_type": "tiny", "hidden_size": 61}'
    for layer in manifest["layers"]:
        if layer["annotations"]["org.cncf.model.filepath"] == "config.json":
            layer.update(descriptor(layer["mediaType"], forged))
            client.put_blob("models/differ", layer["digest"], len(forged), forged)
    body = canonical_json(manifest)
    subject = descriptor(MANIFEST_MEDIA_TYPE, body)
    client.put_manifest("models/differ", subject["digest"], body, MANIFEST_MEDIA_TYPE)
    # even with a binding a trusted key signed for the new manifest, the files must match the OMS manifest
    binder = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    statement = binding_statement(
        "m", subject["digest"], pushed.root_digest, model_name="m", artifact_type="x"
    )
    attach_bundle(client, "models/differ", subject, sign_statement(statement, binder))
    attach_bundle(client, "models/differ", subject, (model / "model.sig").read_bytes())
    dest = tmp_path / "pulled"
    with pytest.raises(DigestMismatchError, match=r"config\.json"):
        pull_model(
            f"oci://{registry.address}/models/differ@{subject['digest']}", dest, policy, options=options
        )
    _nothing_landed(dest)


def test_wrong_password_and_registry_down_fail_closed_quickly(
    tmp_path: Path, registry: Registry, options: RegistryOptions
) -> None:
    bad = RegistryOptions(ca_file=registry.ca, username=USER, password="wrong", timeout=5)
    with pytest.raises(BackendUnavailableError, match="access denied"):
        RegistryClient(registry.address, bad).check()
    start = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        RegistryClient("127.0.0.1:9", options).check()  # discard port: nothing listens
    assert time.monotonic() - start < 5


def test_cli_push_then_pull(tmp_path: Path, key_dir: Path, registry: Registry, cli) -> None:
    model = _signed_model(tmp_path / "m", key_dir)
    ref = f"oci://{registry.address}/models/cli:v1"
    pub, key = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    pushed = cli("push", model, ref, "--signing-key", key, "--trusted-key", pub, "--json", env=registry.env())
    assert pushed.returncode == 0, pushed.stderr
    doc = json.loads(pushed.stdout)
    assert doc["ok"] and doc["command"] == "push" and doc["manifestDigest"].startswith("sha256:")
    dest = tmp_path / "pulled"
    by_digest = f"oci://{registry.address}/models/cli@{doc['manifestDigest']}"
    pulled = cli("pull", by_digest, dest, "--trusted-key", pub, "--json", env=registry.env())
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["rootDigest"] == doc["rootDigest"]
    again = cli("pull", by_digest, dest, "--trusted-key", pub, "--json", env=registry.env())
    assert again.returncode == 1 and json.loads(again.stdout)["error"]["kind"] == "PolicyError"
