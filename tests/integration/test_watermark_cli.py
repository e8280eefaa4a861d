"""`modelsec watermark` as a user runs it: keygen, embed (+ attestation), detect exit codes, --json."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from modelsec.watermark.spread_spectrum import DEFAULT_CODE_MARGIN
from tests.conftest import run_cli
from tests.unit.watermark._helpers import load_state, permute_scale_mlp, save_state
from tests.unit.watermark.conftest import mlp_state

pytestmark = pytest.mark.integration


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return save_state(mlp_state(), tmp_path / "model")


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    stderr = r.stderr
    assert r.returncode == 1, (r.returncode, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelsec: error: "), stderr
    return lines[0]


def test_keygen_embed_detect_round_trip(model: Path, tmp_path: Path, key_dir: Path) -> None:
    key = tmp_path / "wm.key"
    r = run_cli("watermark", "keygen", "-o", key, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ok": True, "command": "watermark keygen", "watermarkKey": str(key)}
    assert oct(key.stat().st_mode & 0o777) == "0o600" and len(key.read_bytes()) == 65
    assert key.read_text().strip() not in r.stdout + r.stderr
    assert run_cli("watermark", "keygen", "-o", key).returncode == 2  # never overwritten silently

    att = tmp_path / "marked.watermark.json"
    r = run_cli(
        "watermark",
        "embed",
        model,
        "--watermark-key",
        key,
        "--message",
        "ACME-clf",
        "--out",
        tmp_path / "marked",
        "--signing-key",
        key_dir / "ecdsa-p256.key.pem",
        "--attestation",
        att,
        "--json",
    )
    assert r.returncode == 0, r.stderr
    embedded = json.loads(r.stdout)
    assert embedded["ok"] and embedded["detection"]["detected"] and embedded["messageBits"] == 64
    assert embedded["maxRelativeChange"] <= 0.25
    # The message code and its margin are reported as the attestation records them.
    statement = json.loads(base64.b64decode(json.loads(att.read_text())["dsseEnvelope"]["payload"]))
    recorded = statement["predicate"]["parameters"]
    assert embedded["messageCode"] == recorded["messageCode"] == "crc32-conv7"
    assert embedded["codeMargin"] == recorded["codeMargin"] == DEFAULT_CODE_MARGIN  # the default
    assert key.read_text().strip() not in r.stdout + att.read_text()
    digest = run_cli("digest", tmp_path / "marked", "--json")
    assert json.loads(digest.stdout)["rootDigest"] == embedded["rootDigest"]

    r = run_cli("watermark", "detect", tmp_path / "marked", "--watermark-key", key)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("DETECTED: 64/64 pilot bits") and "'ACME-clf'" in r.stdout
    r = run_cli(
        "watermark", "detect", tmp_path / "marked", "--watermark-key", key, "--message", "ACME-clf", "--json"
    )
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["ok"] and found["detected"] and found["bits"] == 64 and found["bitMatches"] == 64
    assert found["messageMatched"] is True and found["messageMatches"] == found["messageBits"] == 64
    assert found["falsePositiveProbability"] < 1e-9 and found["confidence"] == 1.0
    r = run_cli("watermark", "detect", tmp_path / "marked", "--watermark-key", key, "--attestation", att,
        "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["tests"] == 1

    # Unmarked model and wrong key: exit 1, still a well-formed report.
    r = run_cli("watermark", "detect", model, "--watermark-key", key, "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["ok"] is False and report["error"]["kind"] == "GateFailedError"
    assert not report["detected"] and report["falsePositiveProbability"] > 1e-6
    other = tmp_path / "other.key"
    other.write_text(os.urandom(32).hex())
    r = run_cli("watermark", "detect", tmp_path / "marked", "--watermark-key", other)
    assert r.returncode == 1 and r.stdout.startswith("NOT DETECTED")
    line = _one_line_error(
        run_cli("watermark", "detect", tmp_path / "marked", "--watermark-key", other, "--attestation", att)
    )
    assert "does not match the key commitment" in line


def test_detect_with_a_message_gives_two_verdicts(model: Path, tmp_path: Path) -> None:
    """User trial 2: a wrong message never exits 0, and a present mark is never reported as not detected."""
    key = tmp_path / "wm.key"
    assert run_cli("watermark", "keygen", "-o", key).returncode == 0
    marked = tmp_path / "marked"
    assert run_cli("watermark", "embed", model, "--watermark-key", key, "-m", "v1", "-o",
        marked).returncode == 0

    r = run_cli("watermark", "detect", marked, "--watermark-key", key, "-m", "v1", "--json")
    assert r.returncode == 0, r.stderr
    good = json.loads(r.stdout)
    assert good["ok"] and good["detected"] and good["messageMatched"] is True

    # "v2" differs from "v1" in two of its 16 bits; hex:0000 in eight.
    for message, differ in (("v2", 2), ("hex:0000", 8)):
        r = run_cli("watermark", "detect", marked, "--watermark-key", key, "-m", message, "--json")
        assert r.returncode == 1, (message, r.stdout)
        out = json.loads(r.stdout)
        assert out["ok"] is False and out["error"]["kind"] == "GateFailedError"
        assert out["detected"] is True and out["messageMatched"] is False
        assert out["bitMatches"] == out["bits"] == good["bits"] and out["messageMatches"] == 16 - differ
        assert out["falsePositiveProbability"] == good["falsePositiveProbability"]
        assert out["error"]["message"] == (
            f"watermark present ({good['bits']}/{good['bits']} pilot bits, false-positive probability "
            f"{good['falsePositiveProbability']:.3g}) but it carries another message: {differ}/16 message "
            "bits differ"
        )
        line = _one_line_error(run_cli("watermark", "detect", marked, "--watermark-key", key, "-m", message))
        assert "watermark present" in line and "carries another message" in line
    line = _one_line_error(run_cli("watermark", "detect", marked, "--watermark-key", key, "-m", "v1v2"))
    assert line.endswith("carries another message: 16 message bits found, 32 given")
    line = _one_line_error(run_cli("watermark", "detect", model, "--watermark-key", key, "-m", "v1"))
    assert "watermark not detected" in line


def test_detect_with_reference_after_permutation(model: Path, tmp_path: Path) -> None:
    key = tmp_path / "wm.key"
    assert run_cli("watermark", "keygen", "-o", key).returncode == 0
    r = run_cli(
        "watermark", "embed", model, "--watermark-key", key, "-m", "hex:00112233445566778899", "-o",
        tmp_path / "marked"
    )
    assert r.returncode == 0, r.stderr
    save_state(permute_scale_mlp(load_state(tmp_path / "marked")), tmp_path / "attacked")
    assert run_cli("watermark", "detect", tmp_path / "attacked", "--watermark-key", key).returncode == 1
    r = run_cli("watermark", "detect", tmp_path / "attacked", "--watermark-key", key, "--reference", model)
    assert r.returncode == 0, r.stderr
    assert "hex:00112233445566778899" in r.stdout and "re-synchronised 2 permuted" in r.stdout


def test_bad_inputs_give_one_line_diagnostics(model: Path, tmp_path: Path) -> None:
    key = tmp_path / "wm.key"
    key.write_text(os.urandom(32).hex())
    short = tmp_path / "short.key"
    short.write_text("abcdef")
    not_st = tmp_path / "pickles"
    not_st.mkdir()
    (not_st / "pytorch_model.bin").write_bytes(b"\x80\x04.")
    cases = [
        (
            ("watermark", "detect", model, "--watermark-key", tmp_path / "missing.key"),
            "KeyMaterialError",
            "cannot read the watermark key file",
        ),
        (("watermark", "detect", model, "--watermark-key", short), "KeyMaterialError", "too short"),
        (("watermark", "detect", not_st, "--watermark-key", key), "MalformedArtifactError",
            "no *.safetensors"),
        (
            ("watermark", "embed", model, "--watermark-key", key, "-m", "x" * 64, "-o", tmp_path / "o"),
            "PolicyError",
            "message too long for capacity",
        ),
        (
            ("watermark", "embed", model, "--watermark-key", key, "-m", "m", "-o", model),
            "PolicyError",
            "must not be the model",
        ),
    ]
    for args, kind, needle in cases:
        line = _one_line_error(run_cli(*args))
        assert needle in line, line
        r = run_cli(*args, "--json")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        err = json.loads(r.stdout)
        assert err["ok"] is False and err["error"]["kind"] == kind and needle in err["error"]["message"]
    r = run_cli("watermark", "embed", model, "--watermark-key", key, "-m", "m", "-o", tmp_path / "o2",
        "--signing-key", key)
    assert r.returncode == 2 and "--signing-key and --attestation" in r.stderr
    r = run_cli("watermark", "detect", model, "--watermark-key", key, "-m", "x", "--message-bits", "8")
    assert r.returncode == 2
    # A malformed message is the command line's mistake: a usage error naming the option.
    r = run_cli("watermark", "embed", model, "--watermark-key", key, "-m", "hex:zz", "-o", tmp_path / "o")
    assert r.returncode == 2 and "'--message'" in r.stderr and "invalid hex" in r.stderr
