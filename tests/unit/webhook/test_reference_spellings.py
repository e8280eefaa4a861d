"""Every spelling of one image gets the decision of its canonical spelling (issue 27, item 3).

`registry.internal:443/models/llm:latest`, `REGISTRY.INTERNAL/models/llm:latest`,
`index.docker.io/acme/llm:latest` and `registry-1.docker.io/acme/llm:latest` are pulled from the same
repository as the canonical spellings, so they are refused by mutable tag as those are: through the
webhook (container images, image volumes, the annotation, KServe's `storageUri`), through policy matching
and through the digest an image is bound to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import InvalidReferenceError, PolicyError
from modelsec.policy import PolicySet
from modelsec.verifier.admission import admit
from modelsec.webhook.review import Reviewer
from tests.unit.webhook.test_review import UNSIGNED, review_body, reviewer, signed

__all__ = ["signed"]  # the signed-model fixture of the webhook's table tests

INTERNAL = [
    "registry.internal:443/models/llm",
    "REGISTRY.INTERNAL/models/llm",
    "Registry.Internal:443/models/llm",
]
HUB = [
    "index.docker.io/acme/llm",
    "registry-1.docker.io/acme/llm",
    "INDEX.DOCKER.IO:443/acme/llm",
    "acme/llm",
]
LIBRARY = ["llm", "docker.io/llm", "index.docker.io/library/llm", "registry-1.docker.io/llm"]
LOCAL = ["LOCALHOST:5000/models/llm", "localhost:05000/models/llm"]
SPELLINGS = [
    *(("registry.internal/models/llm", s) for s in INTERNAL),
    *(("docker.io/acme/llm", s) for s in HUB),
    *(("docker.io/library/llm", s) for s in LIBRARY),
    *(("localhost:5000/models/llm", s) for s in LOCAL),
]


@pytest.fixture(scope="module")
def policies(key_dir: Path) -> PolicySet:
    """Policies naming the canonical spellings; in namespace `ml` a reference no policy matches is allowed."""
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "internal",
                "match": ["oci://registry.internal/models/**"],
                "keys": ["ecdsa-p256.pub.pem"],
            },
            {
                "name": "hub",
                "match": ["oci://docker.io/acme/**", "oci://docker.io/library/llm"],
                "keys": ["ecdsa-p256.pub.pem"],
            },
            {"name": "local", "match": ["oci://localhost:5000/models/**"], "keys": ["ecdsa-p256.pub.pem"]},
        ],
        "namespaceRules": [{"namespaces": ["ml"], "noMatch": "allow"}],
    }
    return PolicySet.from_mapping(doc, base_dir=key_dir, source="test-policy")


def _decide(r: Reviewer, body: dict[str, Any]) -> tuple[bool, str, str]:
    decision = r.review(json.dumps(body).encode())
    response = decision.response["response"]
    return response["allowed"], decision.reason, response.get("status", {}).get("message", "")


def _with_image(image: str, *, volume: bool = False, models: str | None = None) -> dict[str, Any]:
    body = review_body("Pod", models)
    spec = body["request"]["object"]["spec"]
    if volume:
        spec["volumes"] = [{"name": "weights", "image": {"reference": image, "pullPolicy": "IfNotPresent"}}]
    else:
        spec["containers"].append({"name": "model", "image": image})
    return body


@pytest.mark.parametrize("volume", [False, True], ids=["container", "image-volume"])
@pytest.mark.parametrize(("canonical", "spelling"), SPELLINGS)
def test_an_image_alias_is_refused_by_mutable_tag_as_its_canonical_spelling(
    canonical: str, spelling: str, volume: bool, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    expected = _decide(r, _with_image(f"{canonical}:latest", volume=volume))
    assert expected[:2] == (False, "digest-required")
    allowed, reason, message = _decide(r, _with_image(f"{spelling}:latest", volume=volume))
    assert (allowed, reason) == expected[:2], spelling
    assert f"{spelling}:latest" in message and "tags are mutable" in message


@pytest.mark.parametrize(("canonical", "spelling"), SPELLINGS[::2])
def test_an_oci_annotation_alias_gets_the_decision_of_its_canonical_spelling(
    canonical: str, spelling: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    digest, store = signed
    r = reviewer(policies, store)
    for suffix, decision in [
        (":latest", (False, "digest-required")),
        (f"@sha256:{UNSIGNED}", (False, "attestation")),
        (f"@sha256:{digest}", (True, "verified")),
    ]:
        assert _decide(r, review_body("Pod", f"oci://{canonical}{suffix}"))[:2] == decision
        assert _decide(r, review_body("Pod", f"oci://{spelling}{suffix}"))[:2] == decision, spelling


def test_a_kserve_modelcar_alias_is_refused_by_mutable_tag(
    policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    for spelling in [
        "oci://registry.internal/models/llm:latest",
        *(f"oci://{s}:latest" for s in INTERNAL + HUB),
    ]:
        body = review_body("InferenceService", spelling)
        assert _decide(r, body)[:2] == (False, "digest-required"), spelling


@pytest.mark.parametrize(
    ("annotation", "image"),
    [
        ("oci://registry.internal/models/x", "REGISTRY.INTERNAL:443/models/x"),
        ("oci://Registry.Internal:443/models/x", "registry.internal/models/x"),
        ("oci://docker.io/acme/x", "index.docker.io/acme/x"),
        ("oci://registry-1.docker.io/library/llm", "llm"),
    ],
)
def test_an_image_alias_is_bound_to_the_digest_its_reference_names(
    annotation: str, image: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    digest, store = signed
    r = reviewer(policies, store)
    models = f"{annotation}@sha256:{digest}"
    assert _decide(r, _with_image(f"{image}@sha256:{digest}", volume=True, models=models))[:2] == (
        True,
        "verified",
    )
    allowed, reason, message = _decide(
        r, _with_image(f"{image}@sha256:{UNSIGNED}", volume=True, models=models)
    )
    assert (allowed, reason) == (False, "image-digest-mismatch")
    assert "only the verified digest may be mounted" in message
    # Under a tag the alias is refused before any binding is looked at.
    assert _decide(r, _with_image(f"{image}:v1", volume=True, models=models))[:2] == (
        False,
        "digest-required",
    )


def test_another_port_is_another_registry(policies: PolicySet, signed: tuple[str, Path]) -> None:
    r = reviewer(policies, signed[1])
    assert _decide(r, _with_image("localhost:5000/models/llm:latest"))[:2] == (False, "digest-required")
    # `localhost` (443) and `localhost:5001` are not the registry the policy names: noMatch (allow here).
    for other in (
        "localhost/models/llm:latest",
        "localhost:5001/models/llm:latest",
        "localhost:443/models/llm",
    ):
        assert _decide(r, _with_image(other))[:2] == (True, "no-references"), other


@pytest.mark.parametrize(
    ("models", "image", "words"),
    [
        (None, "registry.internal/Models/llm:latest", "repository 'Models/llm' is not lower case"),
        (None, "registry.internal:99999/models/llm:latest", "port 99999"),
        (None, "registry.internal/models/llm:v1 ", "tag 'v1 '"),
        (f"oci://registry.internal/Models/llm@sha256:{UNSIGNED}", None, "is not lower case"),
        ("oci://REGISTRY.INTERNAL:443/models/LLM:latest", None, "is not lower case"),
    ],
)
def test_an_invalid_reference_is_refused_naming_the_rule(
    models: str | None, image: str | None, words: str, policies: PolicySet, signed: tuple[str, Path]
) -> None:
    r = reviewer(policies, signed[1])
    body = _with_image(image, models=models) if image else review_body("Pod", models)
    allowed, reason, message = _decide(r, body)
    assert (allowed, reason) == (False, "malformed-reference")
    assert words in message and "valid image reference" in message


def test_policy_matching_and_admission_compare_normalised_references(
    policies: PolicySet, key_dir: Path
) -> None:
    for canonical, spelling in SPELLINGS:
        expected = [p.name for p in policies.matching(f"oci://{canonical}", "ml")]
        assert expected and [p.name for p in policies.matching(f"oci://{spelling}:latest", "ml")] == expected
        assert admit(policies, f"oci://{spelling}").policy.name == expected[0]
    # A policy file that spells its patterns otherwise covers the same repositories.
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {
                "name": "aliases",
                "match": [
                    "oci://REGISTRY.INTERNAL:443/models/**",
                    "oci://index.docker.io/acme/*",
                    "oci://llm",
                ],
                "keys": ["ecdsa-p256.pub.pem"],
            }
        ],
    }
    aliased = PolicySet.from_mapping(doc, base_dir=key_dir, source="aliases")
    for _, spelling in SPELLINGS[: -len(LOCAL)]:
        assert [p.name for p in aliased.matching(f"oci://{spelling}")] == ["aliases"], spelling
    with pytest.raises(InvalidReferenceError):
        aliased.matching("oci://registry.internal/Models/llm")
    doc["policies"][0]["match"] = ["oci://registry.internal/Models/**"]
    with pytest.raises(PolicyError, match=r"match.*a repository path is lower case; it can never match"):
        PolicySet.from_mapping(doc, base_dir=key_dir, source="upper")
