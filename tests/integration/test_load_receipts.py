"""Load receipts (issue 33) on real software TPMs: emitted by `load_model`, verified, refused by reason.

Each refusal asserts `ReceiptError.reason`; the nodes are two swtpm instances (`tests/support/tpm.py`).
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from modelsec.attestations.statement import Statement, parse_statement, serialize_statement
from modelsec.errors import BackendUnavailableError, ReceiptError
from modelsec.policy import PolicySet
from modelsec.verifier import load_model
from modelsec.verifier.receipts import ReceiptWarning, emit_load_receipt, verify_receipt
from tests.support.policies import policy_doc, policy_entry, write_policy_doc
from tests.support.tpm import SoftwareTpm

pytest.importorskip("torch")

PCRS = (0, 7, 16)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _policy(
    tmp_path: Path, key_dir: Path, node: SoftwareTpm, *, nodes: dict[str, Path], **receipt: Any
) -> Path:
    settings = {
        "pcrs": {str(i): node.pcr(i) for i in PCRS},
        "nodes": [{"name": n, "key": str(p)} for n, p in nodes.items()],
        "store": str(tmp_path / "receipts"),
        **receipt,
    }
    entry = policy_entry(keys=[key_dir / "ecdsa-p256.pub.pem"], loadReceipt=settings)
    return write_policy_doc(tmp_path / "policy.json", policy_doc(entry))


@pytest.fixture
def signed_model(tmp_path: Path, key_dir: Path, cli: Callable[..., Any]) -> Path:
    from tests.conftest import write_tiny_model

    model = write_tiny_model(tmp_path / "model", seed=33)
    assert cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
    return model


def _receipts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "receipts").glob("*.receipt.json")) if (tmp_path / "receipts").exists() else []


def _loaded(
    tmp_path: Path, key_dir: Path, model: Path, node: SoftwareTpm, monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> tuple[PolicySet, dict[str, Any], bytes]:
    nodes = kw.pop("nodes", {"node-a": node.ak_pem})
    policies = PolicySet.from_file(_policy(tmp_path, key_dir, node, nodes=nodes, **kw))
    monkeypatch.setenv("TPM2TOOLS_TCTI", node.tcti)
    tensors = load_model(model, policies)
    (receipt,) = _receipts(tmp_path)
    return policies, tensors, receipt.read_bytes()


def test_a_load_emits_a_receipt_that_verifies(
    tmp_path: Path, key_dir: Path, signed_model: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "llm-0")
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    policies, tensors, data = _loaded(tmp_path, key_dir, signed_model, swtpm, monkeypatch)
    requirement = policies.policies[0].load_receipt
    assert requirement is not None
    from modelsec.verifier.loader import load_signed_model

    root = load_signed_model(signed_model, policies).root_digest
    verified = verify_receipt(data, requirement, expected_digest=root, node="node-a")
    assert verified.node == "node-a"
    r = verified.receipt
    assert r.root_digest == root
    assert r.tensors == len(tensors)
    assert r.device == "cpu"
    assert r.policy_digest == policies.digest
    assert dict(r.workload) == {"pod": "llm-0", "namespace": "serving"}
    assert set(r.files) == {p.name for p in signed_model.glob("*.safetensors")}


def test_refusals_name_their_reason(
    tmp_path: Path,
    key_dir: Path,
    signed_model: Path,
    swtpm: SoftwareTpm,
    swtpm_other: SoftwareTpm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policies, _, data = _loaded(
        tmp_path,
        key_dir,
        signed_model,
        swtpm,
        monkeypatch,
        nodes={"node-a": swtpm.ak_pem, "node-b": swtpm_other.ak_pem},
    )
    req = policies.policies[0].load_receipt
    assert req is not None
    doc = json.loads(data)
    statement = parse_statement(base64.b64decode(doc["dsseEnvelope"]["payload"]), what="t")
    root = statement.subjects[0].digest["sha256"]

    def reason(blob: bytes, requirement: Any = req, **kw: Any) -> str:
        with pytest.raises(ReceiptError) as e:
            verify_receipt(blob, requirement, **kw)
        return e.value.reason

    import dataclasses

    # Signed by a key no node registered.
    assert reason(data, dataclasses.replace(req, nodes=req.nodes[1:])) == "unregistered-key"
    # The quote is over another statement (a field changed after quoting).
    other = Statement(statement.subjects, statement.predicate_type, {**statement.predicate, "tensors": 1})
    forged = {
        **doc,
        "dsseEnvelope": {
            **doc["dsseEnvelope"],
            "payload": base64.b64encode(serialize_statement(other)).decode(),
        },
    }
    assert reason(json.dumps(forged).encode()) == "qualifying-data"
    # The policy expects another boot state.
    wrong = dict(req.pcrs)
    wrong[7] = bytes(32 - 1) + b"\x01"
    assert reason(data, dataclasses.replace(req, pcrs=wrong)) == "pcr"
    # About another model than the one loaded.
    assert reason(data, expected_digest="sha256:" + "0" * 64) == "model-digest"
    # Older than maxAge.
    loaded_at = verify_receipt(data, req, expected_digest=root).receipt.loaded_at
    late = loaded_at + timedelta(seconds=req.max_age_seconds + 1)
    assert reason(data, now=late) == "stale"
    # Verified as node-b's: it is node-a's.
    assert reason(data, node="node-b") == "node"


def test_a_changed_boot_state_is_refused(
    tmp_path: Path, key_dir: Path, signed_model: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy recorded the PCRs; then PCR 16 is extended (another boot state) before the load."""
    policy = _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem})
    swtpm.tools("tpm2_pcrextend", "16:sha256=" + "ab" * 32)
    try:
        monkeypatch.setenv("TPM2TOOLS_TCTI", swtpm.tcti)
        policies = PolicySet.from_file(policy)
        load_model(signed_model, policies)
    finally:
        swtpm.tools("tpm2_pcrreset", "16")
    (receipt,) = _receipts(tmp_path)
    req = policies.policies[0].load_receipt
    assert req is not None
    with pytest.raises(ReceiptError) as e:
        verify_receipt(receipt.read_bytes(), req)
    assert e.value.reason == "pcr"
    assert "PCR sha256:16" in e.value.detail


