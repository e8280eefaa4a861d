"""`modelsec storage-initializer`, KServe's calling convention, against a real registry (issue 28, item 3).

KServe appends `SRC DEST` to the ClusterStorageContainer's command and mounts an emptyDir at DEST; these tests
do the same into fresh directories, with the registry credentials in a Docker `config.json` (`$DOCKER_CONFIG`,
as a mounted `dockerconfigjson` Secret provides them). In-process runs name the policy with `--policy`
(`$MODELSEC_POLICY` is read once per process, by the runtime guard's start-up hook); the real process gets
it from `$MODELSEC_POLICY`, as the ClusterStorageContainer sets it. A refused model
leaves the destination as it was: empty, and no staging directory behind.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelsec.distribution.push_pull import PushResult, push_model
from modelsec.policy import Policy
from modelsec.registry.client import RegistryClient, RegistryOptions
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry
from tests.support.policies import key_policy, write_policy_file

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
STORAGE_CONTAINER = REPO_ROOT / "deploy/kserve/base/cluster-storage-container.yaml"


@pytest.fixture
def options(registry: Registry) -> RegistryOptions:
    return RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)


@pytest.fixture
def env(tmp_path: Path, registry: Registry, key_dir: Path) -> dict[str, str]:
    """What the ClusterStorageContainer gives the process: a policy file, a Docker config and the CA."""
    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {registry.address: {"auth": auth}}}))
    policy = write_policy_file(
        tmp_path / "policy.json",
        name="internal-models",
        match=f"oci://{registry.address}/models/**",
        keys=[key_dir / "ecdsa-p256.pub.pem"],
    )
    return {
        "POLICY": str(policy),  # not an environment variable: see the module docstring
        "DOCKER_CONFIG": str(docker),
        "MODELSEC_OCI_CA": str(registry.ca),
        "MODELSEC_OCI_USERNAME": None,  # type: ignore[dict-item]  # run_cli: None unsets
        "MODELSEC_OCI_PASSWORD": None,  # type: ignore[dict-item]
    }


def _push(
    root: Path,
    key_dir: Path,
    registry: Registry,
    options: RegistryOptions,
    repo: str,
    *,
    seed: int,
    signer: str = "ecdsa-p256",
) -> tuple[Path, PushResult]:
    model = write_tiny_model(root / f"model-{repo}", seed=seed)
    key = load_private_key_file(key_dir / f"{signer}.key.pem")
    sign_model(model, [key])
    trusted = Policy.from_key_files([key_dir / f"{signer}.pub.pem"])
    pushed = push_model(model, f"oci://{registry.address}/models/{repo}:v1", trusted, key, options=options)
    return model, pushed


def _uri(registry: Registry, repo: str, digest: str) -> str:
    return f"modelsec+oci://{registry.address}/models/{repo}@{digest}"


def _run(cli, env: dict[str, str], *args: str | Path) -> Any:
    """`modelsec storage-initializer --policy P ARGS` in-process, with the rest of `env`."""
    rest = {k: v for k, v in env.items() if k != "POLICY"}
    return cli("storage-initializer", "--policy", env["POLICY"], *args, env=rest)


def _log(stderr: str) -> dict[str, Any]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    record = json.loads(lines[0])
    assert record["component"] == "modelsec.storage-initializer"
    return dict(record)


def _empty_dir(root: Path) -> Path:
    """KServe's emptyDir: the mount point exists and is empty."""
    dest = root / "mnt-models"
    dest.mkdir()
    return dest


def _nothing_landed(dest: Path) -> None:
    assert dest.is_dir() and list(dest.iterdir()) == []  # no file of the model, no staging directory


