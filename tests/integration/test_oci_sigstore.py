"""Evidence other tools read: sigstore's OCI bundle layout, a binding about the manifest digest, `copy`.

Against the real registry (distribution 2.8: the fallback tag index) and a second registry instance of
its own (a cross-registry copy needs two registries; started once for this module). The binding and the
model signature are verified by a second implementation, sigstore-js (`@sigstore/verify`, installed by the
Makefile's test set-up under `.venv/sigstore-js`), and the bundles are checked against sigstore's bundle
protobuf specification (`sigstore_models`, sigstore-python's models of `sigstore_bundle.proto`).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.attestations.bundle import sign_statement
from modelsec.attestations.predicates.oci_binding import (
    LEGACY_OCI_BINDING_PREDICATE_TYPE,
    OCI_BINDING_PREDICATE_TYPE,
)
from modelsec.attestations.statement import Statement, Subject
from modelsec.distribution.copy import copy_model
from modelsec.distribution.push_pull import PushResult, bound_root_digests, pull_model, push_model
from modelsec.errors import NotFoundError, SignatureError
from modelsec.policy import Policy
from modelsec.registry.client import (
    BINDING_ARTIFACT_TYPE,
    BUNDLE_ARTIFACT_TYPE,
    EMPTY_CONFIG,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    RegistryOptions,
    descriptor,
)
from modelsec.registry.referrers import attach_bundle
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry, run_registry

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SIGSTORE_JS = Path(sys.prefix) / "sigstore-js" / "node_modules"
VERIFY_JS = REPO_ROOT / "tests/support/sigstore_js_verify.js"


@pytest.fixture
def options(registry: Registry) -> RegistryOptions:
    return RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)


@pytest.fixture(scope="module")
def second_registry(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """Another registry instance (its own CA and storage): the destination of cross-registry copies."""
    with run_registry(tmp_path_factory.mktemp("registry-b")) as running:
        yield running


def _push(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, repo: str
) -> PushResult:
    model = write_tiny_model(tmp_path / f"model-{repo}", seed=28)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    binder = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    return push_model(model, f"oci://{registry.address}/models/{repo}:v1", policy, binder, options=options)


def _referrers(client: RegistryClient, repo: str, digest: str) -> list[tuple[dict, dict, bytes]]:
    """(index descriptor, referrer manifest, bundle) of every referrer of `digest`."""
    out = []
    for desc in client.referrers(repo, digest):
        manifest = json.loads(client.get_manifest(repo, desc["digest"])[0])
        layer = manifest["layers"][0]
        out.append((desc, manifest, client.get_blob(repo, layer["digest"], 2**20, what="bundle")))
    return out


def _statement(bundle: bytes) -> dict:
    return json.loads(base64.b64decode(json.loads(bundle)["dsseEnvelope"]["payload"]))


def _sigstore_js(bundle: bytes, key: Path, subject: str, tmp_path: Path) -> dict:
    node = shutil.which("node")
    if node is None or not (SIGSTORE_JS / "@sigstore/verify").is_dir():
        pytest.skip("sigstore-js is not installed: `make .venv/.test` installs it under .venv/sigstore-js")
    path = tmp_path / "bundle.sigstore.json"
    path.write_bytes(bundle)
    run = subprocess.run(
        [node, str(VERIFY_JS), str(SIGSTORE_JS), str(path), str(key), subject],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not run.stderr.strip(), run.stderr
    return {**json.loads(run.stdout), "rc": run.returncode}


def test_referrers_follow_sigstores_oci_bundle_layout_and_bundle_spec(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions
) -> None:
    from sigstore_models.bundle.v1 import Bundle as ProtoBundle

    pushed = _push(tmp_path, key_dir, registry, options, "sig-layout")
    client = RegistryClient(registry.address, options)
    found = _referrers(client, "models/sig-layout", pushed.manifest_digest)
    assert len(found) == 2
    predicate_types = set()
    for desc, manifest, bundle in found:
        # cosign specs/BUNDLE_SPEC.md: the manifest, its one layer, its annotations, and the index entry
        assert manifest["artifactType"] == desc["artifactType"] == BUNDLE_ARTIFACT_TYPE
        assert manifest["config"] == EMPTY_CONFIG
        assert manifest["subject"]["digest"] == pushed.manifest_digest
        assert manifest["subject"]["mediaType"] == MANIFEST_MEDIA_TYPE
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == BUNDLE_ARTIFACT_TYPE
        assert layer["annotations"]["org.opencontainers.image.title"] == (
            layer["digest"].replace(":", "-") + ".sigstore.json"
        )
        statement = _statement(bundle)
        assert (
            manifest["annotations"]
            == desc["annotations"]
            == {
                "dev.sigstore.bundle.content": "dsse-envelope",
                "dev.sigstore.bundle.predicateType": statement["predicateType"],
            }
        )
        predicate_types.add(statement["predicateType"])
        # sigstore_bundle.proto, as sigstore-python models it: every field known, a v0.3 bundle
        parsed = ProtoBundle.from_json(bundle)
        assert parsed.media_type == BUNDLE_ARTIFACT_TYPE
        assert parsed.dsse_envelope is not None and parsed.message_signature is None
    assert predicate_types == {OCI_BINDING_PREDICATE_TYPE, "https://model_signing/signature/v1.0"}


def test_binding_is_about_the_manifest_digest_and_sigstore_js_verifies_it(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions
) -> None:
    pushed = _push(tmp_path, key_dir, registry, options, "sig-js")
    client = RegistryClient(registry.address, options)
    by_type = {
        _statement(bundle)["predicateType"]: bundle
        for _, _, bundle in _referrers(client, "models/sig-js", pushed.manifest_digest)
    }
    binding, signature = by_type[OCI_BINDING_PREDICATE_TYPE], by_type["https://model_signing/signature/v1.0"]
    manifest_hex = pushed.manifest_digest.removeprefix("sha256:")
    statement = _statement(binding)
    assert [s["digest"] for s in statement["subject"]] == [{"sha256": manifest_hex}]
    assert statement["subject"][0]["name"] == f"{registry.address}/models/sig-js"
    assert statement["predicate"]["model"]["digest"] == {"sha256": pushed.root_digest}

    pub = key_dir / "ecdsa-p256.pub.pem"
    ok = _sigstore_js(binding, pub, manifest_hex, tmp_path)
    assert ok["rc"] == 0 and ok["ok"], ok
    assert ok["predicate"]["model"]["digest"]["sha256"] == pushed.root_digest
    ok = _sigstore_js(signature, pub, pushed.root_digest, tmp_path)
    assert ok["rc"] == 0 and ok["ok"], ok
    # the second implementation can fail: another key, another artifact digest
    other = _sigstore_js(binding, key_dir / "other.pub.pem", manifest_hex, tmp_path)
    assert other["rc"] == 1 and "key not found" in other["error"]
    wrong = _sigstore_js(binding, pub, pushed.root_digest, tmp_path)
    assert wrong["rc"] == 1 and "not " + pushed.root_digest in wrong["error"]


def test_a_binding_is_accepted_only_under_the_manifest_it_names_as_subject(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions
) -> None:
    pushed = _push(tmp_path, key_dir, registry, options, "sig-moved")
    client = RegistryClient(registry.address, options)
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    # a binding a trusted key signed, attached to the manifest it names: read as before
    ref = f"oci://{registry.address}/models/sig-moved@{pushed.manifest_digest}"
    assert bound_root_digests(ref, policy, options=options) == {pushed.root_digest}
    # the same signed binding copied under another manifest (a re-tagged copy with another layer) binds
    # nothing there: its subject is not that manifest
    doc = json.loads(client.get_manifest("models/sig-moved", pushed.manifest_digest)[0])
    doc["annotations"]["org.opencontainers.image.description"] = "another manifest"
    other = json.dumps(doc).encode()
    other_desc = descriptor(MANIFEST_MEDIA_TYPE, other)
    client.put_manifest("models/sig-moved", "other", other, MANIFEST_MEDIA_TYPE)
    for _, _, bundle in _referrers(client, "models/sig-moved", pushed.manifest_digest):
        attach_bundle(client, "models/sig-moved", other_desc, bundle)
    moved = f"oci://{registry.address}/models/sig-moved@{other_desc['digest']}"
    assert bound_root_digests(moved, policy, options=options) == set()
    dest = tmp_path / "pulled"
    with pytest.raises(SignatureError, match="binding of another manifest") as e:
        pull_model(moved, dest, policy, options=options)
    assert pushed.manifest_digest in str(e.value)
    assert not dest.exists()


def test_a_deprecated_binding_about_the_root_digest_still_reads_with_a_note(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions
) -> None:
    model = write_tiny_model(tmp_path / "model", seed=29)
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    sign_model(model, [key])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    pushed = push_model(model, f"oci://{registry.address}/models/sig-v1:v1", policy, key, options=options)
    client = RegistryClient(registry.address, options)
    repo = "models/sig-v1"
    for desc, _, bundle in _referrers(client, repo, pushed.manifest_digest):
        if _statement(bundle)["predicateType"] == OCI_BINDING_PREDICATE_TYPE:
            client.delete_referrer(repo, desc["digest"], pushed.manifest_digest)
    # what push attached before this version: subject = root digest, its own artifactType, no annotations
    legacy = Statement(
        (Subject("model", {"sha256": pushed.root_digest}),),
        LEGACY_OCI_BINDING_PREDICATE_TYPE,
        {"manifestDigest": pushed.manifest_digest, "mediaType": MANIFEST_MEDIA_TYPE},
    )
    data, media_type, _ = client.get_manifest(repo, pushed.manifest_digest)
    subject = {"mediaType": media_type, "digest": pushed.manifest_digest, "size": len(data)}
    attach_bundle(client, repo, subject, sign_statement(legacy, key), BINDING_ARTIFACT_TYPE)
    ref = f"oci://{registry.address}/{repo}@{pushed.manifest_digest}"
    assert bound_root_digests(ref, policy, options=options) == {pushed.root_digest}
    result = pull_model(ref, tmp_path / "pulled", policy, options=options)
    assert result.root_digest == pushed.root_digest
    assert any("deprecated binding" in n and LEGACY_OCI_BINDING_PREDICATE_TYPE in n for n in result.notes)


def test_copy_to_another_registry_keeps_the_digest_and_the_evidence(
    tmp_path: Path,
    key_dir: Path,
    registry: Registry,
    second_registry: Registry,
    options: RegistryOptions,
    cli,
) -> None:
    pushed = _push(tmp_path, key_dir, registry, options, "sig-copy")
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    b_options = RegistryOptions(ca_file=second_registry.ca, username=USER, password=PASSWORD, timeout=5)
    b_client = RegistryClient(second_registry.address, b_options)

    # `skopeo copy` without evidence: the manifest and its blobs, no referrers -> pull from B refuses
    a_client = RegistryClient(registry.address, options)
    data, _, _ = a_client.get_manifest("models/sig-copy", pushed.manifest_digest)
    doc = json.loads(data)
    for blob in (doc["config"], *doc["layers"]):
        raw = a_client.get_blob("models/sig-copy", blob["digest"], 2**24, what="blob")
        b_client.put_blob("models/bare", blob["digest"], blob["size"], raw)
    b_client.put_manifest("models/bare", pushed.manifest_digest, data, MANIFEST_MEDIA_TYPE)
    bare = f"oci://{second_registry.address}/models/bare@{pushed.manifest_digest}"
    with pytest.raises(SignatureError, match="no binding"):
        pull_model(bare, tmp_path / "bare", policy, options=b_options)
    assert not (tmp_path / "bare").exists()

    # verify-before-copy under a key that signed nothing: refused, nothing written at B
    stranger = Policy.from_key_files([key_dir / "other.pub.pem"])
    source = f"oci://{registry.address}/models/sig-copy:v1"
    with pytest.raises(SignatureError):
        copy_model(
            source,
            f"oci://{second_registry.address}/models/refused",
            policy=stranger,
            source_options=options,
            destination_options=b_options,
        )
    with pytest.raises(NotFoundError):
        b_client.get_manifest("models/refused", pushed.manifest_digest)

    lines: list[str] = []
    copied = copy_model(
        source,
        f"oci://{second_registry.address}/models/mirror",
        policy=policy,
        source_options=options,
        destination_options=b_options,
        progress=lines.append,
    )
    assert copied.manifest_digest == pushed.manifest_digest and copied.verified
    assert copied.tags == ("v1", f"oms-sha256-{pushed.root_digest}")
    assert len(copied.referrers) == 2 and any(line.startswith("blob 1/") for line in lines)
    listed = b_client.referrers("models/mirror", pushed.manifest_digest)  # the fallback tag index at B
    assert sorted(d["digest"] for d in listed) == sorted(copied.referrers)
    assert all(d["annotations"]["dev.sigstore.bundle.content"] == "dsse-envelope" for d in listed)
    mirror = f"oci://{second_registry.address}/models/mirror@{pushed.manifest_digest}"
    result = pull_model(mirror, tmp_path / "from-b", policy, options=b_options)
    assert result.root_digest == pushed.root_digest and result.manifest_digest == pushed.manifest_digest
    assert bound_root_digests(
        f"oci://{second_registry.address}/models/mirror:v1", policy, options=b_options
    ) == {pushed.root_digest}

    # the CLI: one JSON object on stdout, progress on stderr; each registry with its own CA
    dest = f"oci://{second_registry.address}/models/cli:v2"
    run = cli(
        "copy", source, dest, "--destination-registry-ca", second_registry.ca, "--json", env=registry.env()
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["ok"] and doc["manifestDigest"] == pushed.manifest_digest and doc["verified"] is False
    assert doc["tags"] == ["v2", f"oms-sha256-{pushed.root_digest}"] and len(doc["referrers"]) == 2
    assert run.stderr == ""  # --json and no terminal: no progress line (see test_progress_terminal.py)
    cli_ref = f"oci://{second_registry.address}/models/cli:v2"
    assert pull_model(cli_ref, tmp_path / "cli", policy, options=b_options).root_digest == pushed.root_digest
