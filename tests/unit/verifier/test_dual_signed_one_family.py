"""A model signed with two keys of one family verifies for a consumer holding only one of them.

User trial 2, finding 4: `model.p384.sig` can only hold ECDSA P-384 and `model.ml-dsa-44.sig` only ML-DSA-44
(`check_bundle_name`), so with only a P-256 (or ML-DSA-65) key they are skipped and reported, as a bundle of
another family is; `model.sig` may hold any ECDSA curve, and is skipped only when its signature's encoding
rules out every configured key (a P-256 signature with only a P-384 key). A policy that requires both
algorithms still refuses. The key that checks a signature describes it ("an ecdsa-p256 key cannot have made
this signature"), with its reason; a hint names the other scheme only when the signature has that scheme's
strict, in-range form (issue 27, 8).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from modelsec.cli.main import main
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.support.policies import write_policy_file

PAIRS = {
    "ecdsa": (("ecdsa-p256", "model.sig"), ("ecdsa-p384", "model.p384.sig")),
    "ml-dsa": (("ml-dsa-44", "model.ml-dsa-44.sig"), ("ml-dsa-65", "model.ml-dsa-65.sig")),
}


@pytest.fixture(scope="module")
def dual(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> dict[str, Path]:
    models = {}
    for family, pair in PAIRS.items():
        model = write_tiny_model(tmp_path_factory.mktemp(f"dual-{family}") / "model")
        sign_model(model, [load_private_key_file(key_dir / f"{alg}.key.pem") for alg, _ in pair])
        assert {name for _, name in pair} <= {p.name for p in model.iterdir()}
        models[family] = model
    return models


def _invoke(*args: str | Path) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, json.loads(result.stdout), result.stderr


@pytest.mark.parametrize(("family", "held"), [("ecdsa", 0), ("ecdsa", 1), ("ml-dsa", 0), ("ml-dsa", 1)])
def test_either_key_alone_verifies_and_skips_the_other(
    dual: dict[str, Path], key_dir: Path, family: str, held: int
) -> None:
    (alg, name), (_, other) = PAIRS[family][held], PAIRS[family][1 - held]
    model = dual[family]
    code, out, err = _invoke("verify", model, "--trusted-key", key_dir / f"{alg}.pub.pem", "--json")
    assert code == 0 and out["ok"] is True, (out, err)
    assert [(Path(b["path"]).name, b["algorithm"]) for b in out["bundles"]] == [(name, alg)]
    assert [Path(p).name for p in out["skipped"]] == [other]
    # inspect reads the same bundles the same way: the other one is skipped, not refused.
    code, out, err = _invoke("inspect", model, "--trusted-key", key_dir / f"{alg}.pub.pem", "--json")
    assert code == 0, (out, err)
    rows = {Path(b["path"]).name: b for b in out["bundles"]}
    assert rows[name]["signer"]["algorithm"] == alg and rows[name]["skipped"] is False
    assert rows[other]["signer"] is None and rows[other]["skipped"] is True


@pytest.mark.parametrize("family", PAIRS)
def test_a_policy_requiring_both_still_needs_both(
    dual: dict[str, Path], key_dir: Path, tmp_path: Path, family: str
) -> None:
    (first, first_name), (second, second_name) = PAIRS[family]
    keys = [key_dir / f"{first}.pub.pem", key_dir / f"{second}.pub.pem"]
    # Without the second key the requirement can never be met: the policy itself is refused.
    one_key = write_policy_file(
        tmp_path / "one.json", name="both", keys=keys[:1], requireAlgorithms=[first, second]
    )
    code, out, _ = _invoke("verify", dual[family], "--policy", one_key, "--json")
    assert code == 1 and f"{second} can never be met" in out["error"]["message"]
    both = write_policy_file(
        tmp_path / "both.json", name="both", keys=keys, requireAlgorithms=[first, second]
    )
    code, out, _ = _invoke("verify", dual[family], "--policy", both, "--json")
    assert code == 0 and out["skipped"] == [], out
    # With both keys, a model carrying only the first bundle is refused...
    model = tmp_path / "model"
    shutil.copytree(dual[family], model)
    (model / second_name).unlink()
    code, out, _ = _invoke("verify", model, "--policy", both, "--json")
    assert code == 1 and f"required signature(s) missing: {second}" in out["error"]["message"]
    # ...and one whose second bundle does not verify is refused, not skipped (a key of its algorithm is held).
    bundle = json.loads((dual[family] / second_name).read_text())
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = json.loads((dual[family] / first_name).read_text())[
        "dsseEnvelope"
    ]["signatures"][0]["sig"]
    (model / second_name).write_text(json.dumps(bundle))
    code, out, _ = _invoke("verify", model, "--trusted-key", keys[0], "--trusted-key", keys[1], "--json")
    assert code == 1 and second_name in out["error"]["message"], out


def test_a_key_of_another_curve_is_named_as_such(
    dual: dict[str, Path], key_dir: Path, tmp_path: Path
) -> None:
    # A P-384 bundle at model.sig (where model_signing writes it), checked with a P-256 key.
    model = tmp_path / "model"
    shutil.copytree(dual["ecdsa"], model)
    (model / "model.sig").unlink()
    (model / "model.p384.sig").rename(model / "model.sig")
    code, out, _ = _invoke("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json")
    assert code == 1
    message = out["error"]["message"]
    assert "model.sig not checked (no configured key of its algorithm)" in message
    code, out, _ = _invoke(
        "verify", model, "-s", model / "model.sig", "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json"
    )
    assert code == 1
    message, (detail,) = out["error"]["message"], out["error"]["details"]
    # Another signer's bundle: not "invalid", only not signed by a key trusted here (issue 31); each key's
    # reason is the detail (--verbose, `error.details`).
    assert "model.sig: signed by a key not trusted here" in message and "invalid" not in message
    assert "ecdsa-p256.pub.pem: an ecdsa-p256 key cannot have made this signature" in detail
    assert "(it has the form of an ecdsa-p384 signature)" in detail
    # ...and the other way round: a P-384 key, the P-256 bundle.
    code, out, _ = _invoke(
        "verify",
        dual["ecdsa"],
        "-s",
        dual["ecdsa"] / "model.sig",
        "--trusted-key",
        key_dir / "ecdsa-p384.pub.pem",
        "--json",
    )
    (detail,) = out["error"]["details"]
    assert "an ecdsa-p384 key cannot have made this signature" not in detail  # in range for P-384: it checks
    assert "does not verify under key" in detail
    assert "(it has the form of an ecdsa-p256 or sm2 signature)" in detail


def test_a_key_of_another_parameter_set_is_named_as_such(dual: dict[str, Path], key_dir: Path) -> None:
    model = dual["ml-dsa"]
    code, out, _ = _invoke(
        "verify",
        model,
        "-s",
        model / "model.ml-dsa-44.sig",
        "--trusted-key",
        key_dir / "ml-dsa-65.pub.pem",
        "--json",
    )
    assert code == 1
    message, (detail,) = out["error"]["message"], out["error"]["details"]
    assert "ml-dsa-65.pub.pem: an ml-dsa-65 key cannot have made this signature" in detail
    assert "signed by a key not trusted here" in message and "invalid" not in message
    assert "(it has the form of an ml-dsa-44 signature)" in detail