def test_signed_model_lands_verified_in_the_empty_dir(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, env: dict[str, str], cli
) -> None:
    model, pushed = _push(tmp_path, key_dir, registry, options, "init-ok", seed=31)
    dest = _empty_dir(tmp_path)
    result = _run(cli, env, _uri(registry, "init-ok", pushed.manifest_digest), dest)
    assert result.returncode == 0, result.stderr
    signed = sorted(p.name for p in model.iterdir() if p.name != "model.sig")
    assert sorted(p.name for p in dest.iterdir()) == sorted([*signed, "model.sig"])  # no staging left
    for name in signed:
        assert (dest / name).read_bytes() == (model / name).read_bytes()
    assert verify_model(dest, key_policy(key_dir)).root_digest == pushed.root_digest
    record = _log(result.stderr)
    assert record["ok"] is True
    assert record["manifestDigest"] == pushed.manifest_digest
    assert record["rootDigest"] == f"sha256:{pushed.root_digest}"
    assert record["policy"] == {"file": env["POLICY"], "names": ["internal-models"]}
    assert record["signers"] == ["ecdsa-p256.pub.pem"]
    assert record["destination"] == str(dest)


def test_tag_is_resolved_to_the_digest_that_was_verified_and_logged(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, env: dict[str, str], cli
) -> None:
    _, pushed = _push(tmp_path, key_dir, registry, options, "init-tag", seed=32)
    dest = tmp_path / "models" / "base"  # a storageUris[].mountPath below the volume: created by the pull
    dest.parent.mkdir()
    result = _run(cli, env, f"modelsec+oci://{registry.address}/models/init-tag:v1", dest)
    assert result.returncode == 0, result.stderr
    record = _log(result.stderr)
    assert record["manifestDigest"] == pushed.manifest_digest
    assert record["reference"] == f"oci://{registry.address}/models/init-tag@{pushed.manifest_digest}"
    assert verify_model(dest, key_policy(key_dir)).root_digest == pushed.root_digest


def test_tampered_layer_is_refused_and_nothing_lands(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, env: dict[str, str], cli
) -> None:
    # blobs are shared by every repository of the registry: this model's shard is unique to this test
    _, pushed = _push(tmp_path, key_dir, registry, options, "init-tampered", seed=33)
    client = RegistryClient(registry.address, options)
    manifest = json.loads(client.get_manifest("models/init-tampered", pushed.manifest_digest)[0])
    client.close()
    shard = "model-00002-of-00002.safetensors"
    layer = next(x for x in manifest["layers"] if x["annotations"]["org.cncf.model.filepath"] == shard)
    blob = registry.blob_path(layer["digest"])
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    dest = _empty_dir(tmp_path)
    result = _run(cli, env, _uri(registry, "init-tampered", pushed.manifest_digest), dest)
    assert result.returncode == 1
    record = _log(result.stderr)
    assert record["ok"] is False and record["error"]["kind"] == "DigestMismatchError"
    assert shard in record["error"]["message"]
    _nothing_landed(dest)


def test_untrusted_signer_and_unsigned_model_are_refused_and_nothing_lands(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, env: dict[str, str], cli
) -> None:
    # signed and bound by a key the policy does not trust
    _, stranger = _push(tmp_path, key_dir, registry, options, "init-stranger", seed=34, signer="other")
    # an artifact with no evidence at all: the same layers, a manifest of its own, no referrers
    client = RegistryClient(registry.address, options)
    body, media_type, _ = client.get_manifest("models/init-stranger", stranger.manifest_digest)
    doc = json.loads(body)
    doc["annotations"] = {"unsigned": "yes"}
    unsigned = json.dumps(doc).encode()
    for layer in [*doc["layers"], doc["config"]]:
        # cross-repository blobs are not shared by distribution's API: copy them under the new name
        data = client.get_blob("models/init-stranger", layer["digest"], 2**24, what=layer["digest"])
        client.put_blob("models/init-unsigned", layer["digest"], len(data), data)
    client.put_manifest("models/init-unsigned", "v1", unsigned, media_type)
    client.close()
    unsigned_digest = "sha256:" + hashlib.sha256(unsigned).hexdigest()
    for repo, digest in (("init-stranger", stranger.manifest_digest), ("init-unsigned", unsigned_digest)):
        (tmp_path / repo).mkdir()
        dest = _empty_dir(tmp_path / repo)
        result = _run(cli, env, _uri(registry, repo, digest), dest)
        assert result.returncode == 1, repo
        record = _log(result.stderr)
        assert record["error"]["kind"] == "SignatureError", record
        assert "no binding" in record["error"]["message"]
        _nothing_landed(dest)