def test_a_receipt_replayed_from_another_node_is_refused(
    tmp_path: Path,
    key_dir: Path,
    signed_model: Path,
    swtpm: SoftwareTpm,
    swtpm_other: SoftwareTpm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = {"node-a": swtpm.ak_pem, "node-b": swtpm_other.ak_pem}
    policies, _, data = _loaded(tmp_path, key_dir, signed_model, swtpm, monkeypatch, nodes=nodes)
    req = policies.policies[0].load_receipt
    assert req is not None
    doc = json.loads(data)
    payload = base64.b64decode(doc["dsseEnvelope"]["payload"])
    # Node B's TPM quotes node A's statement: the statement names A's key, B signed.
    from modelsec.verifier.receipts import _qualifying_data, receipt_document

    quote = swtpm_other.ak.quote(_qualifying_data(payload), sorted(req.pcrs))
    with pytest.raises(ReceiptError) as e:
        verify_receipt(receipt_document(payload, quote), req)
    assert e.value.reason == "node"
    # Node B's own receipt, presented as node A's.
    b_receipt = emit_load_receipt(
        req,
        root_digest=parse_statement(payload, what="t").subjects[0].digest["sha256"],
        model_name="m",
        files=[],
        tensors=0,
        device="cpu",
        policy_digest="",
        pinned_digests=(),
        tpm=swtpm_other.ak,
    )
    assert b_receipt is not None
    assert verify_receipt(Path(b_receipt).read_bytes(), req).node == "node-b"
    with pytest.raises(ReceiptError) as e:
        verify_receipt(Path(b_receipt).read_bytes(), req, node="node-a")
    assert e.value.reason == "node"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_required_receipt_fails_the_load_closed_when_the_tpm_is_unreachable(
    tmp_path: Path, key_dir: Path, signed_model: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}, required=True)
    monkeypatch.setenv("TPM2TOOLS_TCTI", f"swtpm:host=127.0.0.1,port={_closed_port()}")
    result = None
    with pytest.raises(BackendUnavailableError, match="TPM"):
        result = load_model(signed_model, PolicySet.from_file(policy))
    assert result is None
    assert _receipts(tmp_path) == []


def test_an_optional_receipt_that_fails_warns_and_the_load_goes_on(
    tmp_path: Path, key_dir: Path, signed_model: Path, swtpm: SoftwareTpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem})
    monkeypatch.setenv("TPM2TOOLS_TCTI", f"swtpm:host=127.0.0.1,port={_closed_port()}")
    with pytest.warns(ReceiptWarning, match="TPM"):
        tensors = load_model(signed_model, PolicySet.from_file(policy))
    assert tensors
    assert _receipts(tmp_path) == []


@pytest.mark.parametrize("access", ["esys", "tools"])
def test_both_tpm_access_paths_make_receipts_that_verify(
    tmp_path: Path, key_dir: Path, swtpm: SoftwareTpm, access: str
) -> None:
    """The TSS bindings (tpm2-pytss) and tpm2-tools quote the same way; each receipt verifies."""
    from modelsec.signer.tpm import DEFAULT_AK_HANDLE, TpmAttestationKey, esys_available

    if access == "esys" and not esys_available():
        pytest.skip("tpm2-pytss not installed (make .venv/.test builds it against libtss2-dev)")
    req = PolicySet.from_file(_policy(tmp_path, key_dir, swtpm, nodes={"node-a": swtpm.ak_pem}))
    requirement = req.policies[0].load_receipt
    assert requirement is not None
    ak = TpmAttestationKey(DEFAULT_AK_HANDLE, tcti=swtpm.tcti, access=access)
    where = emit_load_receipt(
        requirement, root_digest="cd" * 32, model_name="m", files=["a.safetensors"], tensors=1,
        device="cpu", policy_digest="", pinned_digests=(), tpm=ak,
    )  # fmt: skip
    assert where is not None
    verified = verify_receipt(Path(where).read_bytes(), requirement, expected_digest="cd" * 32)
    assert verified.node == "node-a" and verified.quote.reset_count >= 0
    # Unreachable: the same error on both paths, nothing written.
    dead = TpmAttestationKey(
        DEFAULT_AK_HANDLE, tcti=f"swtpm:host=127.0.0.1,port={_closed_port()}", access=access
    )
    with pytest.raises(BackendUnavailableError, match="TPM"):
        dead.quote(b"x" * 32, [0])
