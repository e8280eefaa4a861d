"""Image and `oci://` references: one parser, normalised as a pull resolves them (distribution reference).

Cases follow github.com/distribution/reference (`normalize_test.go`, `reference_test.go`): the Docker Hub
default, `library/`, the legacy `index.docker.io`; plus what a pull reaches (host case, `:443`, the
`registry-1.docker.io` API host).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.errors import InvalidReferenceError, MalformedArtifactError, PolicyError
from modelsec.registry.reference import normalize_pattern, parse_image_reference, parse_reference

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("registry.internal/models/llm:latest", "registry.internal/models/llm"),
        ("registry.internal:443/models/llm:latest", "registry.internal/models/llm"),
        ("registry.internal:0443/models/llm", "registry.internal/models/llm"),
        ("REGISTRY.INTERNAL/models/llm:latest", "registry.internal/models/llm"),
        ("Registry.Internal:443/models/llm:latest", "registry.internal/models/llm"),
        ("registry.internal:8443/models/llm", "registry.internal:8443/models/llm"),
        ("docker.io/acme/llm:latest", "docker.io/acme/llm"),
        ("index.docker.io/acme/llm:latest", "docker.io/acme/llm"),
        ("registry-1.docker.io/acme/llm:latest", "docker.io/acme/llm"),
        ("INDEX.DOCKER.IO:443/acme/llm", "docker.io/acme/llm"),
        ("acme/llm:latest", "docker.io/acme/llm"),
        ("llm", "docker.io/library/llm"),
        ("docker.io/llm", "docker.io/library/llm"),
        ("registry-1.docker.io/llm:1", "docker.io/library/llm"),
        ("docker.io/library/llm", "docker.io/library/llm"),
        ("localhost:5000/models/llm", "localhost:5000/models/llm"),
        ("LOCALHOST:5000/models/llm", "localhost:5000/models/llm"),
        ("localhost/models/llm", "localhost/models/llm"),
        ("localhost:443/models/llm", "localhost/models/llm"),
        ("Acme/llm", "acme/llm"),  # an upper-case first component is a registry host (splitDockerDomain)
        ("[::1]:5000/models/llm", "[::1]:5000/models/llm"),
        ("[FE80::1]:443/m", "[fe80::1]/m"),
    ],
)
def test_spellings_of_one_repository_normalise_to_one_name(text: str, name: str) -> None:
    assert parse_image_reference(text).name == name
    assert parse_reference("oci://" + text).repository_uri == "oci://" + name


def test_tag_and_digest_are_kept_as_written() -> None:
    ref = parse_image_reference(f"REGISTRY.internal:443/models/llm:V1@{D}")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("registry.internal", "models/llm", "V1", D)
    assert str(ref) == f"oci://registry.internal/models/llm:V1@{D}"
    assert parse_image_reference("localhost:5000").name == "docker.io/library/localhost"  # 5000 is a tag


def test_docker_hub_is_reached_at_its_api_host() -> None:
    assert parse_image_reference("docker.io/acme/llm").endpoint == "registry-1.docker.io"
    assert parse_image_reference("registry.internal:8443/m").endpoint == "registry.internal:8443"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("registry.internal/Models/llm:latest", "'Models/llm' is not lower case"),
        ("acme/LLM", "'acme/LLM' is not lower case"),
        ("registry.internal/models//llm", "not a valid repository path"),
        ("registry.internal/models/../llm", "not a valid repository path"),
        ("registry.internal/models/llm:", "tag ''"),
        ("registry.internal/models/llm:" + "t" * 129, "tag"),
        ("registry.internal/models/llm latest", "not a valid repository path"),
        ("registry.internal/models/llm:v1\n", "tag 'v1\\n'"),
        ("registry.internal./models/llm", "not a host name"),
        ("-registry.internal/models/llm", "not a host name"),
        ("registry.internal:99999/models/llm", "port 99999"),
        ("registry.internal:0/models/llm", "port 0"),
        ("registry.internal/models/llm@sha256:short", "digest"),
        ("registry.internal/models/llm@sha256:" + "AB" * 32, "digest"),
        ("registry.internal/models/llm@md5:" + "ab" * 16, "digest"),
        ("ab" * 32, "64-hex name"),
        ("registry.internal/" + "m" * 250, "longer than 255"),
    ],
)
def test_invalid_references_are_refused_with_the_rule_they_break(text: str, words: str) -> None:
    with pytest.raises(InvalidReferenceError) as caught:
        parse_image_reference(text)
    assert caught.value.reference == text and words in caught.value.reason
    assert isinstance(caught.value, MalformedArtifactError)  # refused as any unreadable artifact is
    assert f"{text!r} is not a valid image reference: " in str(caught.value)


def test_oci_references_pin_sha256_only() -> None:
    assert parse_image_reference("r.example/m@sha512:" + "ab" * 64).digest == "sha512:" + "ab" * 64
    with pytest.raises(InvalidReferenceError, match="is not sha256"):
        parse_reference("oci://r.example/m@sha512:" + "ab" * 64)


@pytest.mark.parametrize(
    ("pattern", "normalised"),
    [
        ("oci://REGISTRY.INTERNAL:443/models/**", "oci://registry.internal/models/**"),
        ("oci://index.docker.io/acme/*", "oci://docker.io/acme/*"),
        ("oci://registry-1.docker.io/acme/llm", "oci://docker.io/acme/llm"),
        ("oci://acme/**", "oci://docker.io/acme/**"),
        ("oci://llm", "oci://docker.io/library/llm"),
        ("oci://docker.io/llm*", "oci://docker.io/library/llm*"),
        ("oci://docker.io/**", "oci://docker.io/**"),
        ("oci://localhost:5000/models/**", "oci://localhost:5000/models/**"),
        ("oci://*.INTERNAL/models/**", "oci://*.internal/models/**"),
        ("oci://**", "oci://**"),
        ("file:///Models/**", "file:///Models/**"),
    ],
)
def test_policy_patterns_are_normalised_like_references(pattern: str, normalised: str) -> None:
    assert normalize_pattern(pattern) == normalised


def test_a_pattern_with_an_upper_case_repository_is_refused() -> None:
    with pytest.raises(PolicyError, match="repository path is lower case; it can never match"):
        normalize_pattern("oci://registry.internal/Models/**")
    with pytest.raises(PolicyError, match="port 70000"):
        normalize_pattern("oci://registry.internal:70000/models/**")


@pytest.mark.parametrize(
    "uri",
    [
        "modelsec+oci://REGISTRY.INTERNAL:443/models/llm:v1",
        "modelsec+oci://registry.internal/models/llm@" + D,
        "oci://registry.internal/models/llm:v1",
    ],
)
def test_the_storage_initializer_scheme_is_an_oci_reference(uri: str, key_dir: Path) -> None:
    """`modelsec+oci://` (KServe storageUri routed to modelsec) parses, normalises and matches as `oci://`."""
    from modelsec.policy import PolicySet
    from modelsec.registry.reference import normalize_model_uri, pinned_uri

    assert parse_reference(uri).name == "registry.internal/models/llm"
    assert normalize_model_uri(uri) == "oci://registry.internal/models/llm"
    policies = PolicySet.from_mapping(
        {
            "apiVersion": "modelsec.dev/v1alpha1",
            "kind": "ModelPolicy",
            "policies": [
                {"name": "p", "match": ["oci://registry.internal/models/**"], "keys": ["ecdsa-p256.pub.pem"]}
            ],
        },
        base_dir=key_dir,
        source="test",
    )
    assert [p.name for p in policies.matching(normalize_model_uri(uri), "ml")] == ["p"]
    # A pin keeps the scheme it was written with: KServe routes by the prefix.
    scheme = uri.split("://", 1)[0]
    assert pinned_uri(uri, D) == f"{scheme}://registry.internal/models/llm@{D}"


def test_initializer_patterns_and_bad_spellings() -> None:
    from modelsec.registry.reference import normalize_model_uri, pinned_uri

    assert normalize_pattern("modelsec+oci://Registry.Internal:443/models/**") == (
        "oci://registry.internal/models/**"
    )
    with pytest.raises(InvalidReferenceError, match="not lower case"):
        normalize_model_uri("modelsec+oci://registry.internal/Models/llm:v1")
    with pytest.raises(InvalidReferenceError):
        pinned_uri("s3://bucket/llm", D)
    with pytest.raises(InvalidReferenceError):
        pinned_uri("modelsec+oci://registry.internal/models/llm", "sha512:" + "ab" * 64)
    assert normalize_model_uri("modelsec+s3://bucket/llm") == "modelsec+s3://bucket/llm"  # not OCI
