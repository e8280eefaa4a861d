"""Load receipts (issue 33): a stale quote is refused, by the TSA's time and by the TPM clock.

Real parts: a software TPM (`tests/support/tpm.py`) and an `openssl ts` TSA on loopback
(`tests/integration/test_rfc3161.py`). A "stale" receipt is one whose statement's time is far from when the
TPM quoted it: a node that quotes a receipt now and dates it later (to present it then), or backdates it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import ReceiptError
from modelsec.policy import PolicySet
from modelsec.policy.requirements import LoadReceiptRequirement
from modelsec.verifier.receipts import emit_load_receipt, list_receipts, verify_receipt
from tests.integration.test_load_receipts import PCRS
from tests.integration.test_rfc3161 import pytestmark as needs_openssl
from tests.integration.test_rfc3161 import tsa  # noqa: F401 - the module-scoped TSA fixture
from tests.support.policies import policy_doc, policy_entry, write_policy_doc
from tests.support.tpm import SoftwareTpm

pytestmark = [pytest.mark.integration, needs_openssl]
ROOT = "ab" * 32


def _requirement(tmp_path: Path, key_dir: Path, node: SoftwareTpm, **receipt: Any) -> LoadReceiptRequirement:
    tsas = receipt.pop("tsas", None)
    settings = {
        "pcrs": {str(i): node.pcr(i) for i in PCRS},
        "nodes": [{"name": "node-a", "key": str(node.ak_pem)}],
        "store": str(tmp_path / "receipts"),
        "window": "30s",
        **receipt,
    }
    extra = {"timestampAuthorities": tsas} if tsas else {}
    entry = policy_entry(keys=[key_dir / "ecdsa-p256.pub.pem"], loadReceipt=settings, **extra)
    policy = write_policy_doc(tmp_path / "policy.json", policy_doc(entry))
    req = PolicySet.from_file(policy).policies[0].load_receipt
    assert req is not None
    return req


def _emit(req: LoadReceiptRequirement, node: SoftwareTpm, now: datetime | None = None) -> bytes:
    where = emit_load_receipt(
        req, root_digest=ROOT, model_name="m", files=["model.safetensors"], tensors=2, device="cpu",
        policy_digest="", pinned_digests=(), tpm=node.ak, now=now,
    )  # fmt: skip
    assert where is not None
    return Path(where).read_bytes()


def _reason(data: bytes, req: LoadReceiptRequirement, **kw: Any) -> ReceiptError:
    with pytest.raises(ReceiptError) as e:
        verify_receipt(data, req, **kw)
    return e.value


def test_the_tpm_clock_refuses_a_receipt_dated_later_than_it_was_quoted(
    tmp_path: Path, key_dir: Path, swtpm: SoftwareTpm
) -> None:
    req = _requirement(tmp_path, key_dir, swtpm)
    first = verify_receipt(_emit(req, swtpm), req)
    second = _emit(req, swtpm)
    # Consecutive honest receipts: the TPM clock advanced as far as their times.
    assert verify_receipt(second, req, previous=first).node == "node-a"
    # Quoted now, dated an hour later (to be shown then as fresh): the TPM clock says otherwise.
    later = datetime.now(UTC) + timedelta(hours=1)
    predated = _emit(req, swtpm, now=later)
    e = _reason(predated, req, previous=first, now=later + timedelta(seconds=5))
    assert e.reason == "stale"
    assert "TPM clock" in e.detail
    # Without an earlier quote there is nothing to measure the clock from: only maxAge applies.
    assert verify_receipt(predated, req, now=later + timedelta(seconds=5)).node == "node-a"
    # `receipts list` chains a node's receipts by time and refuses the one that does not fit.
    rows = list_receipts(req, ROOT, now=later + timedelta(seconds=5))
    refused = [r for r in rows if r.verified is None]
    assert [r.reason for r in refused] == ["stale"]
    assert refused[0].source.endswith(".receipt.json") and "TPM clock" in refused[0].detail
    assert sum(1 for r in rows if r.verified is not None) == 2


def test_a_tsa_time_away_from_the_receipts_time_is_refused(
    tmp_path: Path,
    key_dir: Path,
    swtpm: SoftwareTpm,
    tsa: tuple[str, Path],  # noqa: F811
) -> None:
    url, root = tsa
    tsas = [{"name": "tsa", "certChain": [str(root)]}]
    req = _requirement(tmp_path, key_dir, swtpm, timestampUrl=url, tsas=tsas)
    data = _emit(req, swtpm)
    verified = verify_receipt(data, req)
    assert verified.timestamp is not None
    assert abs((verified.timestamp - verified.receipt.loaded_at).total_seconds()) < 30
    # Backdated an hour: the TSA saw the quote now (maxAge off: the TSA's time alone refuses it).
    earlier = datetime.now(UTC) - timedelta(hours=1)
    backdated = _emit(req, swtpm, now=earlier)
    e = _reason(backdated, req, fresh=False)
    assert e.reason == "stale"
    assert "TSA dated the quote" in e.detail
    # The timestamp removed: the policy asks for one.
    doc = json.loads(data)
    del doc["rfc3161Timestamps"]
    assert _reason(json.dumps(doc).encode(), req).reason == "timestamp"
    # A timestamp over other bytes than this quote's signature (another receipt's).
    doc = json.loads(data)
    doc["rfc3161Timestamps"] = json.loads(backdated)["rfc3161Timestamps"]
    assert _reason(json.dumps(doc).encode(), req).reason == "timestamp"
    # A TSA the policy does not trust.
    other = dataclasses.replace(req, timestamp_authorities=())
    assert verify_receipt(data, dataclasses.replace(other, timestamp_url=None)).timestamp is None
    doc = json.loads(data)
    doc["rfc3161Timestamps"] = [base64.b64encode(b"\x30\x03\x02\x01\x00").decode()]
    assert _reason(json.dumps(doc).encode(), req).reason == "timestamp"


def test_a_policy_with_a_tsa_url_but_no_authority_is_refused(
    tmp_path: Path,
    key_dir: Path,
    swtpm: SoftwareTpm,
    tsa: tuple[str, Path],  # noqa: F811
) -> None:
    from modelsec.errors import PolicyError

    with pytest.raises(PolicyError, match="timestampUrl"):
        _requirement(tmp_path, key_dir, swtpm, timestampUrl=tsa[0])
