"""A real CNCF distribution registry (Debian's `docker-registry`, 2.8) on 127.0.0.1 with TLS and htpasswd.

Distribution 2.8 has no referrers API and no OCI artifact manifests: image manifests with `artifactType` /
`subject` and the referrers tag-schema fallback are what it serves, as many registries in the field do.
`make test` installs the package (`apt-get install -y docker-registry`); without it the tests skip and
say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from modelsec.registry.client import (
    BUNDLE_ARTIFACT_TYPE,
    EMPTY_CONFIG,
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    canonical_json,
    descriptor,
)
from tests.support.pki import TestCA

REGISTRY_BINARY = "docker-registry"
USER, PASSWORD = "ci", "s3cret-registry-password"


@dataclass
class Registry:
    """A running registry: its `host:port`, CA, credentials and storage directory."""

    address: str
    ca: Path
    storage: Path
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        return {
            "MODELSEC_OCI_USERNAME": USER,
            "MODELSEC_OCI_PASSWORD": PASSWORD,
            "MODELSEC_OCI_CA": str(self.ca),
        }

    def blob_path(self, digest: str) -> Path:
        hex_ = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hex_[:2] / hex_ / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _htpasswd(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # bcrypt through libxcrypt; the registry accepts only bcrypt entries

        hashed = crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 5))
    path.write_text(f"{USER}:{hashed}\n")


@contextlib.contextmanager
def run_registry(directory: Path) -> Iterator[Registry]:
    """Start `docker-registry` on a free loopback port; yields once `/v2/` answers (401: auth required)."""
    binary = shutil.which(REGISTRY_BINARY) or shutil.which(REGISTRY_BINARY, path="/usr/bin")
    if binary is None:
        raise FileNotFoundError(REGISTRY_BINARY)
    ca = TestCA.create(directory / "ca")
    cert, key = ca.issue_server(directory / "ca")
    _htpasswd(directory / "htpasswd")
    port = _free_port()
    storage = directory / "storage"
    config = directory / "config.yml"
    config.write_text(
        f"""version: 0.1
log: {{level: error, accesslog: {{disabled: true}}}}
storage:
  filesystem: {{rootdirectory: {storage}}}
  delete: {{enabled: true}}
http:
  addr: 127.0.0.1:{port}
  tls: {{certificate: {cert}, key: {key}}}
auth:
  htpasswd: {{realm: modelsec-test, path: {directory / "htpasswd"}}}
"""
    )
    log = open(directory / "registry.log", "wb")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if (
                    requests.get(f"https://127.0.0.1:{port}/v2/", verify=str(ca.path), timeout=1).status_code
                    == 401
                ):
                    break
            except requests.RequestException:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "registry did not start: " + (directory / "registry.log").read_text()[-2000:]
                )
            time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", ca.path, storage, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def registry_missing_reason() -> str | None:
    if shutil.which(REGISTRY_BINARY) or os.path.exists(f"/usr/bin/{REGISTRY_BINARY}"):
        return None
    return (
        "the CNCF distribution registry is not installed: `apt-get install -y docker-registry` "
        "(the Makefile's test set-up does it where apt-get exists)"
    )


def flood_referrers(
    client: RegistryClient, repo: str, subject: dict[str, Any], artifact_type: str, layer: bytes, count: int
) -> None:
    """Attach `count` distinct referrers of `artifact_type` (one shared layer), as a pusher does.

    The fallback index is written once (the registry checks that each listed manifest exists).
    """
    client.put_blob(repo, str(EMPTY_CONFIG["digest"]), 2, b"{}")
    layer_desc = descriptor(BUNDLE_ARTIFACT_TYPE, layer)
    client.put_blob(repo, layer_desc["digest"], len(layer), layer)
    tag = subject["digest"].replace(":", "-")
    index = json.loads(client.get_manifest(repo, tag)[0])
    for i in range(count):
        manifest = canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "artifactType": artifact_type,
                "config": EMPTY_CONFIG,
                "layers": [layer_desc],
                "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
                "annotations": {"junk": str(i)},
            }
        )
        desc = descriptor(MANIFEST_MEDIA_TYPE, manifest, artifactType=artifact_type)
        client.put_manifest(repo, desc["digest"], manifest, MANIFEST_MEDIA_TYPE)
        index["manifests"].append(desc)
    client.put_manifest(repo, tag, canonical_json(index), INDEX_MEDIA_TYPE)
