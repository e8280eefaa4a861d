"""`modelsec receipts verify | list | snapshot` in-process (`cli`), on receipts of two real software TPMs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modelsec.policy import PolicySet
from modelsec.verifier import load_model, verify_model
from modelsec.verifier.receipts import emit_load_receipt
from tests.integration.test_load_receipts import _policy, _receipts
from tests.support.policies import policy_doc, policy_entry, write_policy_doc
from tests.support.tpm import SoftwareTpm

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


@pytest.fixture
def loaded(
    tmp_path: Path,
    key_dir: Path,
    cli: Callable[..., Any],
    swtpm: SoftwareTpm,
    swtpm_other: SoftwareTpm,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Path, str]:
    """A signed model loaded once by node-a (its receipt in the store) and once by node-b; the policy."""
    from tests.conftest import write_tiny_model

    torch.set_num_threads(1)
    model = write_tiny_model(tmp_path / "model", seed=34)
    assert cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    policy = _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem, "node-b": swtpm_other.ak_pem})
    policies = PolicySet.from_file(policy)
    monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
    load_model(model, policies)
    root = verify_model(model, policies).root_digest
    req = policies.policies[0].load_receipt
    assert req is not None
    emit_load_receipt(
        req, root_digest=root, model_name="model", files=[], tensors=0, device="cpu", policy_digest="",
        pinned_digests=(), tpm=swtpm_other.ak,
    )  # fmt: skip
    return policy, root


def _a_receipt(tmp_path: Path, node_key: str) -> Path:
    import base64

    for path in _receipts(tmp_path):
        payload = json.loads(path.read_bytes())["dsseEnvelope"]["payload"]
        if node_key in base64.b64decode(payload).decode():
            return path
    raise AssertionError("no receipt of that node")


def _keyid(pem: Path) -> str:
    from modelsec.signer.keys import load_trusted_key_file

    return load_trusted_key_file(pem).keyid


def test_receipts_verify_exit_codes(
    tmp_path: Path, key_dir: Path, cli: Callable[..., Any], loaded: tuple[Path, str], swtpm: SoftwareTpm
) -> None:
    policy, root = loaded
    receipt = _a_receipt(tmp_path, _keyid(swtpm.ak_pem))
    r = cli("receipts", "verify", receipt, "--policy", policy, "--model-digest", f"sha256:{root}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"OK load receipt: node node-a loaded sha256:{root} at ")
    r = cli("receipts", "verify", receipt, "--policy", policy, "--node", "node-a", "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["receipt"]["node"] == "node-a"
    assert doc["receipt"]["model"] == f"sha256:{root}" and doc["receipt"]["device"] == "cpu"
    # Refused: exit 1, the reason named.
    r = cli(
        "receipts", "verify", receipt, "--policy", policy, "--model-digest", "sha256:" + "0" * 64, "--json"
    )
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["reason"] == "model-digest"
    assert doc["error"]["kind"] == "ReceiptError"
    r = cli("receipts", "verify", receipt, "--policy", policy, "--node", "node-b")
    assert r.returncode == 1 and "signed by node 'node-a', not 'node-b'" in r.stderr
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(receipt.read_bytes().replace(b'"attest": "', b'"attest": "AAAA'))
    r = cli("receipts", "verify", tampered, "--policy", policy, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["ok"] is False
    # Usage: a policy without loadReceipt, a missing file, a bad digest.
    bare = write_policy_doc(
        tmp_path / "bare.json", policy_doc(policy_entry(keys=[key_dir / "ecdsa-p256.pub.pem"]))
    )
    r = cli("receipts", "verify", receipt, "--policy", bare)
    assert r.returncode == 2 and "has no entry with a loadReceipt" in r.stderr
    r = cli("receipts", "verify", tmp_path / "missing.json", "--policy", policy)
    assert r.returncode == 2
    assert cli("receipts", "verify", "--help").returncode == 0


def test_receipts_list_shows_which_nodes_loaded_the_model(
    tmp_path: Path, cli: Callable[..., Any], loaded: tuple[Path, str], swtpm: SoftwareTpm
) -> None:
    policy, root = loaded
    # A receipt changed after it was written is listed as refused, not as a load.
    receipt = _a_receipt(tmp_path, _keyid(swtpm.ak_pem))
    forged = receipt.with_name(receipt.name.replace("-", "-9", 1))
    doc = json.loads(receipt.read_bytes())
    doc["tpmQuote"]["pcrs"]["sha256"]["0"] = "ff" * 32
    forged.write_text(json.dumps(doc))
    r = cli("receipts", "list", f"sha256:{root}", "--policy", policy, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert sorted(x["node"] for x in out["receipts"]) == ["node-a", "node-b"]
    assert all(x["model"] == f"sha256:{root}" for x in out["receipts"])
    assert [x["reason"] for x in out["refused"]] == ["pcr"]
    assert out["refused"][0]["source"] == str(forged)
    r = cli("receipts", "list", f"sha256:{root}", "--policy", policy)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["NODE", "LOADED", "AT"]
    assert {line.split()[0] for line in lines[1:3]} == {"node-a", "node-b"}
    assert lines[3].startswith("REFUSED") and lines[-1].endswith("1 refused")
    # Another model: nothing listed. A malformed MODEL: usage.
    r = cli("receipts", "list", "sha256:" + "1" * 64, "--policy", policy, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["receipts"] == []
    assert cli("receipts", "list", "sha256:xyz", "--policy", policy).returncode == 2


def test_receipts_snapshot_signs_this_nodes_loads(
    tmp_path: Path,
    cli: Callable[..., Any],
    loaded: tuple[Path, str],
    swtpm: SoftwareTpm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy, root = loaded
    monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
    r = cli("receipts", "snapshot", "--policy", policy, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # node-a's load only: node-b's receipt is in the same store but another TPM quoted it.
    assert [x["model"] for x in out["loads"]] == [f"sha256:{root}"]
    assert len(out["skipped"]) == 1 and "node-b" in out["skipped"][0]["reason"]
    stored = Path(out["stored"])
    r = cli("receipts", "verify", stored, "--policy", policy, "--node", "node-a", "--json")
    assert r.returncode == 0, r.stdout
    snap = json.loads(r.stdout)["snapshot"]
    assert snap["node"] == "node-a" and [x["model"] for x in snap["loads"]] == [f"sha256:{root}"]
    # A snapshot is not about a model: --model-digest is a usage error; node-b's name is refused.
    r = cli("receipts", "verify", stored, "--policy", policy, "--model-digest", f"sha256:{root}")
    assert r.returncode == 2
    r = cli("receipts", "verify", stored, "--policy", policy, "--node", "node-b", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["reason"] == "node"
    # Loads before --since are not counted; an unreachable TPM exits 1 and writes nothing.
    r = cli("receipts", "snapshot", "--policy", policy, "--since", "2999-01-01T00:00:00", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["loads"] == []
    before = sorted((tmp_path / "receipts").glob("*.snapshot.json"))
    monkeypatch.setenv("TPM2TOOLS_TCTI", "swtpm:host=127.0.0.1,port=1")
    from modelsec.verifier import receipts as receipts_module

    monkeypatch.setattr(receipts_module, "_AK_IDS", {})
    r = cli("receipts", "snapshot", "--policy", policy)
    assert r.returncode == 1 and "TPM" in r.stderr
    assert sorted((tmp_path / "receipts").glob("*.snapshot.json")) == before


def test_receipts_go_to_the_registry_as_referrers_of_the_model(
    tmp_path: Path,
    key_dir: Path,
    cli: Callable[..., Any],
    registry: Any,
    swtpm: SoftwareTpm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from modelsec.errors import BackendUnavailableError
    from modelsec.verifier.stores.oci import OciAttestationStore
    from tests.support.oci_models import push_tiny_model, registry_options

    torch.set_num_threads(1)
    model, _ = push_tiny_model(tmp_path, key_dir, registry, "receipts33", seed=35)
    for k, v in registry.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
    store = f"oci://{registry.address}/models/receipts33"
    policy = _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}, store=store, required=True)
    policies = PolicySet.from_file(policy)
    assert load_model(model, policies)
    root = verify_model(model, policies).root_digest
    assert _receipts(tmp_path) == []  # nowhere on the node's disk
    r = cli("receipts", "list", model, "--policy", policy, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert [(x["node"], x["model"]) for x in out["receipts"]] == [("node-a", f"sha256:{root}")]
    assert out["receipts"][0]["source"].startswith(f"{store}@sha256:")
    assert out["refused"] == []
    # Evidence readers of the same manifest do not see receipts (another artifactType).
    evidence = OciAttestationStore.open(
        f"{registry.address}/models/receipts33",
        max_bundle_bytes=2**20,
        max_bundles=64,
        options=registry_options(registry),
    )
    assert all(b"load-receipt" not in b for b in evidence.bundles(root))
    # Required, and the registry holds no such model: the load fails closed.
    other = _policy(
        tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}, store=f"{store}-absent", required=True
    )
    result = None
    with pytest.raises(BackendUnavailableError, match="push the model first"):
        result = load_model(model, PolicySet.from_file(other))
    assert result is None


def test_receipts_verify_previous_checks_the_tpm_clock(
    tmp_path: Path, cli: Callable[..., Any], loaded: tuple[Path, str], swtpm: SoftwareTpm
) -> None:
    from datetime import UTC, datetime, timedelta

    policy, root = loaded
    first = _a_receipt(tmp_path, _keyid(swtpm.ak_pem))
    req = PolicySet.from_file(policy).policies[0].load_receipt
    assert req is not None

    def emit(now: datetime | None = None) -> str:
        where = emit_load_receipt(
            req, root_digest=root, model_name="model", files=[], tensors=0, device="cpu", policy_digest="",
            pinned_digests=(), tpm=swtpm.ak, now=now,
        )  # fmt: skip
        assert where is not None
        return where

    r = cli("receipts", "verify", emit(), "--policy", policy, "--previous", first)
    assert r.returncode == 0, r.stderr
    # Quoted now, dated an hour ahead: --history drops maxAge, the TPM clock against --previous refuses it.
    predated = emit(datetime.now(UTC) + timedelta(hours=1))
    r = cli("receipts", "verify", predated, "--policy", policy, "--previous", first, "--history", "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["reason"] == "stale" and "TPM clock" in out["error"]["message"]
