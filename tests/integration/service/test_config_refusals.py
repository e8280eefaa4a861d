"""A first `serve` configuration that refuses every call says, at start-up and in each refusal, which setting
allows it (issue 31). A server of its own: the configuration under test grants nothing.

The configuration a new user writes first: a signing key and a watermark key without `allow`, read roots and
architectures without the operations that use them. Each refusal the client sees names the setting and the
file; the server's start-up log names each setting that refuses everything.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from modelsec.errors import PermissionDeniedError
from modelsec.service.config import load_server_config
from tests.conftest import run_cli, write_tiny_model
from tests.support.service import InThreadServer, write_server_config

pytestmark = pytest.mark.integration


def _first_config(tmp_path: Path, key_dir: Path, **fields: object) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "owner.wmkey").write_bytes(b"")  # never read: the refusal comes first
    return write_server_config(
        tmp_path,
        key_dir,
        keys=[{"name": "ci-p256", "path": str(key_dir / "ecdsa-p256.key.pem")}],  # no allow
        watermarkKeys=[{"name": "owner", "path": str(tmp_path / "owner.wmkey")}],  # no allow
        architectures=["lenet5:lenet5"],
        # access left out: the defaults, reads for anyone, writes and server-side runs for nobody
        **{"access": None, **fields},
    )


def test_refusals_name_the_setting_that_allows_the_call(tmp_path: Path, key_dir: Path) -> None:
    pytest.importorskip("grpc")
    config = _first_config(tmp_path, key_dir)
    model = write_tiny_model(tmp_path / "model")
    with InThreadServer(config) as server:
        signed = run_cli(
            "sign", model, "--server", server.target, "--plaintext", "--key-version", "ci-p256/1", "--json"
        )  # fmt: skip
        assert signed.returncode == 1
        error = json.loads(signed.stdout)["error"]
        assert error["kind"] == "PermissionDeniedError"
        assert f"keys[0].allow in {config}" in error["message"]
        assert not (model / "model.sig").exists()
        # A write the defaults grant nobody: the refusal names access.putAttestation and who has it now.
        assert run_cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem").returncode == 0
        pushed = run_cli(
            "attest", "push", model / "model.sig", "--server", server.target, "--plaintext", "--json"
        )  # fmt: skip
        assert pushed.returncode == 1
        message = json.loads(pushed.stdout)["error"]["message"]
        assert "'anonymous' may not call putAttestation" in message
        assert f"access.putAttestation in {config} (now: nobody)" in message


def test_the_same_refusals_through_the_client(tmp_path: Path, key_dir: Path) -> None:
    pytest.importorskip("grpc")
    from modelsec.service.client import ChannelOptions, ModelsecClient

    plaintext = ChannelOptions(plaintext=True)
    with InThreadServer(_first_config(tmp_path / "first", key_dir)) as server:
        with ModelsecClient(server.target, plaintext) as client:
            with pytest.raises(PermissionDeniedError, match=r"access\.watermark in .* \(now: nobody\)"):
                client.detect_watermark("/models/m", "owner")
    # The operation granted, the key is next: its allow list; then the read roots.
    config = _first_config(tmp_path / "granted", key_dir, access={"watermark": ["*"]})
    with InThreadServer(config) as server, ModelsecClient(server.target, plaintext) as client:
        with pytest.raises(PermissionDeniedError, match=r"watermarkKeys\[0\]\.allow in "):
            client.detect_watermark("/models/m", "owner")


def test_start_up_warns_about_each_setting_that_refuses_everything(
    tmp_path: Path, key_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("grpc")
    config = _first_config(tmp_path, key_dir)
    problems = load_server_config(config).refusing_settings()
    assert any("keys[0].allow" in p for p in problems)
    assert any("watermarkKeys[0].allow" in p for p in problems)
    assert any("architectures is set" in p and "access.robustness" in p for p in problems)
    with caplog.at_level(logging.WARNING, logger="modelsec.service"), InThreadServer(config):
        pass
    logged = [json.loads(r.getMessage()) for r in caplog.records if "config_refuses" in r.getMessage()]
    assert [entry["message"] for entry in logged] == problems
    # The configuration the examples ship grants what it configures: no warning.
    granted = write_server_config(tmp_path / "granted", key_dir)
    assert load_server_config(granted).refusing_settings() == []
