"""Digest pinning: `expected_digests` in the core, and the strict parser of MODELSEC_MODEL_DIGEST values."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import DigestMismatchError, PolicyError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.pinning import DigestPin, digest_pins_from_env, parse_digest_pins
from modelsec.verifier.verification import verify_signatures

P256 = SignatureAlgorithm.ECDSA_P256.value
A, B = "a" * 64, "b" * 64


@pytest.fixture
def signed(tiny_model: Path, key_dir: Path) -> tuple[Path, Policy, str]:
    result = sign_model(tiny_model, [load_private_key_file(key_dir / f"{P256}.key.pem")])
    return tiny_model, Policy.from_key_files([key_dir / f"{P256}.pub.pem"]), result.root_digest


def test_pinned_digest_accepts(signed: tuple[Path, Policy, str]) -> None:
    model, policy, root = signed
    assert verify_model(model, policy, expected_digests={f"sha256:{root}", f"sha256:{A}"}).root_digest == root
    assert verify_model(model, policy, expected_digests=[root]).root_digest == root


def test_other_digest_refused_before_any_model_file_is_opened(signed: tuple[Path, Policy, str]) -> None:
    model, policy, root = signed
    # Tampered model files prove the pin is checked first: hashing them would fail on a file's digest.
    for f in model.iterdir():
        if f.name != "model.sig":
            f.write_bytes(b"tampered")
    with pytest.raises(DigestMismatchError) as e:
        verify_signatures(model, policy, expected_digests=[f"sha256:{A}"])
    assert e.value.expected == f"sha256:{A}" and e.value.actual == f"sha256:{root}"
    assert str(model) in str(e.value)
    with pytest.raises(DigestMismatchError, match="pinned"):
        verify_model(model, policy, expected_digests=[A, B])


@pytest.mark.parametrize("bad", [[], ["sha256:" + "A" * 64], ["sha256:abc"], ["md5:" + A]])
def test_bad_expected_digests_are_policy_errors(signed: tuple[Path, Policy, str], bad: list[str]) -> None:
    model, policy, _ = signed
    with pytest.raises(PolicyError):
        verify_model(model, policy, expected_digests=bad)


def test_parse_bare_and_annotation_values() -> None:
    assert parse_digest_pins(f" sha256:{A}\n") == (DigestPin(None, A),)
    value = f"oci://r.io/m@sha256:{A}, file:///models/x@sha256:{B}"
    assert parse_digest_pins(value) == (DigestPin("oci://r.io/m", A), DigestPin("file:///models/x", B))
    assert digest_pins_from_env({}) is None
    assert digest_pins_from_env({"MODELSEC_MODEL_DIGEST": f"sha256:{B}"}) == (DigestPin(None, B),)


@pytest.mark.parametrize(
    "value",
    [
        "",
        A,  # bare hex without sha256:
        f"sha256:{A.upper()}",
        f"sha256:{A}0",
        f"oci://r.io/m@sha256:{A},",
        "oci://r.io/m",  # an annotation entry that pins nothing
        f"r.io/m@sha256:{A}",  # no scheme
        f"oci://r.io/m@sha512:{A}",
        f"oci://r.io/m@sha256:{A},,oci://r.io/n@sha256:{B}",
    ],
)
def test_malformed_pins_refused(value: str) -> None:
    with pytest.raises(PolicyError, match="MODELSEC_MODEL_DIGEST") as e:
        digest_pins_from_env({"MODELSEC_MODEL_DIGEST": value})
    assert "sha256:<64 hex>" in str(e.value)


def test_webhook_uses_the_same_reference_parser() -> None:
    from modelsec.webhook.review import parse_reference

    ref = parse_reference(f"oci://r.io/m@sha256:{A}", "here")
    pin = parse_digest_pins(f"oci://r.io/m@sha256:{A}")[0]
    assert (ref.uri, ref.digest) == (pin.uri, pin.digest)
