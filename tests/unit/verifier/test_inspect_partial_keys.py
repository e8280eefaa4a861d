"""`inspect` and `attest list` with only the P-256 key on an ECDSA + SM2 model: check what it can, skip SM2.

`verify MODEL -k p256.pub` accepts such a model and notes the SM2 bundle it could not check; `inspect` and
`attest list` must do the same (issue 19), while still refusing a bundle the given key's scheme should verify
and a bundle named explicitly with --signature.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelsec.cli.main import main
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model


@pytest.fixture(scope="module")
def both_signed(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> Path:
    model = write_tiny_model(tmp_path_factory.mktemp("partial-keys") / "model")
    keys = [load_private_key_file(key_dir / f"{a}.key.pem") for a in ("ecdsa-p256", "sm2")]
    sign_model(model, keys)
    assert {"model.sig", "model.sm2.sig"} <= {p.name for p in model.iterdir()}
    return model


def _invoke(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", [["inspect"], ["attest", "list"]])
def test_p256_key_checks_ecdsa_and_skips_sm2(both_signed: Path, key_dir: Path, command: list[str]) -> None:
    p256 = key_dir / "ecdsa-p256.pub.pem"
    code, out, err = _invoke(*command, both_signed, "--trusted-key", p256, "--json")
    assert code == 0, out + err
    rows = {Path(b["path"]).name: b for b in json.loads(out)["bundles"]}
    assert rows["model.sig"]["signer"]["algorithm"] == "ecdsa-p256"
    assert rows["model.sig"]["skipped"] is False
    assert rows["model.sm2.sig"]["signer"] is None
    assert rows["model.sm2.sig"]["skipped"] is True
    # Text output: the same verdicts, and verify's note on stderr for the skipped bundle.
    code, out, err = _invoke(*command, both_signed, "--trusted-key", p256)
    assert code == 0, out + err
    assert "model.sm2.sig not checked (no configured key of its algorithm)" in err
    assert "model.sig not checked" not in err
    for name, verified in (("model.sig", True), ("model.sm2.sig", False)):
        path = str(both_signed / name)
        lines = [
            line for line in out.splitlines() if line.startswith(f"{path}:") or line.endswith(f" {path}")
        ]
        assert len(lines) == 1 and ("UNVERIFIED" not in lines[0]) == verified, out


@pytest.mark.parametrize("command", [["inspect"], ["attest", "list"]])
def test_both_keys_check_both(both_signed: Path, key_dir: Path, command: list[str]) -> None:
    code, out, err = _invoke(
        *command, both_signed, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key",
        key_dir / "sm2.pub.pem", "--json"
    )
    assert code == 0, out + err
    signers = sorted(b["signer"]["algorithm"] for b in json.loads(out)["bundles"])
    assert signers == ["ecdsa-p256", "sm2"]


@pytest.mark.parametrize("command", [["inspect"], ["attest", "list"]])
def test_wrong_key_of_a_checkable_scheme_is_still_refused(
    both_signed: Path, key_dir: Path, command: list[str]
) -> None:
    code, out, _ = _invoke(*command, both_signed, "--trusted-key", key_dir / "other.pub.pem", "--json")
    assert code == 1
    # Another signer's bundle (a SignatureError subclass naming the key id it states and the keys tried).
    assert json.loads(out)["error"]["kind"] == "UntrustedSignerError"


def test_explicit_sm2_signature_is_checked_not_skipped(both_signed: Path, key_dir: Path) -> None:
    code, out, _ = _invoke(
        "inspect",
        both_signed,
        "--signature",
        both_signed / "model.sm2.sig",
        "--trusted-key",
        key_dir / "ecdsa-p256.pub.pem",
        "--json",
    )
    assert code == 1 and json.loads(out)["error"]["kind"] == "UntrustedSignerError"  # a SignatureError


@pytest.mark.parametrize("command", [["inspect"], ["attest", "list"]])
def test_nothing_checkable_is_refused(
    both_signed: Path, key_dir: Path, tmp_path: Path, command: list[str]
) -> None:
    only_sm2 = tmp_path / "only-sm2"
    shutil.copytree(both_signed, only_sm2)
    (only_sm2 / "model.sig").unlink()
    code, out, _ = _invoke(*command, only_sm2, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json")
    assert code == 1
    error = json.loads(out)["error"]
    assert error["kind"] == "SignatureError" and "no bundle can be checked" in error["message"]
