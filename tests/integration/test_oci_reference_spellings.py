"""`pull` matches the policy on the normalised reference: an alias of the registry is no laxer (issue 27.3).

A catch-all policy trusts the signing key; a strict one for `oci://localhost:<port>/models/**` also
requires a robustness attestation, which the model lacks. Every spelling of that registry
(`LOCALHOST:<port>`, a zero-padded port) is refused as the canonical one is, and nothing lands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.support.oci import Registry
from tests.support.policies import policy_doc, policy_entry, write_policy_doc

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_pull_under_an_alias_of_the_registry_gets_the_strict_policy(
    tmp_path: Path, key_dir: Path, registry: Registry, cli
) -> None:
    port = registry.address.rsplit(":", 1)[1]
    model = write_tiny_model(tmp_path / "m", shards=1, seed=273)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    pub, key = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    pushed = cli(
        "push",
        model,
        f"oci://localhost:{port}/models/spelling:v1",
        "--signing-key",
        key,
        "--trusted-key",
        pub,
        "--json",
        env=registry.env(),
    )
    assert pushed.returncode == 0, pushed.stderr
    digest = json.loads(pushed.stdout)["manifestDigest"]
    policy = write_policy_doc(
        tmp_path / "policy.json",
        policy_doc(
            policy_entry(name="lax", match="oci://**", keys=[pub]),
            policy_entry(
                name="strict",
                match=f"oci://localhost:{port}/models/**",
                keys=[pub],
                attestations={"robustness": {"minEps": 0.3, "minRobustAccuracy": 0.5}},
            ),
        ),
    )
    for i, host in enumerate([f"localhost:{port}", f"LOCALHOST:{port}", f"Localhost:0{port}"]):
        dest = tmp_path / f"pulled-{i}"
        ref = f"oci://{host}/models/spelling@{digest}"
        out = cli("pull", ref, dest, "--policy", policy, "--json", env=registry.env())
        assert out.returncode == 1, (host, out.stdout)
        assert json.loads(out.stdout)["error"]["kind"] == "AttestationError", (host, out.stdout)
        assert not dest.exists()
