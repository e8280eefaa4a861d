"""WatermarkService over a real loopback server: embed, detect, the signed attestation, and refusals.

The server holds the watermark key and signing keys; callers authenticate with bearer tokens (`team-a` may
use the key `owner`, `team-b` may not). The model is the watermark tests' random MLP (no training).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsec.errors import KeyMaterialError, NotFoundError, PermissionDeniedError, VerificationError
from modelsec.policy import Policy, WatermarkRequirement
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.v1 import watermark_pb2
from modelsec.verifier import verify_attestations
from modelsec.watermark import generate_key_file_text, model_root_digests
from tests.support.service import InThreadServer, write_server_config
from tests.unit.watermark._helpers import save_state
from tests.unit.watermark.conftest import mlp_state

pytestmark = pytest.mark.integration

TOKEN_A, TOKEN_B = "token-team-a", "token-team-b"
MESSAGE = b"ACME-clf"


@dataclasses.dataclass
class Setup:
    root: Path
    model: Path
    out: Path
    key_hex: str
    server: InThreadServer


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("wm-service")
    model = save_state(mlp_state(), root / "models" / "clf")
    (root / "out").mkdir()
    key_file = root / "keys" / "owner.wmkey"
    key_file.parent.mkdir()
    key_file.write_bytes(generate_key_file_text())
    config = write_server_config(
        root / "server",
        key_dir,
        tokens=[
            {"identity": "team-a", "sha256": _sha(TOKEN_A)},
            {"identity": "team-b", "sha256": _sha(TOKEN_B)},
        ],
        keys=[
            {"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem"), "allow": ["team-*"]},
            {
                "name": "gate-only",
                "path": str(key_dir / "ecdsa-p256.key.pem"),
                "roles": ["gate"],
                "allow": ["team-*"],
            },
        ],
        watermarkKeys=[
            {"name": "owner", "path": str(key_file), "allow": ["team-a"]},
            {"name": "lost", "path": str(root / "keys" / "missing.wmkey"), "allow": ["team-a"]},
        ],
        access={"watermark": ["team-a", "team-b"]},
        readRoots=[str(root / "models"), str(root / "out")],
        writeRoots=[str(root / "out")],
    )
    with InThreadServer(config) as server:
        yield Setup(root, model, root / "out", key_file.read_text().strip(), server)


def _client(setup: Setup, token: str = TOKEN_A) -> ModelsecClient:
    return ModelsecClient(setup.server.target, ChannelOptions(plaintext=True, token=token, timeout=60))


def test_embed_then_detect_and_the_attestation_verifies(setup: Setup, key_dir: Path) -> None:
    out = setup.out / "clf-marked"
    with _client(setup) as c:
        embedded = c.embed_watermark(
            watermark_pb2.EmbedWatermarkRequest(
                model_path=str(setup.model),
                out_path=str(out),
                watermark_key="owner",
                message=MESSAGE,
                attestation_key_version="ci-p256/1",
            )
        )
        assert embedded.bits == 8 * len(MESSAGE)
        assert embedded.detection.detected and embedded.detection.bit_error_rate == 0.0
        # The reported digest is the marked copy's, computed as `modelsec digest` computes it; the
        # attestation next to the weights is a name the manifest ignores, so it does not change it.
        assert embedded.root_digest == model_root_digests(out)["sha256"]
        assert (out / "model.watermark.sig").read_bytes() == embedded.attestation

        found = c.detect_watermark(str(out), "owner", MESSAGE).detection
        assert found.detected and found.bit_error_rate == 0.0 and found.matches == found.bits
        assert found.bits == 64  # presence: the pilot bits, as blind detection decides it
        assert found.HasField("message_matched") and found.message_matched
        assert found.message_bits == found.message_matches == 8 * len(MESSAGE)
        assert found.false_positive_probability < 1e-9 and found.confidence == 1.0
        # What `detect --json` reports beside (issue 30): Stouffer's Z and its one-hypothesis p-value, the
        # sign count's bound, and the message code with its verdict.
        assert found.z_score > 5 and 0 < found.null_p_value < 1e-6
        assert 0 < found.binomial_false_positive_probability < 1e-9
        assert found.message_code == "crc32-conv7"
        assert found.HasField("message_decoded") and found.message_decoded
        assert found.HasField("code_bit_error_rate") and found.code_bit_error_rate == 0.0
        blind = c.detect_watermark(str(out), "owner").detection
        assert blind.detected and not blind.HasField("message_matched")  # blind: key and weights only
        assert blind.message_decoded and not blind.HasField("code_bit_error_rate")
        # Another message: the mark is present, the message verdict says it is not this one.
        other = c.detect_watermark(str(out), "owner", b"ACME-clg").detection
        assert other.detected and other.HasField("message_matched") and not other.message_matched
        assert other.message_matches == 8 * len(MESSAGE) - 1

        unmarked = c.detect_watermark(str(setup.model), "owner").detection
        assert not unmarked.detected and unmarked.false_positive_probability > 1e-9
        assert unmarked.z_score < 5 and unmarked.null_p_value > 1e-6
        assert not (unmarked.HasField("message_decoded") and unmarked.message_decoded)

    trusted = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    # The server records that it embedded the mark, and for which caller (issue 14).
    requiring = dataclasses.replace(trusted, watermark=WatermarkRequirement(require_server_run=True))
    verdict = verify_attestations(
        embedded.root_digest, [embedded.attestation], requiring, require_signatures=False
    )
    assert verdict.ok and not verdict.missing and not verdict.refused, verdict
    assert "for team-a" in verdict.satisfied[0], verdict.satisfied
    assert any(e.kind == "watermark" for e in verdict.evidence)
    other = dataclasses.replace(
        Policy.from_key_files([key_dir / "other.pub.pem"]), watermark=WatermarkRequirement()
    )
    assert not verify_attestations(
        embedded.root_digest, [embedded.attestation], other, require_signatures=False
    ).ok


def test_embed_without_attestation_key_writes_no_bundle(setup: Setup) -> None:
    out = setup.out / "clf-unattested"
    with _client(setup) as c:
        embedded = c.embed_watermark(
            watermark_pb2.EmbedWatermarkRequest(
                model_path=str(setup.model), out_path=str(out), watermark_key="owner", message=b"\x01\x02"
            )
        )
    assert embedded.attestation == b"" and not (out / "model.watermark.sig").exists()
    assert embedded.detection.detected and embedded.root_digest == model_root_digests(out)["sha256"]


def test_refusals_map_to_status_codes_and_never_show_the_key(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="modelsec.service")
    model = str(setup.model)
    errors: list[str] = []
    with _client(setup) as a, _client(setup, TOKEN_B) as b:
        with pytest.raises(NotFoundError, match="NOT_FOUND") as e:
            a.detect_watermark(model, "nobody")
        errors.append(str(e.value))
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*outside") as e:
            a.detect_watermark(str(setup.root / "keys"), "owner")
        errors.append(str(e.value))
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*team-b") as e:
            b.detect_watermark(model, "owner")
        errors.append(str(e.value))
        # The key file is missing on the server: the caller learns the key's name, not the path.
        with pytest.raises(KeyMaterialError, match=r"FAILED_PRECONDITION.*'lost' cannot be loaded") as e:
            a.detect_watermark(model, "lost")
        assert "missing.wmkey" not in str(e.value)
        errors.append(str(e.value))

        def embed(**fields: str) -> watermark_pb2.EmbedWatermarkResponse:
            base = {"model_path": model, "out_path": str(setup.out / "refused"), "watermark_key": "owner"}
            return a.embed_watermark(
                watermark_pb2.EmbedWatermarkRequest(**{**base, **fields}, message=MESSAGE)
            )

        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*write roots") as e:
            embed(out_path=str(setup.root / "models" / "refused"))
        errors.append(str(e.value))
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*gate-only/1.*watermark") as e:
            embed(attestation_key_version="gate-only/1")
        errors.append(str(e.value))
        with pytest.raises(NotFoundError, match="NOT_FOUND"):
            embed(attestation_key_version="ci-p256/9")
    assert not (setup.out / "refused").exists() and not (setup.root / "models" / "refused").exists()
    for text in [*errors, caplog.text]:
        assert setup.key_hex not in text and MESSAGE.decode() not in text


def test_storing_the_attestation_needs_put_access_and_is_checked_first(setup: Setup) -> None:
    """store_attestation asks for putAttestation access, refused before any byte is read or written."""
    from modelsec.errors import PermissionDeniedError

    out = setup.out / "clf-not-written"
    with (
        _client(setup) as c,
        pytest.raises(PermissionDeniedError, match="'team-a' may not call putAttestation"),
    ):
        c.embed_watermark(
            watermark_pb2.EmbedWatermarkRequest(
                model_path=str(setup.model),
                out_path=str(out),
                watermark_key="owner",
                message=MESSAGE,
                attestation_key_version="ci-p256/1",
                store_attestation=True,
            )
        )
    assert not out.exists()


def test_embed_output_directory_exchange_race(
    setup: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`out/team` exchanged for a link out of the write roots between the path check and the write."""
    from modelsec.service import state as service_state
    from tests.support.race import exchange

    team = setup.out / "race-team"
    team.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)

    def attacker(where: object) -> None:
        if str(getattr(where, "path", where)).startswith(str(team)):
            exchange(team, link)  # out/race-team is now a link to elsewhere/

    monkeypatch.setattr(service_state, "path_hook", attacker, raising=False)
    with _client(setup) as c, pytest.raises(VerificationError, match="symlink"):
        c.embed_watermark(
            watermark_pb2.EmbedWatermarkRequest(
                model_path=str(setup.model),
                out_path=str(team / "marked"),
                watermark_key="owner",
                message=MESSAGE,
                attestation_key_version="ci-p256/1",
            )
        )
    # The old code wrote the marked model (and its attestation) through the link, outside the roots.
    assert list(elsewhere.iterdir()) == []
