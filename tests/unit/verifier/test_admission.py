"""`mode: warn` means the same at every front door (issue 26): a warn policy's failure is reported, not fatal.

Before, "every matching policy must pass" was implemented twice: `Policy.also` for `verify` and the loader,
which ignored `mode`, and a loop in the webhook, which honoured it. A `warn` policy refused a model at
`verify` and at load time that admission let through with a warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from modelsec.errors import BackendUnavailableError, PolicyViolationError, SignatureError
from modelsec.policy import Policy, PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model

if TYPE_CHECKING:  # imported in the tests, so that the CLI tests run (and fail) on the code before it
    from modelsec.verifier.admission import ModelAdmission

# `ci` is met by an ECDSA signature; `release-board` wants SM2 and is in MODE (enforce or warn).
POLICIES = """
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: ci
    match: ["file://ROOT/**"]
    keys: [KEYS/ecdsa-p256.pub.pem]
  - name: release-board
    match: ["file://ROOT/tiny-*"]
    keys: [KEYS/sm2.pub.pem]
    mode: MODE
noMatch: deny
"""


def _policy_file(tmp_path: Path, key_dir: Path, model: Path, mode: str, body: str = POLICIES) -> Path:
    path = tmp_path / f"policy-{mode}.yaml"
    root = os.path.realpath(model.parent)
    path.write_text(body.replace("KEYS", str(key_dir)).replace("ROOT", root).replace("MODE", mode))
    return path


def _sign_ecdsa_only(model: Path, key_dir: Path) -> None:
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])


# --- verify (the CLI, in-process) -------------------------------------------------------------------------


def test_verify_reports_a_failing_warn_policy_and_passes(
    tiny_model: Path, key_dir: Path, tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    _sign_ecdsa_only(tiny_model, key_dir)
    path = _policy_file(tmp_path, key_dir, tiny_model, "warn")
    out = cli("verify", tiny_model, "--policy", path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("OK sha256:")
    assert "warning: policy 'release-board' (mode: warn)" in out.stderr and "sm2" not in out.stdout
    out = cli("verify", tiny_model, "--policy", path, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] is True
    assert [w for w in doc["warnings"] if "'release-board' (mode: warn)" in w], doc["warnings"]


def test_verify_still_refuses_when_the_same_policy_enforces(
    tiny_model: Path, key_dir: Path, tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    _sign_ecdsa_only(tiny_model, key_dir)
    out = cli(
        "verify", tiny_model, "--policy", _policy_file(tmp_path, key_dir, tiny_model, "enforce"), "--json"
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert json.loads(out.stdout)["error"]["kind"] == "SignatureError"


def test_a_passing_warn_policy_adds_no_warning(
    tiny_model: Path, key_dir: Path, tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    sign_model(tiny_model, [load_private_key_file(key_dir / f"{a}.key.pem") for a in ("ecdsa-p256", "sm2")])
    out = cli("verify", tiny_model, "--policy", _policy_file(tmp_path, key_dir, tiny_model, "warn"), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not [w for w in json.loads(out.stdout)["warnings"] if "mode: warn" in w]


# --- the loader and the guard ------------------------------------------------------------------------


def test_the_loader_warns_about_a_failing_warn_policy_and_loads(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from modelsec.verifier import load_model, open_model

    _sign_ecdsa_only(tiny_model, key_dir)
    policies = PolicySet.from_file(_policy_file(tmp_path, key_dir, tiny_model, "warn"))
    for load in (load_model, lambda m, p: open_model(m, p).keys()):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert load(tiny_model, policies)  # the code before issue 26: SignatureError
        [warning] = [w for w in seen if "release-board" in str(w.message)]
        assert type(warning.message).__name__ == "PolicyWarning"
        assert "'release-board' (mode: warn)" in str(warning.message)
    enforced = PolicySet.from_file(_policy_file(tmp_path, key_dir, tiny_model, "enforce"))
    with pytest.raises(SignatureError, match="no signature bundle was signed by a configured key"):
        load_model(tiny_model, enforced)


def test_the_guard_warns_about_a_failing_warn_policy(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    from modelsec.verifier.admission import PolicyWarning
    from modelsec.verifier.guard import hook

    _sign_ecdsa_only(tiny_model, key_dir)
    policies = PolicySet.from_file(_policy_file(tmp_path, key_dir, tiny_model, "warn"))
    with pytest.warns(PolicyWarning, match="release-board"):
        hook.preflight(tiny_model, policies)


def test_a_model_only_warn_policies_match_must_still_verify_locally(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    # Nothing verifies the bytes: the loader has no verified bytes to hand out, so a local use is refused.
    body = POLICIES.replace("  - name: ci\n    match", "  - name: ci\n    mode: warn\n    match")
    policies = PolicySet.from_file(_policy_file(tmp_path, key_dir, tiny_model, "warn", body))
    with pytest.raises(SignatureError):
        verify_model(tiny_model, _admission(tiny_model, policies))
    _sign_ecdsa_only(tiny_model, key_dir)
    assert verify_model(tiny_model, _admission(tiny_model, policies)).warnings


def _admission(model: Path, policies: PolicySet) -> ModelAdmission:
    from modelsec.verifier.admission import admit_model

    return admit_model(model, policies)


# --- the evaluation itself -------------------------------------------------------------------------------


def _set(tmp_path: Path, key_dir: Path, extra: str = "") -> PolicySet:
    path = tmp_path / "set.yaml"
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f'  - {{name: a, match: ["oci://r/**"], keys: [{key_dir}/ecdsa-p256.pub.pem]}}\n'
        f'  - {{name: b, match: ["oci://r/m"], keys: [{key_dir}/sm2.pub.pem], mode: warn}}\n'
        f"{extra}"
    )
    return PolicySet.from_file(path)


def _refuse(names: set[str]) -> Callable[[Policy], str]:
    def check(policy: Policy) -> str:
        if policy.name in names:
            raise SignatureError(f"{policy.name} is not met")
        return "verified"

    return check


def test_evaluate_enforce_and_warn(tmp_path: Path, key_dir: Path) -> None:
    from modelsec.verifier.admission import evaluate

    policies = _set(tmp_path, key_dir)
    ok = evaluate(policies, "oci://r/m", _refuse(set()))
    assert ok.allowed and [p.name for p in ok.matched] == ["a", "b"] and ok.warnings() == ()
    warned = evaluate(policies, "oci://r/m", _refuse({"b"}))
    assert warned.allowed and warned.warnings() == ("policy 'b' (mode: warn): b is not met",)
    warned.raise_for_enforced()  # nothing to raise
    denied = evaluate(policies, "oci://r/m", _refuse({"a", "b"}))
    assert not denied.allowed and [o.policy.name for o in denied.enforced_failures] == ["a"]
    with pytest.raises(SignatureError, match="a is not met"):
        denied.raise_for_enforced()


def test_evaluate_no_match_and_digest_requirement(tmp_path: Path, key_dir: Path) -> None:
    from modelsec.verifier.admission import DigestRequiredError, evaluate

    rules = (
        "namespaceRules:\n  - {namespaces: [scratch], noMatch: allow}\n"
        "  - {namespaces: [team], noMatch: warn}\n"
    )
    policies = _set(tmp_path, key_dir, rules)
    never = _refuse({"a", "b"})
    nowhere = evaluate(policies, "oci://elsewhere/m", never)
    assert not nowhere.allowed and nowhere.no_match == "deny"
    with pytest.raises(PolicyViolationError, match="noMatch: deny"):
        nowhere.raise_for_enforced()
    assert evaluate(policies, "oci://elsewhere/m", never, namespace="scratch").allowed
    team = evaluate(policies, "oci://elsewhere/m", never, namespace="team")
    assert team.allowed and "in namespace 'team' (noMatch: warn)" in team.warnings()[0]
    assert not evaluate(policies, "oci://elsewhere/m", never, namespace="prod").allowed
    unpinned = evaluate(policies, "oci://r/m", _refuse(set()), pinned=False)
    assert not unpinned.allowed
    assert all(isinstance(o.error, DigestRequiredError) for o in unpinned.outcomes)
    assert "requires a pinned @sha256:" in unpinned.outcomes[0].detail


def test_evaluate_raises_an_outage(tmp_path: Path, key_dir: Path) -> None:
    from modelsec.verifier.admission import evaluate

    def down(policy: Policy) -> str:
        raise BackendUnavailableError("store down")

    with pytest.raises(BackendUnavailableError):
        evaluate(_set(tmp_path, key_dir), "oci://r/m", down)


def test_no_warnings_escape_a_passing_model(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    sign_model(tiny_model, [load_private_key_file(key_dir / f"{a}.key.pem") for a in ("ecdsa-p256", "sm2")])
    policies = PolicySet.from_file(_policy_file(tmp_path, key_dir, tiny_model, "warn"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = verify_model(tiny_model, _admission(tiny_model, policies))
    assert result.warnings == ()
