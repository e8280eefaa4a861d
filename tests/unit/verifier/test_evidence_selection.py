"""Evidence is selected, not voted (issue 14, item 3): stale, untrusted or superseded bundles never veto,
the newest applicable gate (and watermark record) decides, and stores can delete and supersede records."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.cli.main import main
from modelsec.errors import NotFoundError
from modelsec.policy import PolicySet
from modelsec.signer import load_private_key_file
from modelsec.verifier import verify_attestations, verify_model
from modelsec.verifier.attestations import GATE_PREDICATE_TYPE, store_bundle
from modelsec.verifier.stores import StoreOptions, open_store
from modelsec.verifier.stores.directory import DirectoryStore
from modelsec.verifier.stores.sqlite import SqliteAttestationStore
from modelsec.webhook.review import Reviewer, WebhookConfig
from tests.unit.verifier.test_joint_verification import (  # noqa: F401
    NOW,
    _bundles,
    gate_predicate,
    setup,
    watermark_predicate,
)
from tests.unit.webhook.test_review import REGISTRY, answer, policies, review_body, signed  # noqa: F401


def _at(days_ago: float) -> str:
    return (NOW - timedelta(days=days_ago)).isoformat().replace("+00:00", "Z")


def _gate(s: dict[str, Any], days_ago: float, verdict: str = "PASSED", **changes: Any) -> bytes:
    return s["attest"](
        "gate", gate_predicate(finishedAt=_at(days_ago), **{"gate.verdict": verdict}, **changes)
    )


def _verdict(s: dict[str, Any], gates: list[bytes], **kw: Any) -> Any:
    bundles = _bundles(s)
    bundles[2:3] = gates  # the gate slot of `_bundles` holds these instead
    return verify_attestations(s["root"], bundles, s["policy"], now=NOW, **kw)


def test_a_stale_passed_gate_does_not_veto_a_fresh_one(setup: dict[str, Any]) -> None:  # noqa: F811
    """Old code: a 40-day-old PASSED gate beside a fresh one made a `maxAge: 30d` policy deny the model."""
    verdict = _verdict(setup, [_gate(setup, 40), _gate(setup, 1)])
    assert verdict.ok, verdict.reasons()
    assert [i for i in verdict.ignored if "stale (40.0 days old; maxAge 30.0 days)" in i]
    assert not verdict.refused
    # A stale FAILED gate is ignored all the same: freshness comes before the verdict.
    assert _verdict(setup, [_gate(setup, 1), _gate(setup, 40, "FAILED")]).ok
    # A stale gate alone is no evidence: the requirement is missing (and the reason is listed).
    alone = _verdict(setup, [_gate(setup, 40)])
    assert alone.missing == ("robustness: no robustness-gate attestation",)
    assert any("stale" in r for r in alone.reasons())


def test_the_newest_applicable_gate_decides(setup: dict[str, Any]) -> None:  # noqa: F811
    """Old code: an older FAILED gate vetoed a newer PASSED one (any failing statement vetoed)."""
    older_failed = _verdict(setup, [_gate(setup, 5, "FAILED"), _gate(setup, 1)])
    assert older_failed.ok, older_failed.reasons()
    assert older_failed.superseded and "superseded by the newer" in older_failed.superseded[0]
    # A newer FAILED beats an older PASSED, in either order of the bundles.
    for gates in ([_gate(setup, 5), _gate(setup, 1, "FAILED")], [_gate(setup, 1, "FAILED"), _gate(setup, 5)]):
        newer_failed = _verdict(setup, gates)
        assert not newer_failed.ok
        assert len(newer_failed.refused) == 1 and "verdict is 'FAILED'" in newer_failed.refused[0]
    # At the same time a failure wins (fail closed).
    assert not _verdict(setup, [_gate(setup, 2), _gate(setup, 2, "FAILED")]).ok
    # A newer run with settings weaker than the policy's (eps below minEps) does not apply: the older decides.
    weak = _gate(setup, 1, "FAILED", **{"parameters.eps": 0.01})
    assert _verdict(setup, [_gate(setup, 5), weak]).ok
    # A statement dated in the future is not fresh evidence and cannot pin the decision.
    assert _verdict(setup, [_gate(setup, 5), _gate(setup, -2, "FAILED")]).ok


def test_the_newest_watermark_record_decides(setup: dict[str, Any]) -> None:  # noqa: F811
    def record(days_ago: float, detected: bool) -> bytes:
        pred = watermark_predicate() | {"embeddedAt": _at(days_ago)}
        pred["detection"] = dict(pred["detection"], detected=detected)
        return setup["attest"]("watermark", pred)

    def verdict(*records: bytes) -> Any:
        bundles = _bundles(setup)[:3] + list(records)
        return verify_attestations(setup["root"], bundles, setup["policy"], now=NOW)

    assert verdict(record(5, False), record(1, True)).ok
    newer_missed = verdict(record(5, True), record(1, False))
    assert not newer_missed.ok and "not detected" in newer_missed.refused[0]


def test_submitted_bundles_superseded_by_a_newer_one_do_not_veto(setup: dict[str, Any]) -> None:  # noqa: F811
    verdict = _verdict(setup, [_gate(setup, 5), _gate(setup, 1)], every_bundle_counts=True)
    assert verdict.ok, verdict.reasons()
    assert verdict.to_json()["superseded"] == list(verdict.superseded) and verdict.to_json()["ignored"]


def test_65_untrusted_bundles_in_a_directory_store_do_not_deny(
    policies: PolicySet,  # noqa: F811
    signed: tuple[str, Path],  # noqa: F811
    key_dir: Path,
    tmp_path: Path,
) -> None:
    """Old code: more bundles than the store read (64) was an error, so any writer could deny the model."""
    digest, source = signed
    store = tmp_path / "store"
    for bundle in source.rglob("*.sig"):
        store_bundle(store, bundle.read_bytes())
    stranger = load_private_key_file(key_dir / "other.key.pem")  # not in the webhook's policy
    for i in range(65):
        statement = Statement(
            (Subject("m", {"sha256": digest}),), GATE_PREDICATE_TYPE, gate_predicate(**{"parameters.seed": i})
        )
        store_bundle(store, sign_statement(statement, stranger))
    reviewer = Reviewer(policies, DirectoryStore(store), WebhookConfig(), generation="g")
    response = answer(reviewer, review_body("Pod", f"{REGISTRY}/llama@sha256:{digest}"))
    assert response["allowed"] is True, response
    # Through a policy's store as well, with the reasons listed.
    listed = DirectoryStore(store).entries(digest)
    assert len(listed) == 66
    policy = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [{"name": "p", "match": ["file:///**"], "keys": ["ecdsa-p256.pub.pem"]}],
        },
        base_dir=key_dir,
        source="t",
    ).policies[0]
    verdict = verify_attestations(digest, listed, policy)
    assert verdict.ok and len(verdict.ignored) == 65


def test_a_flood_beyond_the_read_limit_is_listed_not_an_error(setup: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    store = DirectoryStore(tmp_path / "s", max_bundles=1)
    store.put(_gate(setup, 5))
    store.put(_gate(setup, 4))
    entries = store.entries(setup["root"])
    assert len(entries) == 2 and sum(1 for e in entries if e.note) == 1
    verdict = verify_attestations(setup["root"], entries, setup["policy"], require_signatures=False, now=NOW)
    assert any("not read: the store holds more bundles" in i for i in verdict.ignored)


@pytest.mark.parametrize("kind", ["dir", "sqlite"])
def test_delete_and_supersede_remove_a_record_from_what_readers_get(
    setup: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    kind: str,
) -> None:
    reference = str(tmp_path / "dir") if kind == "dir" else f"sqlite://{tmp_path / 's.db'}"
    store = open_store(reference, StoreOptions(must_exist=False))
    stale, _ = store.put(_gate(setup, 40))
    fresh, _ = store.put(_gate(setup, 1))
    store.delete(setup["root"], stale.id)
    assert [e.id for e in store.entries(setup["root"])] == [fresh.id]
    with pytest.raises(NotFoundError):
        store.delete(setup["root"], stale.id)
    with pytest.raises(NotFoundError):
        store.get(setup["root"], stale.id)
    store.supersede(setup["root"], fresh.id)
    assert store.entries(setup["root"]) == []
    with pytest.raises(NotFoundError):
        store.supersede(setup["root"], fresh.id)
    if isinstance(store, SqliteAttestationStore):
        assert store.put(fresh.data) == (fresh, False)  # a superseded record stays superseded
        assert store.entries(setup["root"]) == []
        store.delete(setup["root"], fresh.id)  # delete forgets it: it can be stored again
        assert store.put(fresh.data)[1] and [e.id for e in store.entries(setup["root"])] == [fresh.id]
    store.close()


def test_attest_delete_cli_and_verify_json_lists_ignored(
    setup: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    key_dir: Path,
) -> None:
    store = tmp_path / "store"
    stale = store_bundle(store, _gate(setup, 400))
    runner = CliRunner()
    digest = setup["root"]
    policy = dataclasses.replace(setup["policy"], attestation_store=str(store))
    store_bundle(store, setup["attest"]("watermark", watermark_predicate()))
    store_bundle(store, setup["attest"]("gate", gate_predicate(finishedAt=_now())))
    assert verify_model(setup["model"], policy).files == 6
    # `verify --json` shows the attestation verdict, the stale gate among the ignored bundles.
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        f"""apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: all
    match: ["file:///**"]
    attestationStore: {store}
    keys:
      - {{path: {key_dir}/ecdsa-p256.pub.pem, roles: [weights]}}
      - {{path: {key_dir}/ecdsa-p384.pub.pem, roles: [gate]}}
      - {{path: {key_dir}/other.pub.pem, roles: [watermark]}}
    attestations:
      robustness: {{minEps: 0.03, minRobustAccuracy: 0.85, maxAge: 30d}}
      watermark: {{required: true}}
"""
    )
    shown = runner.invoke(main, ["verify", str(setup["model"]), "--policy", str(policy_file), "--json"])
    assert shown.exit_code == 0, shown.output
    verdict = json.loads(shown.output)["attestations"]
    assert verdict["ok"] and len(verdict["ignored"]) == 1 and "stale" in verdict["ignored"][0]
    assert {e["kind"] for e in verdict["evidence"]} == {"robustness", "watermark"}
    result = runner.invoke(
        main, ["attest", "delete", str(store), "--digest", digest, "--id", stale.stem, "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["deleted"] == {"rootDigest": digest, "id": stale.stem}
    assert not stale.exists()
    again = runner.invoke(main, ["attest", "delete", str(store), "--digest", digest, "--id", stale.stem])
    assert again.exit_code == 1 and "no bundle" in again.output


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
