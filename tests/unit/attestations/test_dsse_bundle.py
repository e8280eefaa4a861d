"""DSSE PAE, bundle parsing strictness and statement parsing."""

from __future__ import annotations

import base64
import json

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.attestations import (
    PAYLOAD_TYPE_IN_TOTO,
    Statement,
    Subject,
    pae,
    parse_bundle,
    parse_statement,
    serialize_statement,
    sign_statement,
)
from modelsec.errors import MalformedArtifactError, SignatureError
from modelsec.signer import generate_private_key_pem, load_private_key, load_trusted_key


def test_pae_spec_example() -> None:
    # DSSE v1.0 protocol.md, "Test vectors": PAE("http://example.com/HelloWorld", "hello world")
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_pae_counts_bytes_not_characters() -> None:
    payload = '{"name":"README_modèle.md"}'.encode()
    assert pae(PAYLOAD_TYPE_IN_TOTO, payload) == b"DSSEv1 28 application/vnd.in-toto+json %d %b" % (
        len(payload),
        payload,
    )
    assert len(payload) == len(payload.decode()) + 1


def _signed(alg: SignatureAlgorithm = SignatureAlgorithm.ECDSA_P256) -> tuple[bytes, object]:
    private, public = generate_private_key_pem(alg)
    signer = load_private_key(private, name="k")
    st = Statement((Subject("m", {"sha256": "ab" * 32}),), "https://example/p", {"x": 1})
    return sign_statement(st, signer), load_trusted_key(public, name="k")


def test_sign_and_verify_round_trip() -> None:
    bundle_json, key = _signed()
    b = parse_bundle(bundle_json, source="b")
    key.verify(b.signature.sig, b.envelope.pae())  # type: ignore[attr-defined]
    st = parse_statement(b.envelope.payload, what="b", predicate_type="https://example/p")
    assert st.subjects[0].digest["sha256"] == "ab" * 32
    assert serialize_statement(st) == b.envelope.payload


def test_char_length_pae_signature_rejected() -> None:
    """A non-ASCII payload signed over a character-count PAE must not verify (corpus DSSE02)."""
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    signer = load_private_key(private, name="k")
    payload = '{"name":"README_modèle.md"}'.encode()
    wrong = b"DSSEv1 28 application/vnd.in-toto+json %d %b" % (len(payload.decode()), payload)
    sig = signer.sign(wrong)
    key = load_trusted_key(public, name="k")
    with pytest.raises(SignatureError):
        key.verify(sig, pae(PAYLOAD_TYPE_IN_TOTO, payload))


def _mutate(bundle_json: bytes, fn) -> bytes:  # type: ignore[no-untyped-def]
    doc = json.loads(bundle_json)
    fn(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("mutation", "error", "match"),
    [
        (
            lambda d: d.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.1"),
            MalformedArtifactError,
            "mediaType",
        ),
        (
            lambda d: d["dsseEnvelope"].update(payloadType="application/json"),
            MalformedArtifactError,
            "payloadType",
        ),
        (lambda d: d["dsseEnvelope"].update(signatures=[]), SignatureError, "exactly one signature"),
        (
            lambda d: d["dsseEnvelope"]["signatures"].append(d["dsseEnvelope"]["signatures"][0]),
            SignatureError,
            "exactly one",
        ),
        (lambda d: d["dsseEnvelope"]["signatures"][0].pop("sig"), SignatureError, "sig"),
        (lambda d: d["dsseEnvelope"].update(payload="not base64!"), MalformedArtifactError, "base64"),
        (lambda d: d.pop("dsseEnvelope"), MalformedArtifactError, "dsseEnvelope"),
        (lambda d: d.update(extra=1), MalformedArtifactError, "unknown"),
    ],
)
def test_bundle_strictness(mutation, error, match) -> None:  # type: ignore[no-untyped-def]
    bundle_json, _ = _signed()
    with pytest.raises(error, match=match):
        parse_bundle(_mutate(bundle_json, mutation), source="b")


def test_duplicate_json_keys_refused() -> None:
    bundle_json, _ = _signed()
    text = bundle_json.decode().replace('"mediaType"', '"mediaType": "x", "mediaType"', 1)
    with pytest.raises(MalformedArtifactError, match="duplicate"):
        parse_bundle(text.encode(), source="b")


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (
            {
                "_type": "https://in-toto.io/Statement/v0.1",
                "subject": [{"name": "m", "digest": {"sha256": "00" * 32}}],
                "predicateType": "p",
                "predicate": {},
            },
            "_type",
        ),
        (
            {
                "subject": [{"name": "m", "digest": {"sha256": "00" * 32}}],
                "predicateType": "p",
                "predicate": {},
            },
            "_type",
        ),
        (
            {
                "_type": "https://in-toto.io/Statement/v1",
                "subject": [],
                "predicateType": "p",
                "predicate": {},
            },
            "subject",
        ),
        (
            {
                "_type": "https://in-toto.io/Statement/v1",
                "subject": [{"name": "m", "digest": {"sha256": "XYZ"}}],
                "predicateType": "p",
                "predicate": {},
            },
            "hex",
        ),
        (
            {
                "_type": "https://in-toto.io/Statement/v1",
                "subject": [{"name": "m", "digest": {"sha256": "00" * 32}}],
                "predicateType": "p",
            },
            "predicate",
        ),
    ],
)
def test_statement_strictness(doc: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(MalformedArtifactError, match=match):
        parse_statement(json.dumps(doc).encode(), what="s")


def test_statement_predicate_type_enforced() -> None:
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "m", "digest": {"sha256": "00" * 32}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {},
    }
    with pytest.raises(MalformedArtifactError, match="predicateType"):
        parse_statement(
            json.dumps(doc).encode(), what="s", predicate_type="https://model_signing/signature/v1.0"
        )


def test_bundle_keeps_exact_payload_bytes() -> None:
    bundle_json, _ = _signed()
    doc = json.loads(bundle_json)
    raw = base64.b64decode(doc["dsseEnvelope"]["payload"])
    assert parse_bundle(bundle_json, source="b").envelope.payload == raw


def test_a_digest_with_a_trailing_newline_is_not_a_digest() -> None:
    from modelsec.attestations.statement import is_sha256_hex, parse_statement
    from modelsec.errors import MalformedArtifactError

    assert is_sha256_hex("a" * 64) and not is_sha256_hex("a" * 64 + "\n") and not is_sha256_hex(None)
    doc = '{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"m","digest":{"sha256":"%s\\n"}}],'
    doc += '"predicateType":"x","predicate":{}}'
    with pytest.raises(MalformedArtifactError):
        parse_statement((doc % ("a" * 64)).encode(), what="s")
