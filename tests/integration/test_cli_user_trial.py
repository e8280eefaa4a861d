"""CLI findings of the fresh-user trial (reports/user-trial.md): `attest` on a path that is not a model
directory, and the `--json` replies of `inspect`/`verify`. In-process (click's runner)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from modelsec.cli.main import main

pytestmark = pytest.mark.integration


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _reply(result: Result) -> dict[str, Any]:
    (line,) = result.stdout.strip().splitlines()
    doc = json.loads(line)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("command", [("attest", "list"), ("attest", "show")])
def test_attest_on_a_missing_path_or_a_file_fails_like_digest(
    command: tuple[str, str], tmp_path: Path, tiny_model: Path
) -> None:
    """Finding 3: `attest list nonexist` exited 0 (and `attest show` printed [])."""
    missing = tmp_path / "nonexist"
    digest = _invoke("digest", missing)
    result = _invoke(*command, missing)
    assert (result.exit_code, digest.exit_code) == (1, 1)
    assert (
        result.stderr
        == digest.stderr
        == (f"modelsec: error: {missing}: cannot read the model directory: No such file or directory\n")
    )
    assert result.stdout == ""
    doc = _reply(_invoke(*command, missing, "--json"))
    assert doc["ok"] is False and doc["error"]["kind"] == "MalformedArtifactError"
    weights = next(tiny_model.glob("*.safetensors"))
    result = _invoke(*command, weights)
    assert result.exit_code == 1 and result.stderr == f"modelsec: error: {weights}: not a directory\n"


@pytest.mark.parametrize("command", ["verify", "inspect", "sign"])
@pytest.mark.parametrize("stream", ["-", "/dev/stdin", "/dev/fd/0"])
def test_a_bundle_on_standard_input_is_refused_with_its_reason(
    command: str, stream: str, tiny_model: Path, key_dir: Path
) -> None:
    """Finding 13: `-s /dev/stdin` was refused as "a symlink", `-s -` as "not found"; bundles are files."""
    key = key_dir / ("ecdsa-p256.key.pem" if command == "sign" else "ecdsa-p256.pub.pem")
    option = "--signing-key" if command == "sign" else "--trusted-key"
    doc = _reply(_invoke(command, tiny_model, "-s", stream, option, key, "--json"))
    assert doc["error"]["kind"] == "UsageError"
    assert (
        f"{stream}: a signature bundle must be a regular file, not standard input" in doc["error"]["message"]
    )


def test_inspect_without_a_bundle_fails_like_verify(tmp_path: Path, tiny_model: Path, key_dir: Path) -> None:
    """Finding 9: `inspect` answered a usage error (exit 2) where `verify` says SignatureError (exit 1)."""
    pub = key_dir / "ecdsa-p256.pub.pem"
    verify = _invoke("verify", tiny_model, "--trusted-key", pub, "--json")
    inspect = _invoke("inspect", tiny_model, "--json")
    assert (verify.exit_code, inspect.exit_code) == (1, 1)
    assert _reply(inspect)["error"] == _reply(verify)["error"]
    assert _reply(inspect)["error"]["kind"] == "SignatureError"


def test_verify_json_bundles_carry_the_signer_object(tiny_model: Path, key_dir: Path) -> None:
    """Finding 9: `verify --json` bundles had no `signer` object, unlike inspect and attest list."""
    pub = key_dir / "ecdsa-p256.pub.pem"
    assert _invoke("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem").exit_code == 0
    (bundle,) = _reply(_invoke("verify", tiny_model, "--trusted-key", pub, "--json"))["bundles"]
    (shown,) = _reply(_invoke("inspect", tiny_model, "--trusted-key", pub, "--json"))["bundles"]
    assert bundle["signer"] == shown["signer"]
    assert bundle["signer"] == {"algorithm": "ecdsa-p256", "key": pub.name, "keyid": bundle["keyid"]}


def test_errors_name_a_file_once(tmp_path: Path) -> None:
    """`digest FILE.safetensors` printed `FILE.safetensors/FILE.safetensors: ...`; `attest push` printed the
    bundle path twice (the caller's context repeated the path the message already starts with)."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((8).to_bytes(8, "little") + b"[]      ")
    result = _invoke("digest", bad)
    assert result.exit_code == 1
    assert result.stderr == f"modelsec: error: {bad}: header does not start with `{{` (not a JSON object)\n"
    store = tmp_path / "store"
    store.mkdir()
    result = _invoke("attest", "push", store, tmp_path / "missing.sig")
    assert result.exit_code == 1
    assert result.stderr == (
        f"modelsec: error: {tmp_path / 'missing.sig'}: cannot read the attestation bundle: "
        "No such file or directory\n"
    )
