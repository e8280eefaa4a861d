"""The OCI binding is a registered predicate about an OCI manifest: never evidence about a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.attestations import Statement, Subject, sign_statement
from modelsec.attestations.predicates import predicate_kind
from modelsec.attestations.predicates.oci_binding import (
    LEGACY_OCI_BINDING_PREDICATE_TYPE,
    OCI_BINDING_PREDICATE_TYPE,
    binding_statement,
    parse_binding_statement,
)
from modelsec.errors import MalformedArtifactError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file
from modelsec.verifier import verify_attestations
from modelsec.verifier.stores import StoredBundle

ROOT, MANIFEST = "ab" * 32, "cd" * 32


def test_a_trusted_binding_whose_subject_is_the_root_digest_is_not_a_signature(key_dir: Path) -> None:
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    crafted = Statement(
        (Subject("m", {"sha256": ROOT}),), OCI_BINDING_PREDICATE_TYPE, {"model": {"digest": {"sha256": ROOT}}}
    )
    data = sign_statement(crafted, key)
    verdict = verify_attestations(ROOT, [StoredBundle("x", ROOT, data, "crafted")], policy)
    assert not verdict.ok and not verdict.evidence
    assert any("about an oci-manifest" in i for i in verdict.ignored)
    assert predicate_kind(OCI_BINDING_PREDICATE_TYPE, what="t").role == "weights"


def test_binding_statements_parse_strictly_in_both_forms() -> None:
    built = binding_statement("r/m", f"sha256:{MANIFEST}", ROOT, model_name="m", artifact_type="a")
    parsed = parse_binding_statement(built, what="t")
    assert (parsed.manifest_digest, parsed.root_digest, parsed.deprecated) == (
        f"sha256:{MANIFEST}",
        ROOT,
        False,
    )
    legacy = Statement(
        (Subject("m", {"sha256": ROOT}),),
        LEGACY_OCI_BINDING_PREDICATE_TYPE,
        {"manifestDigest": f"sha256:{MANIFEST}"},
    )
    assert parse_binding_statement(legacy, what="t").deprecated
    for bad in (
        Statement((Subject("a", {"sha256": MANIFEST}),) * 2, OCI_BINDING_PREDICATE_TYPE, built.predicate),
        Statement((Subject("a", {"sha512": MANIFEST * 2}),), OCI_BINDING_PREDICATE_TYPE, built.predicate),
        Statement((Subject("a", {"sha256": MANIFEST}),), OCI_BINDING_PREDICATE_TYPE, {"model": {}}),
        Statement(
            (Subject("a", {"sha256": ROOT}),), LEGACY_OCI_BINDING_PREDICATE_TYPE, {"manifestDigest": MANIFEST}
        ),
    ):
        with pytest.raises(MalformedArtifactError, match=r"^t: "):
            parse_binding_statement(bad, what="t")
