"""`verify` and the loader apply every policy that matches a model, as admission does (issue 17 item 3).

Before, `PolicySet.for_model` took the first match: a second policy naming the same models (another key, a
required algorithm, stricter refusals) was silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import PolicyError, PolicyViolationError, SignatureError
from modelsec.policy import IdentityRule, Policy, PolicySet, X509Authority
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.keys import load_trusted_key_file
from modelsec.verifier import verify_model
from modelsec.verifier.admission import ModelAdmission, admit_model

TWO_POLICIES = """
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: ci
    match: ["file://ROOT/**"]
    keys: [KEYS/ecdsa-p256.pub.pem]
  - name: release-board
    match: ["file://ROOT/tiny-*"]
    keys: [KEYS/sm2.pub.pem]
    requireAlgorithms: [sm2]
noMatch: deny
"""


def _policies(tmp_path: Path, key_dir: Path, model: Path, extra: str = "") -> PolicySet:
    path = tmp_path / "policy.yaml"
    body = TWO_POLICIES.replace("KEYS", str(key_dir)).replace("ROOT", os.path.realpath(model.parent))
    path.write_text(body + extra)
    return PolicySet.from_file(path)


def _sign(model: Path, key_dir: Path, *algs: str) -> None:
    sign_model(model, [load_private_key_file(key_dir / f"{a}.key.pem") for a in algs], force=True)


def test_a_second_matching_policy_must_pass_too(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    ps = _policies(tmp_path, key_dir, tiny_model)
    _sign(tiny_model, key_dir, "ecdsa-p256")  # what the first policy asks for, not the second
    with pytest.raises(SignatureError):
        verify_model(tiny_model, admit_model(tiny_model, ps))
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    result = verify_model(tiny_model, admit_model(tiny_model, ps))
    assert {b.algorithm.value for b in result.bundles} == {"ecdsa-p256"}  # the first policy's bundles hash
    # A model only the first policy matches is verified under that one alone.
    other = tiny_model.parent / "other-model"
    tiny_model.rename(other)
    _sign(other, key_dir, "ecdsa-p256")
    assert verify_model(other, admit_model(other, ps)).root_digest


def test_the_strictest_local_rules_apply(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    ps = _policies(tmp_path, key_dir, tiny_model)
    relaxed = ps.entries[0].policy
    assert admit_model(tiny_model.parent / "other", ps).others == ()
    text = (tmp_path / "policy.yaml").read_text()
    (tmp_path / "policy.yaml").write_text(
        text.replace("  - name: ci\n", "  - name: ci\n    allowRemoteCode: true\n    limits: {maxFiles: 8}\n")
    )
    ps = PolicySet.from_file(tmp_path / "policy.yaml")
    both = admit_model(tiny_model, ps)
    assert ps.entries[0].policy.allow_remote_code and not both.policy.allow_remote_code
    assert both.policy.limits.max_files == 8 and both.policy.limits.max_depth == relaxed.limits.max_depth
    (tiny_model / "modeling.py").write_text("print('remote code')\n")
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    verify_model(tiny_model, ps.entries[0].policy)  # the first policy alone allows it
    with pytest.raises(PolicyViolationError, match=r"remote code|\.py"):
        verify_model(tiny_model, both)


def test_loader_and_cli_apply_every_matching_policy(
    tiny_model: Path, key_dir: Path, tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from modelsec.verifier import load_model, open_model

    ps = _policies(tmp_path, key_dir, tiny_model)
    _sign(tiny_model, key_dir, "ecdsa-p256")
    with pytest.raises(SignatureError):
        load_model(tiny_model, ps)
    with pytest.raises(SignatureError):
        open_model(tiny_model, ps)
    out = cli("verify", tiny_model, "--policy", tmp_path / "policy.yaml")
    assert out.returncode == 1, out.stdout + out.stderr
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    assert load_model(tiny_model, ps)
    out = cli("verify", tiny_model, "--policy", tmp_path / "policy.yaml")
    assert out.returncode == 0, out.stderr


# `verify --require ALG` with several matching policies (issue: the requirement tightened only the first
# match, so the outcome depended on the file order). Neither policy below names requireAlgorithms itself.
CI = ("ci", "ecdsa-p256")
BOARD = ("release-board", "sm2")
ORDERS = pytest.mark.parametrize("order", [(CI, BOARD), (BOARD, CI)], ids=["ci-first", "board-first"])


def _ordered(tmp_path: Path, key_dir: Path, model: Path, order: tuple[tuple[str, ...], ...]) -> Path:
    root = os.path.realpath(model.parent)
    items = "".join(
        f'  - name: {name}\n    match: ["file://{root}/**"]\n'
        f"    keys: [{', '.join(f'{key_dir}/{k}.pub.pem' for k in keys)}]\n"
        for name, *keys in order
    )
    path = tmp_path / "ordered.yaml"
    path.write_text(
        f"apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n{items}noMatch: deny\n"
    )
    return path


def _required_by_name(admission: ModelAdmission) -> dict[str, set[str]]:
    return {p.name: {a.value for a in p.require_algorithms} for p in admission.policies}


@ORDERS
@pytest.mark.parametrize("require", ["ecdsa-p256", "sm2", "ecdsa-p256,sm2"])
def test_require_tightens_each_policy_able_to_meet_it_in_any_order(
    tiny_model: Path,
    key_dir: Path,
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess[str]],
    order: tuple[tuple[str, ...], ...],
    require: str,
) -> None:
    path = _ordered(tmp_path, key_dir, tiny_model, order)
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    out = cli("verify", tiny_model, "--policy", path, "--require", require, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["ok"] is True
    wanted = [SignatureAlgorithm(a) for a in require.split(",")]
    policy = admit_model(tiny_model, PolicySet.from_file(path)).requiring(wanted)
    # Each algorithm lands on the policy whose key makes it, wherever that policy sits in the file.
    assert _required_by_name(policy) == {
        "ci": {"ecdsa-p256"} & set(require.split(",")),
        "release-board": {"sm2"} & set(require.split(",")),
    }
    assert verify_model(tiny_model, policy).root_digest


@ORDERS
def test_require_is_still_enforced_on_the_policy_that_can_meet_it(
    tiny_model: Path,
    key_dir: Path,
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess[str]],
    order: tuple[tuple[str, ...], ...],
) -> None:
    # The board also trusts an ML-DSA key; the model carries no ML-DSA signature.
    order = tuple((*o, "ml-dsa-65") if o[0] == "release-board" else o for o in order)
    path = _ordered(tmp_path, key_dir, tiny_model, order)
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    assert cli("verify", tiny_model, "--policy", path).returncode == 0
    policy = admit_model(tiny_model, PolicySet.from_file(path)).requiring([SignatureAlgorithm.ML_DSA_65])
    assert _required_by_name(policy) == {"ci": set(), "release-board": {"ml-dsa-65"}}
    with pytest.raises(SignatureError, match="ml-dsa-65"):
        verify_model(tiny_model, policy)
    out = cli("verify", tiny_model, "--policy", path, "--require", "ml-dsa-65")
    assert out.returncode == 1 and "ml-dsa-65" in out.stderr, out.stderr


@ORDERS
def test_require_no_matching_policy_can_meet_is_refused(
    tiny_model: Path,
    key_dir: Path,
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess[str]],
    order: tuple[tuple[str, ...], ...],
) -> None:
    path = _ordered(tmp_path, key_dir, tiny_model, order)
    _sign(tiny_model, key_dir, "ecdsa-p256", "sm2")
    out = cli("verify", tiny_model, "--policy", path, "--require", "sm2,ecdsa-p384", "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    error = json.loads(out.stdout)["error"]
    assert error["kind"] == "PolicyError", error
    assert all(word in error["message"] for word in ("ecdsa-p384", "'ci'", "'release-board'"))
    both = admit_model(tiny_model, PolicySet.from_file(path))
    with pytest.raises(PolicyError, match=r"ecdsa-p384.*'(ci|release-board)'.*'(ci|release-board)'"):
        both.requiring([SignatureAlgorithm.SM2, SignatureAlgorithm.ECDSA_P384])


def test_require_counts_only_weights_keys_and_no_sm2_authority(key_dir: Path) -> None:
    p256, sm2 = SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.SM2
    gate_only = dataclasses.replace(load_trusted_key_file(key_dir / "sm2.pub.pem"), roles=frozenset({"gate"}))
    with pytest.raises(PolicyError, match="sm2"):
        ModelAdmission.of(Policy(keys=(gate_only,))).requiring([sm2])
    with pytest.raises(PolicyError, match="sm2"):  # the command line's own policy (--trusted-key)
        ModelAdmission.of(Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])).requiring([sm2])
    authority = X509Authority("corp-ca", (b"root",), (IdentityRule(identity="ci@example.com"),))
    by_ca = ModelAdmission.of(Policy(keys=(), authorities=(authority,)))
    assert by_ca.requiring([p256]).policy.require_algorithms == {p256}
    with pytest.raises(PolicyError, match="sm2"):
        by_ca.requiring([sm2])
    assert by_ca.requiring([]) == by_ca


def test_a_policy_file_requiring_what_its_own_keys_cannot_sign_is_refused_at_load(
    key_dir: Path, tmp_path: Path
) -> None:
    # Each policy verifies with its own keys: requireAlgorithms [ecdsa-p384] next to an SM2 key alone could
    # only refuse every model at verification time.
    path = tmp_path / "unmeetable.yaml"
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: board\n    match: ['file:///**']\n    keys: [{key_dir}/sm2.pub.pem]\n"
        "    requireAlgorithms: [sm2, ecdsa-p384]\n"
    )
    with pytest.raises(
        PolicyError, match=r"policies\[0\]\.requireAlgorithms: ecdsa-p384 can never be met.*'board'"
    ):
        PolicySet.from_file(path)
    path.write_text(path.read_text().replace(", ecdsa-p384", ""))
    assert PolicySet.from_file(path).policies[0].require_algorithms == {SignatureAlgorithm.SM2}


def test_a_missing_required_signature_names_the_policy_that_wanted_it(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    # The board policy (second in the file) trusts the ECDSA key too but requires SM2.
    extra_key = "keys: [KEYS/sm2.pub.pem, KEYS/ecdsa-p256.pub.pem]"
    path = tmp_path / "policy.yaml"
    body = TWO_POLICIES.replace("keys: [KEYS/sm2.pub.pem]", extra_key)
    path.write_text(body.replace("KEYS", str(key_dir)).replace("ROOT", os.path.realpath(tiny_model.parent)))
    ps = PolicySet.from_file(path)
    _sign(tiny_model, key_dir, "ecdsa-p256")
    with pytest.raises(
        SignatureError, match=r"required signature\(s\) missing: sm2 \(policy 'release-board'\)"
    ):
        verify_model(tiny_model, admit_model(tiny_model, ps))
