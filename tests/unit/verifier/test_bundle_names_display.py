"""`inspect`, `attest list` and `attest show` hold a default-named bundle to verify's name rule.

`verify` refuses a bundle whose default name says another scheme than the key that signed it
(`check_bundle_name`: `cp model.sig model.p384.sig`, an SM2 bundle at `model.sig`); the display commands
showed it as signed by that key. With a trusted key they now refuse it with verify's own words; without one
nothing is verified (UNVERIFIED), so there is no signer for the rule to compare the name with.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelsec.cli.main import main
from modelsec.signer import load_private_key_file, sign_model

COMMANDS = [["inspect"], ["attest", "list"], ["attest", "show"]]


def _invoke(*args: str | Path) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, json.loads(result.stdout)


def _sign(model: Path, key_dir: Path, alg: str, to: str | None = None) -> None:
    key = load_private_key_file(key_dir / f"{alg}.key.pem")
    sign_model(model, [key], signature_paths={0: model / to} if to else None)


def _misnamed(model: Path, key_dir: Path, case: str) -> str:
    """Lay out a model verify refuses for its bundle's name; return the key that signed it."""
    if case == "p256-copied-to-p384-name":
        _sign(model, key_dir, "ecdsa-p256")
        shutil.copy(model / "model.sig", model / "model.p384.sig")
        return "ecdsa-p256"
    _sign(model, key_dir, "sm2", to="model.sig")
    return "sm2"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", ["p256-copied-to-p384-name", "sm2-at-model-sig"])
def test_a_misnamed_bundle_is_refused_with_verifys_words(
    tiny_model: Path, key_dir: Path, command: list[str], case: str
) -> None:
    alg = _misnamed(tiny_model, key_dir, case)
    key = key_dir / f"{alg}.pub.pem"
    code, verified = _invoke("verify", tiny_model, "--trusted-key", key, "--json")
    assert code == 1 and verified["error"]["kind"] == "SignatureError"  # type: ignore[index]
    assert "a default-named bundle must be of its name's algorithm" in verified["error"]["message"]  # type: ignore[index]

    code, shown = _invoke(*command, tiny_model, "--trusted-key", key, "--json")
    assert code == 1, shown
    assert shown["error"] == verified["error"]


@pytest.mark.parametrize("command", COMMANDS)
def test_without_a_key_the_misnamed_bundle_is_listed_unverified(
    tiny_model: Path, key_dir: Path, command: list[str]
) -> None:
    _misnamed(tiny_model, key_dir, "sm2-at-model-sig")
    code, shown = _invoke(*command, tiny_model, "--json")
    assert code == 0 and [b["signer"] for b in shown["bundles"]] == [None]  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_p384_bundle_at_model_sig_is_shown_as_verify_accepts_it(
    tiny_model: Path, key_dir: Path, command: list[str]
) -> None:
    _sign(tiny_model, key_dir, "ecdsa-p384", to="model.sig")
    key = key_dir / "ecdsa-p384.pub.pem"
    assert _invoke("verify", tiny_model, "--trusted-key", key, "--json")[0] == 0
    code, shown = _invoke(*command, tiny_model, "--trusted-key", key, "--json")
    assert code == 0, shown
    assert [b["signer"]["algorithm"] for b in shown["bundles"]] == ["ecdsa-p384"]  # type: ignore[attr-defined]


def test_inspect_applies_the_rule_to_an_explicit_default_name_as_verify_does(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    _sign(tiny_model, key_dir, "ecdsa-p256")
    elsewhere = tmp_path / "model.sm2.sig"
    shutil.copy(tiny_model / "model.sig", elsewhere)
    key = key_dir / "ecdsa-p256.pub.pem"
    _, verified = _invoke("verify", tiny_model, "--trusted-key", key, "--signature", elsewhere, "--json")
    code, shown = _invoke("inspect", tiny_model, "--trusted-key", key, "--signature", elsewhere, "--json")
    assert code == 1 and shown["error"] == verified["error"]
    assert "model.sm2.sig" in shown["error"]["message"]  # type: ignore[index]
