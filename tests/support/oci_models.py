"""Signed tiny models pushed to the session's `registry`, and the options and policies that read them back.

Kept apart from `tests.support.oci` (which the fixture plugin loads for every test) so that only the tests
that push models import the distribution code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelsec.distribution.push_pull import PushResult, push_model
from modelsec.policy import Policy, PolicySet
from modelsec.registry.client import RegistryOptions
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry
from tests.support.policies import policy_doc, policy_entry


def registry_options(
    registry: Registry, *, ca: Path | None = None, password: str = PASSWORD
) -> RegistryOptions:
    """Client options for `registry`: its CA (or `ca`), the test credentials, a 5 s timeout."""
    return RegistryOptions(ca_file=ca or registry.ca, username=USER, password=password, timeout=5)


def models_policies(
    registry: Registry, key_dir: Path, key: str = "ecdsa-p256.pub.pem", **fields: Any
) -> PolicySet:
    """One policy `models` over `oci://<registry>/models/**` trusting the test key `key` (plus `fields`)."""
    entry = policy_entry(name="models", match=f"oci://{registry.address}/models/**", keys=[key], **fields)
    return PolicySet.from_mapping(policy_doc(entry), base_dir=key_dir, source="test-policy")


def push_tiny_model(
    root: Path, key_dir: Path, registry: Registry, repo: str, *, seed: int = 0
) -> tuple[Path, PushResult]:
    """A 1-shard tiny model in `root/repo`, signed and bound with the P-256 test key, pushed as
    `oci://<registry>/models/<repo>:v1` (evidence and binding as referrers); returns it and the push."""
    model = write_tiny_model(root / repo, shards=1, seed=seed)
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    sign_model(model, [signer])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    reference = f"oci://{registry.address}/models/{repo}:v1"
    return model, push_model(model, reference, policy, signer, options=registry_options(registry))
