"""`modelsec attest push STORE BUNDLE...` writes into any store by URI, `oci://` included (and deletes).

Against a real registry (distribution 2.8, TLS + htpasswd, no referrers API; see tests/support/oci.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelsec.distribution.push_pull import push_model
from modelsec.policy import Policy
from modelsec.registry.client import RegistryOptions
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier import verify_attestations
from modelsec.verifier.stores import StoreOptions, open_store
from tests.conftest import run_cli, write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry

pytestmark = pytest.mark.integration


def _pushed_model(
    tmp_path: Path, key_dir: Path, registry: Registry, repo: str, seed: int
) -> tuple[Path, str]:
    model = write_tiny_model(tmp_path / repo, seed=seed)
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    sign_model(model, [key])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)
    pushed = push_model(model, f"oci://{registry.address}/models/{repo}:v1", policy, key, options=options)
    return model, pushed.root_digest


def test_attest_push_to_oci_store_then_list_verify_and_delete(
    tmp_path: Path, key_dir: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, root = _pushed_model(tmp_path, key_dir, registry, "attested", seed=21)
    # a second signature over the same model, by a key added later (another signer's evidence)
    extra = tmp_path / "sm2.sig"
    sign_model(model, [load_private_key_file(key_dir / "sm2.key.pem")], signature_paths={0: extra})
    store = f"oci://{registry.address}/models/attested"
    env = registry.env()

    r = run_cli("attest", "push", store, extra, "--json", env=env)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["stored"]
    assert row["created"] is True and row["rootDigest"] == f"sha256:{root}"
    assert row["source"].startswith(f"{store}@sha256:")
    again = run_cli("attest", "push", store, extra, "--json", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["stored"][0]["created"] is False

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    opened = open_store(store, StoreOptions())
    entries = opened.entries(root)
    assert row["id"] in {e.id for e in entries} and len(entries) == 2  # push's model.sig and this one
    sm2_policy = Policy.from_key_files([key_dir / "sm2.pub.pem"])
    assert verify_attestations(root, [e for e in entries if e.id == row["id"]], sm2_policy).ok
    listed = run_cli("attest", "list", model, "--store", store, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sum(b["path"] == row["source"] for b in json.loads(listed.stdout)["bundles"]) == 1

    gone = run_cli("attest", "delete", store, "--digest", root, "--id", row["id"], "--json", env=env)
    assert gone.returncode == 0, gone.stderr
    assert [e.id for e in opened.entries(root)] == [e.id for e in entries if e.id != row["id"]]
    missing = run_cli("attest", "delete", store, "--digest", root, "--id", row["id"], "--json", env=env)
    assert missing.returncode == 1 and json.loads(missing.stdout)["error"]["kind"] == "NotFoundError"
    opened.close()


def test_attest_push_refusals(tmp_path: Path, key_dir: Path, registry: Registry) -> None:
    model = write_tiny_model(tmp_path / "never-pushed", seed=22)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    store = f"oci://{registry.address}/models/never-pushed"
    # no model manifest tagged with this root digest: nothing to attach to, named with the bundle's path
    r = run_cli("attest", "push", store, model / "model.sig", "--json", env=registry.env())
    assert r.returncode == 1
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "AttestationError" and "push the model first" in error["message"]
    assert str(model / "model.sig") in error["message"]
    # the registry down: fail closed with the backend error
    down = run_cli("attest", "push", "oci://127.0.0.1:9/models/x", model / "model.sig", "--json")
    # (RegistryUnreachableError, the BackendUnavailableError that names the problem: nothing listens)
    assert down.returncode == 1 and json.loads(down.stdout)["error"]["kind"] == "RegistryUnreachableError"
    # usage: a store without bundles, or a store and --server at once
    assert run_cli("attest", "push", store).returncode == 2
    both = run_cli("attest", "push", store, model / "model.sig", "--server", "127.0.0.1:9")
    assert both.returncode == 2 and "not both" in both.stderr
    # a bundle that is not one: refused with its path
    junk = tmp_path / "junk.sig"
    junk.write_text("{}")
    bad = run_cli("attest", "push", store, junk, "--json", env=registry.env())
    assert bad.returncode == 1 and str(junk) in json.loads(bad.stdout)["error"]["message"]


def test_attest_push_to_a_directory_store(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m", seed=23)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    store = tmp_path / "store"
    r = run_cli("attest", "push", store, model / "model.sig", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["stored"]
    assert Path(row["source"]).is_file() and Path(row["source"]).parent.parent.parent == store


def test_concurrent_first_requests_all_authenticate(registry: Registry) -> None:
    """Threads sharing one client (the webhook's store) each get past the first 401 challenge."""
    import threading

    from modelsec.registry.client import RegistryClient

    for _ in range(5):
        client = RegistryClient(
            registry.address, RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD)
        )
        barrier, failures = threading.Barrier(8), []

        def first(
            client: RegistryClient = client,
            barrier: threading.Barrier = barrier,
            failures: list[str] = failures,
        ) -> None:
            barrier.wait()
            try:
                client.check()
            except Exception as e:  # noqa: BLE001 - counted below
                failures.append(repr(e))

        threads = [threading.Thread(target=first) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        client.close()
        assert failures == []