def test_a_destination_that_holds_files_is_refused_and_left_untouched(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, env: dict[str, str], cli
) -> None:
    _, pushed = _push(tmp_path, key_dir, registry, options, "init-full", seed=35)
    dest = _empty_dir(tmp_path)
    (dest / "config.json").write_text('{"planted": true}')
    stale = dest / ".modelsec-pull-0123"  # what a killed earlier run leaves: removed, as it is ours
    (stale / "sub").mkdir(parents=True)
    result = _run(cli, env, _uri(registry, "init-full", pushed.manifest_digest), dest)
    assert result.returncode == 1
    record = _log(result.stderr)
    assert (
        record["error"]["kind"] == "PolicyError"
        and "holds 1 entries (config.json)" in record["error"]["message"]
    )
    assert sorted(p.name for p in dest.iterdir()) == ["config.json"]
    assert (dest / "config.json").read_text() == '{"planted": true}'
    # with only a stale staging directory in it, the destination counts as empty
    (dest / "config.json").unlink()
    stale.mkdir()
    result = _run(cli, env, _uri(registry, "init-full", pushed.manifest_digest), dest)
    assert result.returncode == 0, result.stderr
    assert not stale.exists()
    assert verify_model(dest, key_policy(key_dir)).root_digest == pushed.root_digest


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("oci://registry.internal/models/llm@sha256:" + "a" * 64, "/mnt/models"), "modelsec+oci://"),
        (("s3://bucket/llm", "/mnt/models"), "modelsec+oci://"),
        (("modelsec+oci://registry.internal/models/LLM:v1", "/mnt/models"), "LLM"),
        (("modelsec+oci://registry.internal/models/llm:v1",), "SRC_URI DEST_PATH pairs"),
    ],
)
def test_usage_errors_name_what_is_wrong(tmp_path: Path, cli, args: tuple[str, ...], named: str) -> None:
    result = cli("storage-initializer", *args, "--policy", tmp_path / "unread.yaml")
    assert result.returncode == 2
    assert named in result.stderr
    assert not (tmp_path / "mnt").exists()


def test_the_cluster_storage_container_command_runs_kserves_arguments_in_a_real_process(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions, env: dict[str, str]
) -> None:
    """The process interface itself: the manifest's command, KServe's `SRC DEST` appended, the exit status."""
    spec = yaml.safe_load(STORAGE_CONTAINER.read_text())["spec"]
    command = spec["container"]["command"]
    assert spec["container"].get("args") is None  # KServe's args must not be overridden by ours
    exe = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert exe is not None, command
    _, pushed = _push(tmp_path, key_dir, registry, options, "init-process", seed=36)
    process_env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_OCI_")}
    process_env.update({k: v for k, v in env.items() if v is not None and k != "POLICY"})
    process_env["MODELSEC_POLICY"] = env["POLICY"]
    ok, refused = _empty_dir(tmp_path), tmp_path / "refused"
    refused.mkdir()
    runs = [
        subprocess.run(
            [exe, *command[1:], _uri(registry, "init-process", digest), str(dest)],
            capture_output=True,
            text=True,
            timeout=120,
            env=process_env,
            stdin=subprocess.DEVNULL,
        )
        for digest, dest in ((pushed.manifest_digest, ok), ("sha256:" + "0" * 64, refused))
    ]
    assert runs[0].returncode == 0, runs[0].stderr
    assert _log(runs[0].stderr)["manifestDigest"] == pushed.manifest_digest
    assert verify_model(ok, key_policy(key_dir)).root_digest == pushed.root_digest
    assert runs[1].returncode == 1 and _log(runs[1].stderr)["ok"] is False
    _nothing_landed(refused)
