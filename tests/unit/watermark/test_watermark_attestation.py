"""The watermark attestation: signed, bound to the watermarked model's root digest, no key or message."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import AttestationError, KeyMaterialError, PolicyError, SignatureError
from modelsec.signer import (
    generate_private_key_pem,
    load_private_key,
    load_trusted_key,
    sign_model,
)
from modelsec.watermark import (
    PREDICATE_TYPE,
    WatermarkKey,
    detect,
    embed_model,
    model_root_digests,
    verify_watermark_attestation,
    write_watermark_attestation,
)
from modelsec.watermark.attestation import read_detection_hints

KEY_BYTES = bytes(range(1, 33))
MSG = b"ACME-clf"


@pytest.fixture(scope="module")
def ecdsa() -> tuple[bytes, bytes]:
    return generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)


def _embed(toy_model: Path, tmp_path: Path, ecdsa: tuple[bytes, bytes]) -> tuple[Path, Path, str]:
    key = WatermarkKey.from_bytes(KEY_BYTES)
    result = embed_model(toy_model, tmp_path / "marked", key, MSG)
    signer = load_private_key(ecdsa[0], name="ci")
    digest, path = write_watermark_attestation(result, signer, tmp_path / "marked.watermark.json")
    return result.out_dir, path, digest


def test_attestation_verifies_and_binds_the_watermarked_root_digest(
    toy_model: Path, tmp_path: Path, ecdsa: tuple[bytes, bytes]
) -> None:
    model, path, digest = _embed(toy_model, tmp_path, ecdsa)
    trusted = load_trusted_key(ecdsa[1], name="ci")
    # The subject is the same root digest `modelsec sign` reports for the watermarked model.
    signed = sign_model(model, [load_private_key(ecdsa[0], name="ci")])
    assert digest == signed.root_digest == model_root_digests(model)["sha256"]
    assert digest != model_root_digests(toy_model)["sha256"]
    verified = verify_watermark_attestation(path, [trusted], model_dir=model)
    assert verified.root_digest == digest and verified.detected_at_embedding
    assert verify_watermark_attestation(path, [trusted], root_digest=digest).key is verified.key
    predicate = verified.predicate
    assert verified.statement.predicate_type == PREDICATE_TYPE
    assert predicate["parameters"]["messageBits"] == 64 and predicate["parameters"]["kappa"] == 3.0
    assert predicate["keyCommitment"]["value"] == WatermarkKey.from_bytes(KEY_BYTES).commitment()
    assert predicate["messageCommitment"]["value"] == WatermarkKey.from_bytes(KEY_BYTES).message_commitment(
        MSG
    )
    assert [t["name"] for t in predicate["carriers"]["tensors"]] == [
        "net.0.weight",
        "net.2.weight",
        "net.4.weight",
    ]
    # Embed-time detection: presence on the 64 pilot bits, and the message verdict beside it.
    detection = predicate["detection"]
    assert detection["detected"] is True and detection["bitMatches"] == detection["bits"] == 64
    assert detection["messageMatched"] is True and detection["messageMatches"] == 64
    assert predicate["embeddedAt"].endswith("Z")
    # The verifier's own bundle check accepts it with a key allowed the `watermark` role.
    from modelsec.limits import Limits
    from modelsec.verifier import read_bundle, verify_bundle_signature

    assert verify_bundle_signature(read_bundle(path, Limits()), [trusted], role="watermark") is trusted


def test_attestation_holds_neither_key_nor_message(
    toy_model: Path, tmp_path: Path, ecdsa: tuple[bytes, bytes]
) -> None:
    _, path, _ = _embed(toy_model, tmp_path, ecdsa)
    bundle = json.loads(path.read_text())
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
    everything = path.read_bytes() + payload
    for secret in (
        KEY_BYTES,
        KEY_BYTES.hex().encode(),
        KEY_BYTES.hex().upper().encode(),
        MSG,
        MSG.hex().encode(),
    ):
        assert secret not in everything
    assert b"decodedMessage" not in payload


def test_attestation_refusals(toy_model: Path, tmp_path: Path, ecdsa: tuple[bytes, bytes]) -> None:
    _, path, digest = _embed(toy_model, tmp_path, ecdsa)
    trusted = load_trusted_key(ecdsa[1], name="ci")
    other = load_trusted_key(generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)[1], name="other")
    with pytest.raises(AttestationError, match="is about model"):
        verify_watermark_attestation(path, [trusted], model_dir=toy_model)
    with pytest.raises(SignatureError, match=r"no trusted key .*verifies"):
        verify_watermark_attestation(path, [other], root_digest=digest)
    gate_only = load_trusted_key(ecdsa[1], name="ci", roles=frozenset({"gate"}))
    with pytest.raises(SignatureError, match="may sign 'watermark'"):
        verify_watermark_attestation(path, [gate_only], root_digest=digest)
    tampered = json.loads(path.read_text())
    payload = json.loads(base64.b64decode(tampered["dsseEnvelope"]["payload"]))
    payload["predicate"]["detection"]["detected"] = False
    tampered["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    with pytest.raises(SignatureError):
        verify_watermark_attestation(tmp_path / "tampered.json", [trusted], root_digest=digest)
    with pytest.raises(SignatureError, match="not found"):
        verify_watermark_attestation(tmp_path / "missing.json", [trusted], root_digest=digest)
    with pytest.raises(PolicyError):
        verify_watermark_attestation(path, [trusted])
    result = embed_model(toy_model, tmp_path / "again", WatermarkKey.from_bytes(KEY_BYTES), MSG)
    with pytest.raises(PolicyError, match="inside the model directory"):
        write_watermark_attestation(
            result, load_private_key(ecdsa[0], name="ci"), tmp_path / "again" / "wm.json"
        )


def test_detection_hints_from_the_attestation(
    toy_model: Path, tmp_path: Path, ecdsa: tuple[bytes, bytes]
) -> None:
    model, path, _ = _embed(toy_model, tmp_path, ecdsa)
    assert model.is_dir()
    hints = read_detection_hints(path)
    key = WatermarkKey.from_bytes(KEY_BYTES)
    assert hints.key_commitment == key.commitment() and hints.message_bits == 64
    assert hints.params.density_log2 == 0 and hints.tensors == (
        "net.0.weight",
        "net.2.weight",
        "net.4.weight",
    )
    found = detect(model, key, message_length=hints.message_bits, tensors=hints.tensors, params=hints.params)
    assert found.detected and found.tests == 1 and found.decoded_message == MSG


def test_sm2_attestation_records_the_sm3_root_digest(toy_model: Path, tmp_path: Path) -> None:
    try:
        private, public = generate_private_key_pem(SignatureAlgorithm.SM2)
    except Exception as e:  # noqa: BLE001 - any missing SM2 backend skips this test
        pytest.skip(f"SM2 unavailable: {e}")
    result = embed_model(toy_model, tmp_path / "marked", WatermarkKey.from_bytes(KEY_BYTES), MSG)
    digest, path = write_watermark_attestation(
        result, load_private_key(private, name="sm2"), tmp_path / "wm.json"
    )
    verified = verify_watermark_attestation(path, [load_trusted_key(public, name="sm2")], root_digest=digest)
    assert dict(verified.statement.subjects[0].digest) == model_root_digests(result.out_dir, sm3=True)


def test_key_errors_are_key_material_errors(tmp_path: Path) -> None:
    from modelsec.watermark import load_key_file

    (tmp_path / "k").write_text("00" * 16)
    with pytest.raises(KeyMaterialError, match="too short"):
        load_key_file(tmp_path / "k")


def test_a_mark_whose_message_did_not_read_back_does_not_count_as_detected(
    toy_model: Path, tmp_path: Path, ecdsa: tuple[bytes, bytes]
) -> None:
    # Presence is decided on the pilot bits alone: an attestation recording `detected: true` beside
    # `messageMatched: false` does not vouch for the message it commits to, and a policy must not accept it.
    from modelsec.attestations.predicates.watermark import parse_watermark_predicate

    _, path, digest = _embed(toy_model, tmp_path, ecdsa)
    trusted = load_trusted_key(ecdsa[1], name="ci")
    predicate = dict(verify_watermark_attestation(path, [trusted], root_digest=digest).predicate)
    assert parse_watermark_predicate(predicate, what="wm").detected
    predicate["detection"] = {**predicate["detection"], "messageMatched": False}
    assert not parse_watermark_predicate(predicate, what="wm").detected
    predicate["detection"] = {**predicate["detection"], "messageMatched": "yes"}
    with pytest.raises(AttestationError, match=r"detection\.messageMatched"):
        parse_watermark_predicate(predicate, what="wm")
