"""The bundle-level corpus cases through the gRPC VerificationService on a real loopback server.

One server, one policy per case (named after the case, trusting only that case's `trust/` key);
`VerifyBundle` must accept each case's control bundle and return a negative verdict (never an RPC error)
for every faulty bundle, with reasons matching the case's `error_mentions`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.service.client import ChannelOptions, ModelsecClient
from tests.corpus._cases import case_ids, defective_pae_fixture, expected, materialise, mentions_all, payload
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration
CASES = case_ids(("DSSE",))


def _subject(bundle: Path) -> str:
    digest: str = json.loads(payload(bundle))["subject"][0]["digest"]["sha256"]
    return digest


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[tuple[Path, ModelsecClient]]:
    root = tmp_path_factory.mktemp("corpus-grpc")
    lines = ["apiVersion: modelsec.dev/v1alpha1", "kind: ModelPolicy", "policies:"]
    for case in CASES:
        d = materialise(case, root)
        lines += [
            f"  - name: {case}",
            f"    match: [{json.dumps('file://' + str(d) + '/**')}]",
            f"    keys: [{json.dumps(str(d / 'trust' / 'trusted-p256.pub.pem'))}]",
        ]
    (root / "policy.yaml").write_text("\n".join(lines) + "\n")
    # Its own server: the corpus policies, one named policy per case.
    config = write_server_config(root / "server", key_dir, policy=str(root / "policy.yaml"))
    with (
        InThreadServer(config) as server,
        ModelsecClient(server.target, ChannelOptions(plaintext=True)) as client,
    ):
        yield root, client


@pytest.mark.parametrize("case", CASES)
def test_dsse_cases_through_verify_bundle(case: str, served: tuple[Path, ModelsecClient]) -> None:
    root, client = served
    d = root / case
    digest = _subject(d / "model.ok.sig")
    control = client.verify_bundle(
        digest, [(d / "model.ok.sig").read_bytes()], policy=case, require_signatures=True
    )
    assert control.verdict.ok, control.verdict
    mentions = expected(case).get("error_mentions") or []
    for target in expected(case)["applies_to"]:
        data = (d / target).read_bytes()
        if defective_pae_fixture(target, data):
            continue  # the defective fixture (see tests/corpus/test_corpus_verify.py): it is a valid bundle
        for require_signatures in (True, False):  # negative whether or not signatures are required
            response = client.verify_bundle(
                digest, [data], policy=case, require_signatures=require_signatures
            )
            assert not response.verdict.ok, (target, require_signatures)
            assert not response.verdict.evidence, target
            reasons = " ".join([*response.verdict.ignored, *response.verdict.refused])
            assert mentions_all(reasons, mentions), (target, reasons)
        # A bad bundle next to the good one still makes the answer negative.
        both = client.verify_bundle(digest, [(d / "model.ok.sig").read_bytes(), data], policy=case)
        assert not both.verdict.ok and len(both.verdict.evidence) == 1, target
