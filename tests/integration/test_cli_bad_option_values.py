"""Option values that are wrong by themselves are usage errors (exit 2) naming the option (user trial 2, #7).

The README's contract: exit 2 means "fix the command line", exit 1 "refused or failed". A value modelsec
checks itself (a range, NaN, hex syntax, a digest, an inconsistent pair) must follow it, with the usage line
and the option's name on stderr, or under --json the `UsageError` reply. The same checks in the Python API
keep raising `PolicyError`. In-process (click's runner); every command here fails before any work, so the
files named need not exist except where the check comes after reading them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from modelsec.cli.main import main
from modelsec.errors import PolicyError

pytestmark = pytest.mark.integration

HEX = "0" * 64
_GATE = ("gate", "pgd", "m", "--arch", "a:b", "--data", "d.npz", "--signing-key", "k.pem")
_GATE_REQUIRED = ("--trusted-key", "k.pub", "-o", "o.sig")
_EMBED = ("watermark", "embed", "m", "--watermark-key", "wk", "-o", "out")
_DETECT = ("watermark", "detect", "m", "--watermark-key", "wk")
_RELEASE = (
    "release",
    "m",
    "-o",
    "out",
    "--signing-key",
    "k.pem",
    "--watermark-key",
    "wk",
    "--gate-config",
    "g",
)

# (arguments, the option the error must name)
BAD_VALUES = [
    (("verify", "m", "--trusted-key", "k.pub", "--expected-digest", "md5:00"), "--expected-digest"),
    (
        ("verify", "m", "--trusted-key", "k.pub", "--expected-digest", "sha256:" + "A" * 64),
        "--expected-digest",
    ),
    ((*_EMBED, "-m", "0xZZ"), "--message"),
    ((*_EMBED, "-m", "hex:0"), "--message"),
    ((*_EMBED, "-m", ""), "--message"),
    ((*_EMBED, "-m", "x" * 65), "--message"),
    ((*_EMBED, "-m", "x", "--kappa", "-1"), "--kappa"),
    ((*_EMBED, "-m", "x", "--kappa", "nan"), "--kappa"),
    ((*_EMBED, "-m", "x", "--max-relative-change", "0"), "--max-relative-change"),
    ((*_EMBED, "-m", "x", "--max-fidelity-loss", "2"), "--max-fidelity-loss"),
    ((*_DETECT, "--min-confidence", "5"), "--min-confidence"),
    ((*_DETECT, "--max-false-positive", "-1"), "--max-false-positive"),
    ((*_DETECT, "--max-false-positive", "nan"), "--max-false-positive"),
    ((*_DETECT, "-m", "0xZZ"), "--message"),
    ((*_DETECT, "--message-bits", "12"), "--message-bits"),
    ((*_DETECT, "--message-bits", "1024"), "--message-bits"),
    ((*_GATE, *_GATE_REQUIRED, "--eps", "-1", "--min-robust-accuracy", "0.5"), "--eps"),
    ((*_GATE, *_GATE_REQUIRED, "--eps", "nan", "--min-robust-accuracy", "0.5"), "--eps"),
    ((*_GATE, *_GATE_REQUIRED, "--eps", "inf", "--min-robust-accuracy", "0.5"), "--eps"),
    ((*_GATE, *_GATE_REQUIRED, "--eps", "0.1", "--min-robust-accuracy", "0.5", "--steps", "0"), "--steps"),
    ((*_GATE, *_GATE_REQUIRED, "--eps", "0.1", "--min-robust-accuracy", "2"), "--min-robust-accuracy"),
    ((*_GATE, *_GATE_REQUIRED, "--eps", "0.1", "--min-robust-accuracy", "nan"), "--min-robust-accuracy"),
    (
        (*_GATE, *_GATE_REQUIRED, "--eps", "0.1", "--min-robust-accuracy", "0.5", "--step-size", "0"),
        "--step-size",
    ),
    (
        (
            *_GATE,
            *_GATE_REQUIRED,
            "--eps",
            "0.1",
            "--min-robust-accuracy",
            "0.5",
            "--clip-min",
            "1",
            "--clip-max",
            "0",
        ),
        "--clip-min",
    ),
    (
        (*_GATE, *_GATE_REQUIRED, "--eps", "0.1", "--min-robust-accuracy", "0.5", "--device", "cuda:x"),
        "--device",
    ),
    (
        (*_GATE, *_GATE_REQUIRED, "--eps", "0.1", "--min-robust-accuracy", "0.5", "--batch-size", "0"),
        "--batch-size",
    ),
    ((*_RELEASE, "-m", "0xZZ"), "--message"),
    ((*_RELEASE, "-m", "x", "--report", "r.txt"), "--report"),
    ((*_RELEASE, "-m", "x", "--report", "out/r.md"), "--report"),
    (("attest", "delete", "store", "--digest", "../../..", "--id", "x"), "--digest"),
    (("attest", "pull", "zz", "--server", "localhost:1", "--plaintext"), "ROOT_DIGEST"),
    (("sign", "m", "--signing-key", "k.pem", "--timestamp-url", "ftp://tsa.example"), "--timestamp-url"),
    (("serve", "--config", "c.yaml", "--listen", "nonsense"), "--listen"),
    (("pull", "/not/a/ref", "dest", "--trusted-key", "k.pub"), "oci://"),
    (
        (
            "webhook",
            "serve",
            "--policy",
            "p",
            "--store",
            "s",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--deadline",
            "nan",
        ),
        "--deadline",
    ),
]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the relative names above never reach a real file


def _run(args: tuple[str, ...]) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    ("args", "option"), BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_a_bad_option_value_is_a_usage_error(tmp_path: Path, args: tuple[str, ...], option: str) -> None:
    result = _run(args)
    assert result.exit_code == 2, result.output
    assert "Usage:" in result.stderr and option in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "option"), BAD_VALUES[::4], ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_under_json_a_bad_option_value_is_the_usage_error_reply(
    tmp_path: Path, args: tuple[str, ...], option: str
) -> None:
    result = _run((*args, "--json"))
    assert result.exit_code == 2, result.output
    (line,) = result.stdout.strip().splitlines()
    doc = json.loads(line)
    assert doc["ok"] is False and doc["error"]["kind"] == "UsageError"
    assert option in doc["error"]["message"]


def test_the_api_still_raises_policy_error_for_the_same_values() -> None:
    from modelsec.robustness.gate_config import GateConfig
    from modelsec.signer.watermark_keys import parse_message
    from modelsec.verifier.pinning import expected_digest_set
    from modelsec.watermark.spread_spectrum import WatermarkParams

    with pytest.raises(PolicyError):
        GateConfig(eps=float("nan"), step_size=0.01, steps=10, min_robust_accuracy=0.5)
    with pytest.raises(PolicyError):
        WatermarkParams(kappa=-1)
    with pytest.raises(PolicyError):
        parse_message("0xZZ")
    with pytest.raises(PolicyError):
        expected_digest_set(["md5:00"])


def test_good_values_still_reach_the_command() -> None:
    """The new checks refuse only bad values: a valid call gets past parsing (to the missing key file)."""
    result = _run(
        (
            *_GATE,
            *_GATE_REQUIRED,
            "--eps",
            "0",
            "--min-robust-accuracy",
            "1",
            "--clip-min",
            "-1",
            "--device",
            "cuda:0",
        )
    )
    assert result.exit_code == 1, result.output
    assert "Usage:" not in result.stderr


def test_upper_case_pin_in_the_environment_says_so(tmp_path: Path) -> None:
    result = CliRunner(env={"MODELSEC_MODEL_DIGEST": "sha256:" + "A" * 64}).invoke(
        main, ["verify", str(tmp_path), "--trusted-key", str(tmp_path / "k.pub")]
    )
    assert result.exit_code == 1
    assert "not lower-case" in result.stderr and "malformed model URI" not in result.stderr


def test_pin_mismatch_names_the_digest_prefix_once(tiny_model: Path, key_dir: Path) -> None:
    runner = CliRunner()
    assert (
        runner.invoke(
            main, ["sign", str(tiny_model), "--signing-key", str(key_dir / "ecdsa-p256.key.pem")]
        ).exit_code
        == 0
    )
    result = runner.invoke(
        main,
        [
            "verify",
            str(tiny_model),
            "--trusted-key",
            str(key_dir / "ecdsa-p256.pub.pem"),
            "--expected-digest",
            HEX,
        ],
    )
    assert result.exit_code == 1
    assert f"expected root digest sha256:{HEX}, got sha256:" in result.stderr
    assert "sha256 digest sha256:" not in result.stderr
