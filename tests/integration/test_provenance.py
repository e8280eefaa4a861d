"""SLSA v1 provenance from CI (issue 29, item 2): `modelsec attest provenance` and `release --provenance`.

The builder and invocation come from the CI environment (GitHub Actions, GitLab CI, the generic MODELSEC_*
set), never invented; outside CI the statement says it is a local build. A statement made under a
GitHub-Actions-shaped environment validates with the SLSA v1 bindings of `in-toto-attestation` (PyPI): the
protobuf messages, parsed with unknown fields refused, and the bindings' own `validate()`. The CLI in-process.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from modelsec.attestations.predicates.provenance import SLSA_PROVENANCE_V1, parse_provenance
from modelsec.policy import Policy
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier.attestations import find_statement_files, verified_statements
from tests.conftest import run_cli, write_tiny_model

pytestmark = pytest.mark.integration

GITHUB = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_SERVER_URL": "https://github.com",
    "GITHUB_REPOSITORY": "acme/llm",
    "GITHUB_REPOSITORY_ID": "101",
    "GITHUB_REPOSITORY_OWNER_ID": "7",
    "GITHUB_WORKFLOW_REF": "acme/llm/.github/workflows/release.yml@refs/heads/main",
    "GITHUB_SHA": "0123456789abcdef0123456789abcdef01234567",
    "GITHUB_REF": "refs/heads/main",
    "GITHUB_EVENT_NAME": "push",
    "RUNNER_ENVIRONMENT": "github-hosted",
    "GITHUB_RUN_ID": "4242",
    "GITHUB_RUN_ATTEMPT": "2",
}
GITLAB = {
    "GITLAB_CI": "true",
    "CI_SERVER_URL": "https://gitlab.example",
    "CI_PROJECT_PATH": "ml/llm",
    "CI_PROJECT_URL": "https://gitlab.example/ml/llm",
    "CI_RUNNER_ID": "12",
    "CI_RUNNER_VERSION": "17.2.0",
    "CI_JOB_URL": "https://gitlab.example/ml/llm/-/jobs/99",
    "CI_JOB_NAME": "release",
    "CI_COMMIT_SHA": "89abcdef0123456789abcdef0123456789abcdef",
    "CI_COMMIT_REF_NAME": "main",
}
CI_MARKERS = ("GITHUB_ACTIONS", "GITLAB_CI", "MODELSEC_BUILDER_ID")
DATASET = "ab" * 32


def _signed(tmp_path: Path, key_dir: Path, name: str, seed: int) -> tuple[Path, str]:
    model = write_tiny_model(tmp_path / name, seed=seed)
    return model, sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]).root_digest


def _provenance(
    tmp_path: Path, key_dir: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, *args: Any
) -> tuple[Path, str, Path, str, dict[str, Any]]:
    for name in CI_MARKERS:
        monkeypatch.delenv(name, raising=False)
    base, base_root = _signed(tmp_path, key_dir, "base", 71)
    model, root = _signed(tmp_path, key_dir, "tuned", 72)
    r = run_cli(
        "attest", "provenance", model, "--base-model", base, "--dataset", f"digits=sha256:{DATASET}",
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json", *args, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    (one,) = verified_statements(root, find_statement_files(model), policy, SLSA_PROVENANCE_V1).statements
    return base, base_root, model, root, {"statement": one.statement}


def test_github_actions_provenance_validates_with_the_in_toto_slsa_v1_bindings(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    json_format = pytest.importorskip("google.protobuf.json_format")
    provenance_pb2 = pytest.importorskip("in_toto_attestation.predicates.provenance.v1.provenance_pb2")
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement as ItStatement

    base, base_root, _, root, got = _provenance(tmp_path, key_dir, GITHUB, monkeypatch)
    statement = got["statement"]
    # The in-toto bindings: statement and predicate parse with unknown fields refused, then validate.
    pb = json_format.Parse(statement.raw, statement_pb2.Statement(), ignore_unknown_fields=False)
    ItStatement.copy_from_pb(pb).validate()
    predicate = json_format.ParseDict(
        json.loads(json.dumps(dict(statement.predicate))),
        provenance_pb2.Provenance(),
        ignore_unknown_fields=False,
    )
    assert predicate.build_definition.build_type == "https://actions.github.io/buildtypes/workflow/v1"
    assert predicate.run_details.builder.id == "https://github.com/actions/runner/github-hosted"
    assert (
        predicate.run_details.metadata.invocation_id
        == "https://github.com/acme/llm/actions/runs/4242/attempts/2"
    )
    for dep in predicate.build_definition.resolved_dependencies:
        ResourceDescriptor.copy_from_pb(dep).validate()
    workflow = dict(statement.predicate["buildDefinition"]["externalParameters"]["workflow"])
    assert workflow == {
        "ref": "refs/heads/main",
        "repository": "https://github.com/acme/llm",
        "path": ".github/workflows/release.yml",
    }
    assert statement.subjects[0].digest["sha256"] == root
    # modelsec's own reading: the code, the dataset, the base model and its signature bundle.
    parsed = parse_provenance(statement, what="provenance")
    assert not parsed.local
    assert [(s.repository, s.commit, s.ref) for s in parsed.sources] == [
        ("https://github.com/acme/llm", GITHUB["GITHUB_SHA"], "refs/heads/main")
    ]
    assert [d.sha256 for d in parsed.datasets] == [DATASET]
    (b,) = parsed.base_models
    assert b.root_digest == base_root
    assert b.bundle_sha256 == hashlib.sha256((base / "model.sig").read_bytes()).hexdigest()


def test_gitlab_generic_and_local_builders(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = [
        (GITLAB, "https://gitlab.example/ml/llm/-/runners/12", GITLAB["CI_COMMIT_SHA"]),
        (
            {"MODELSEC_BUILDER_ID": "https://ci.example/builders/gpu-1", "MODELSEC_SOURCE_REPO": "https://g.example/r",
             "MODELSEC_SOURCE_COMMIT": "f" * 40, "MODELSEC_INVOCATION_ID": "run-5"},
            "https://ci.example/builders/gpu-1",
            "f" * 40,
        ),
        ({}, "https://modelsec.dev/builders/local", None),
    ]  # fmt: skip
    for i, (env, builder, commit) in enumerate(cases):
        got = _provenance(tmp_path / str(i), key_dir, env, monkeypatch)[4]
        parsed = parse_provenance(got["statement"], what="provenance")
        assert parsed.builder_id == builder
        assert [s.commit for s in parsed.sources] == ([commit] if commit else [])
        assert parsed.local is (not env)
        if not env:
            assert got["statement"].predicate["buildDefinition"]["internalParameters"] == {"local": True}
            assert "invocationId" not in got["statement"].predicate["runDetails"]["metadata"]


def test_explicit_source_and_git_checkout(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _provenance(
        tmp_path / "a",
        key_dir,
        {},
        monkeypatch,
        "--source-repo",
        "https://g.example/x",
        "--source-commit",
        "c" * 40,
    )[4]
    assert [s.commit for s in parse_provenance(got["statement"], what="p").sources] == ["c" * 40]
    checkout = tmp_path / "code"
    checkout.mkdir()
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://g.example/train"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    got = _provenance(tmp_path / "b", key_dir, {}, monkeypatch, "--source-dir", checkout)[4]
    (source,) = parse_provenance(got["statement"], what="p").sources
    assert (source.repository, source.commit) == ("https://g.example/train", head)


@pytest.mark.parametrize(
    "missing", ["GITHUB_WORKFLOW_REF", "GITHUB_SHA", "RUNNER_ENVIRONMENT", "GITHUB_RUN_ID"]
)
def test_a_ci_environment_missing_a_variable_is_refused_not_invented(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    for name in CI_MARKERS:
        monkeypatch.delenv(name, raising=False)
    model, _ = _signed(tmp_path, key_dir, "m", 73)
    env = {k: v for k, v in GITHUB.items() if k != missing}
    r = run_cli(
        "attest", "provenance", model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json", env=env
    )
    assert r.returncode == 1
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "PolicyError" and missing in error["message"]
    assert not (model / "model.attestations").exists()


def test_an_unsigned_or_stale_base_model_is_refused(
    tmp_path: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in CI_MARKERS:
        monkeypatch.delenv(name, raising=False)
    model, _ = _signed(tmp_path, key_dir, "m", 74)
    unsigned = write_tiny_model(tmp_path / "unsigned", seed=75)
    stale, _ = _signed(tmp_path, key_dir, "stale", 76)
    (stale / "config.json").write_text('{"changed": true}')
    for base in (unsigned, stale):
        r = run_cli(
            "attest", "provenance", model, "--base-model", base,
            "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json",
        )  # fmt: skip
        assert r.returncode == 1
        error = json.loads(r.stdout)["error"]
        assert error["kind"] == "MalformedArtifactError" and str(base) in error["message"]
    assert not (model / "model.attestations").exists()
