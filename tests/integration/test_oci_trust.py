"""`pull` and admission by OCI digest trust bindings as `verify` trusts signatures (authorities, windows).

A binding signed by a certificate the policy's X.509 authority vouches for binds the manifest (no pinned
key needed); a binding signed by a pinned key outside its `validUntil` window does not. Against a real
registry (distribution 2.8, TLS + htpasswd; see tests/support/oci.py).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from modelsec.attestations.bundle import sign_statement
from modelsec.attestations.predicates.oci_binding import binding_statement
from modelsec.distribution.push_pull import bound_root_digests, pull_model, push_model
from modelsec.errors import SignatureError
from modelsec.policy import Policy
from modelsec.registry.client import (
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    RegistryOptions,
    descriptor,
)
from modelsec.registry.referrers import attach_bundle
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier import verify_model
from tests.conftest import write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry
from tests.support.pki import SAN, make_ca, make_leaf, with_certificate_chain, write_pem
from tests.support.policies import first_policy, policy_doc, policy_entry

pytestmark = pytest.mark.integration


@pytest.fixture
def options(registry: Registry) -> RegistryOptions:
    return RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)


def _nothing_landed(dest: Path) -> None:
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".modelsec-pull-")]


def _manifest_descriptor(client: RegistryClient, repo: str, digest: str) -> dict[str, object]:
    return descriptor(MANIFEST_MEDIA_TYPE, client.get_manifest(repo, digest)[0])


def test_certificate_signed_binding_and_model_pull_through_the_policy_authority(
    tmp_path: Path, registry: Registry, options: RegistryOptions
) -> None:
    root = make_ca("corp root")
    intermediate = make_ca("corp signing intermediate", root)
    leaf = make_leaf(intermediate)
    signer = load_private_key_file(leaf.key_pem(tmp_path / "leaf.key.pem"))
    chain = (leaf.cert, intermediate.cert, root.cert)
    model = write_tiny_model(tmp_path / "m", seed=11)
    sign_model(model, [signer])
    (model / "model.sig").write_bytes(with_certificate_chain((model / "model.sig").read_bytes(), *chain))
    write_pem(tmp_path / "root.pem", root.cert)
    authority = {
        "name": "corp",
        "roles": ["weights"],
        "x509": {"roots": ["root.pem"], "identities": [{"san": SAN}]},
    }
    policy = first_policy(policy_doc(policy_entry(match="oci://**", authorities=[authority])), tmp_path)
    assert not policy.keys and verify_model(model, policy)  # the model verifies through the authority alone

    pushed = push_model(model, f"oci://{registry.address}/models/cert:v1", policy, signer, options=options)
    # the binding push signs carries a key hint, not the certificate: no authority can vouch for it
    ref = f"oci://{registry.address}/models/cert@{pushed.manifest_digest}"
    assert bound_root_digests(ref, policy, options=options) == set()
    client = RegistryClient(registry.address, options)
    subject = _manifest_descriptor(client, "models/cert", pushed.manifest_digest)
    binding = sign_statement(
        binding_statement(
            "models/cert", pushed.manifest_digest, pushed.root_digest, model_name="m", artifact_type="x"
        ),
        signer,
    )
    attach_bundle(client, "models/cert", subject, with_certificate_chain(binding, *chain))
    client.close()

    assert bound_root_digests(ref, policy, options=options) == {pushed.root_digest}
    dest = tmp_path / "pulled"
    result = pull_model(ref, dest, policy, options=options)
    assert result.root_digest == pushed.root_digest
    assert verify_model(dest, policy).root_digest == pushed.root_digest

    # the same authority naming another identity does not vouch for the binding (nor the model)
    stranger = {**authority, "x509": {"roots": ["root.pem"], "identities": [{"san": "intern@corp.example"}]}}
    other = first_policy(policy_doc(policy_entry(match="oci://**", authorities=[stranger])), tmp_path)
    assert bound_root_digests(ref, other, options=options) == set()
    with pytest.raises(SignatureError, match="no binding"):
        pull_model(ref, tmp_path / "refused", other, options=options)
    _nothing_landed(tmp_path / "refused")


def test_binding_signed_after_its_key_window_is_refused(
    tmp_path: Path, key_dir: Path, registry: Registry, options: RegistryOptions
) -> None:
    model = write_tiny_model(tmp_path / "m", seed=12)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    binder = load_private_key_file(key_dir / "other.key.pem")
    model_key = {"path": str(key_dir / "ecdsa-p256.pub.pem"), "roles": ["weights"]}
    now = datetime.datetime.now(datetime.UTC)

    def with_binder_window(**window: str) -> Policy:
        keys = [model_key, {"path": str(key_dir / "other.pub.pem"), **window}]
        return first_policy(policy_doc(policy_entry(match="oci://**", keys=keys)), tmp_path)

    rotated = with_binder_window(validUntil=(now - datetime.timedelta(days=1)).isoformat())
    current = with_binder_window(validUntil=(now + datetime.timedelta(days=1)).isoformat())
    pushed = push_model(model, f"oci://{registry.address}/models/window:v1", current, binder, options=options)
    ref = f"oci://{registry.address}/models/window@{pushed.manifest_digest}"
    assert bound_root_digests(ref, current, options=options) == {pushed.root_digest}
    # the binder key was rotated out before now and the binding has no trusted timestamp: not evidence
    assert bound_root_digests(ref, rotated, options=options) == set()
    dest = tmp_path / "pulled"
    with pytest.raises(SignatureError, match="validUntil"):
        pull_model(ref, dest, rotated, options=options)
    _nothing_landed(dest)
    assert pull_model(ref, dest, current, options=options).root_digest == pushed.root_digest
