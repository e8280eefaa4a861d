"""SLSA v1 provenance about a model (`https://slsa.dev/provenance/v1`): which build made it, from what.

Source: SLSA v1.0 provenance (https://slsa.dev/spec/v1.0/provenance), in-toto ResourceDescriptor v1; for
GitHub Actions the layout of GitHub's own artifact attestations (buildType
`https://actions.github.io/buildtypes/workflow/v1`), for GitLab CI the runner's SLSA v1 provenance
(`https://gitlab.com/gitlab-org/gitlab-runner/-/blob/<version>/PROVENANCE.md`).

The builder and the invocation are read from the CI environment (`build_environment`), never invented:

| environment | recognised by | builder.id | invocationId |
|---|---|---|---|
| GitHub Actions | `GITHUB_ACTIONS=true` | `https://github.com/actions/runner/<RUNNER_ENVIRONMENT>` | (1) |
| GitLab CI | `GITLAB_CI=true` | `<CI_SERVER_URL>/<CI_PROJECT_PATH>/-/runners/<CI_RUNNER_ID>` | `CI_JOB_URL` |
| generic | `MODELSEC_BUILDER_ID` set | `MODELSEC_BUILDER_ID` | `MODELSEC_INVOCATION_ID` (optional) |
| none | none of these | `https://modelsec.dev/builders/local` | none |

(1) `<GITHUB_SERVER_URL>/<GITHUB_REPOSITORY>/actions/runs/<GITHUB_RUN_ID>/attempts/<GITHUB_RUN_ATTEMPT>`.

The GitHub workflow (`GITHUB_WORKFLOW_REF`: `owner/repo/.github/workflows/x.yml@refs/heads/main`) is
recorded in `externalParameters.workflow` (`ref`, `repository`, `path`), as GitHub records it: a policy
that wants `slsa-verifier`'s builder check compares the workflow, since the runner id names only the kind of
runner. A recognised CI environment missing a variable its builder needs is refused (`PolicyError`, naming
the variable), never filled in. Outside CI the provenance says so: the local builder id and
`internalParameters.local: true`.

`resolvedDependencies` name, each an in-toto ResourceDescriptor carrying the annotation `modelsec.dev/role`:

- `source`: the training code, `{"uri": "git+<repository>@<ref>", "digest": {"gitCommit": "<sha>"}}`;
- `dataset`: each dataset, `{"name": ..., "digest": {"sha256": ...}}` (the gate's dataset digest is one);
- `base-model`: each base model, `{"name": ..., "digest": {"sha256": "<model root digest>"}}` with the
  annotation `modelsec.dev/signatureBundleSha256` (hex SHA-256 of the base model's signature bundle file).

```json
{"_type": "https://in-toto.io/Statement/v1",
 "subject": [{"name": "llm", "digest": {"sha256": "<model root digest>"}}],
 "predicateType": "https://slsa.dev/provenance/v1",
 "predicate": {
   "buildDefinition": {
     "buildType": "https://actions.github.io/buildtypes/workflow/v1",
     "externalParameters": {"workflow": {"ref": "refs/heads/main", "repository": "https://github.com/acme/llm",
                                         "path": ".github/workflows/release.yml"}},
     "internalParameters": {"github": {"event_name": "push", "repository_id": "1", "repository_owner_id": "2",
                                       "runner_environment": "github-hosted"}},
     "resolvedDependencies": [
       {"uri": "git+https://github.com/acme/llm@refs/heads/main", "digest": {"gitCommit": "<40 hex>"},
        "annotations": {"modelsec.dev/role": "source"}},
       {"name": "digits", "digest": {"sha256": "<hex>"}, "annotations": {"modelsec.dev/role": "dataset"}},
       {"name": "base", "digest": {"sha256": "<base model root digest>"},
        "annotations": {"modelsec.dev/role": "base-model", "modelsec.dev/signatureBundleSha256": "<hex>"}}]},
   "runDetails": {
     "builder": {"id": "https://github.com/actions/runner/github-hosted"},
     "metadata": {"invocationId": "https://github.com/acme/llm/actions/runs/7/attempts/1",
                  "startedOn": "2026-01-01T00:00:00Z"}}}}
```

`parse_provenance` reads these back (strictly: the shape SLSA v1 requires, and every modelsec dependency
well formed); it does not judge the builder or the sources (the policy's conditions do).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import MalformedArtifactError, PolicyError
from modelsec.limits import Limits

__all__ = [
    "LOCAL_BUILDER_ID",
    "MODELSEC_BUILD_TYPE",
    "SLSA_PROVENANCE_V1",
    "BaseModel",
    "BuildEnvironment",
    "Dataset",
    "Provenance",
    "Source",
    "build_environment",
    "parse_provenance",
    "provenance_statement",
]

SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
MODELSEC_BUILD_TYPE = "https://modelsec.dev/buildtypes/release/v1"
GITHUB_BUILD_TYPE = "https://actions.github.io/buildtypes/workflow/v1"
LOCAL_BUILDER_ID = "https://modelsec.dev/builders/local"
ROLE = "modelsec.dev/role"
BUNDLE_DIGEST = "modelsec.dev/signatureBundleSha256"
_GIT_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Source:
    """Training code: a git repository (URL) at a commit (40 or 64 lowercase hex), optionally a ref."""

    repository: str
    commit: str
    ref: str = ""

    def descriptor(self) -> dict[str, Any]:
        """Its ResourceDescriptor."""
        uri = f"git+{self.repository}" + (f"@{self.ref}" if self.ref else "")
        return {"uri": uri, "digest": {"gitCommit": self.commit}, "annotations": {ROLE: "source"}}


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset by name (informational) and SHA-256 digest (hex)."""

    name: str
    sha256: str

    def descriptor(self) -> dict[str, Any]:
        """Its ResourceDescriptor."""
        return {"name": self.name, "digest": {"sha256": self.sha256}, "annotations": {ROLE: "dataset"}}


@dataclass(frozen=True, slots=True)
class BaseModel:
    """A base model: its model root digest and the SHA-256 of its signature bundle file (both hex)."""

    name: str
    root_digest: str
    bundle_sha256: str

    def descriptor(self) -> dict[str, Any]:
        """Its ResourceDescriptor."""
        return {
            "name": self.name,
            "digest": {"sha256": self.root_digest},
            "annotations": {ROLE: "base-model", BUNDLE_DIGEST: self.bundle_sha256},
        }


@dataclass(frozen=True, slots=True)
class BuildEnvironment:
    """The builder and invocation read from the CI environment (`build_environment`).

    Attributes:
        kind: `github`, `gitlab`, `generic` or `local`.
        builder_id: `runDetails.builder.id`.
        build_type: `buildDefinition.buildType`.
        invocation_id: `runDetails.metadata.invocationId`, or "" (local).
        external: `buildDefinition.externalParameters` from the environment.
        internal: `buildDefinition.internalParameters` from the environment.
        source: The training code the environment names (its repository at its commit), if any.
    """

    kind: str
    builder_id: str
    build_type: str
    invocation_id: str = ""
    external: Mapping[str, Any] = field(default_factory=dict)
    internal: Mapping[str, Any] = field(default_factory=dict)
    source: Source | None = None


def _need(env: Mapping[str, str], names: Sequence[str], kind: str) -> list[str]:
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise PolicyError(
            f"{kind}: {', '.join(missing)} not set; provenance names only what the CI environment says "
            "(run inside the CI job, or unset the variable that marks it as CI)"
        )
    return [env[n] for n in names]


def _github(env: Mapping[str, str]) -> BuildEnvironment:
    workflow_ref, sha, repo, runner, run_id, attempt = _need(
        env,
        [
            "GITHUB_WORKFLOW_REF",
            "GITHUB_SHA",
            "GITHUB_REPOSITORY",
            "RUNNER_ENVIRONMENT",
            "GITHUB_RUN_ID",
            "GITHUB_RUN_ATTEMPT",
        ],
        "GitHub Actions",
    )
    server = env.get("GITHUB_SERVER_URL") or "https://github.com"
    path, sep, ref = workflow_ref.removeprefix(f"{repo}/").partition("@")
    if not workflow_ref.startswith(f"{repo}/") or not sep or not path or not ref:
        raise PolicyError(f"GitHub Actions: GITHUB_WORKFLOW_REF {workflow_ref!r} is not {repo}/<path>@<ref>")
    internal: dict[str, Any] = {"runner_environment": runner}
    for key, var in (
        ("event_name", "GITHUB_EVENT_NAME"),
        ("repository_id", "GITHUB_REPOSITORY_ID"),
        ("repository_owner_id", "GITHUB_REPOSITORY_OWNER_ID"),
    ):
        if env.get(var):
            internal[key] = env[var]
    return BuildEnvironment(
        "github",
        f"https://github.com/actions/runner/{runner}",
        GITHUB_BUILD_TYPE,
        f"{server}/{repo}/actions/runs/{run_id}/attempts/{attempt}",
        {"workflow": {"ref": ref, "repository": f"{server}/{repo}", "path": path}},
        {"github": internal},
        Source(f"{server}/{repo}", sha.lower(), env.get("GITHUB_REF", "")),
    )


def _gitlab(env: Mapping[str, str]) -> BuildEnvironment:
    server, project, runner_id, job_url, sha, project_url, version = _need(
        env,
        [
            "CI_SERVER_URL",
            "CI_PROJECT_PATH",
            "CI_RUNNER_ID",
            "CI_JOB_URL",
            "CI_COMMIT_SHA",
            "CI_PROJECT_URL",
            "CI_RUNNER_VERSION",
        ],
        "GitLab CI",
    )
    external = {"source": project_url, "entryPoint": env.get("CI_JOB_NAME", "")}
    internal = {
        "gitlab": {
            k: env[v] for k, v in (("pipeline_id", "CI_PIPELINE_ID"), ("job_id", "CI_JOB_ID")) if env.get(v)
        }
    }
    return BuildEnvironment(
        "gitlab",
        f"{server}/{project}/-/runners/{runner_id}",
        f"https://gitlab.com/gitlab-org/gitlab-runner/-/blob/v{version}/PROVENANCE.md",
        job_url,
        external,
        internal,
        Source(project_url, sha.lower(), env.get("CI_COMMIT_REF_NAME", "")),
    )


def _generic(env: Mapping[str, str]) -> BuildEnvironment:
    source = None
    if env.get("MODELSEC_SOURCE_REPO") or env.get("MODELSEC_SOURCE_COMMIT"):
        repo, commit = _need(env, ["MODELSEC_SOURCE_REPO", "MODELSEC_SOURCE_COMMIT"], "generic builder")
        source = Source(repo, commit.lower(), env.get("MODELSEC_SOURCE_REF", ""))
    return BuildEnvironment(
        "generic",
        env["MODELSEC_BUILDER_ID"],
        env.get("MODELSEC_BUILD_TYPE") or MODELSEC_BUILD_TYPE,
        env.get("MODELSEC_INVOCATION_ID", ""),
        source=source,
    )


def build_environment(env: Mapping[str, str]) -> BuildEnvironment:
    """The builder and invocation the CI environment `env` names (see the module docstring's table).

    GitHub Actions is recognised by `GITHUB_ACTIONS=true`, GitLab CI by `GITLAB_CI=true`, a generic builder
    by `MODELSEC_BUILDER_ID`; otherwise the build is local.

    Raises:
        PolicyError: A recognised CI environment lacks a variable its builder or invocation needs, or
            `GITHUB_WORKFLOW_REF` is not `<repository>/<path>@<ref>`.
    """
    if env.get("GITHUB_ACTIONS") == "true":
        return _github(env)
    if env.get("GITLAB_CI") == "true":
        return _gitlab(env)
    if env.get("MODELSEC_BUILDER_ID"):
        return _generic(env)
    return BuildEnvironment("local", LOCAL_BUILDER_ID, MODELSEC_BUILD_TYPE, internal={"local": True})


def _check_source(source: Source) -> None:
    if not _GIT_COMMIT.fullmatch(source.commit):
        raise MalformedArtifactError(f"source commit {source.commit!r} is not a git commit (40 or 64 hex)")
    if not source.repository or any(c.isspace() for c in source.repository):
        raise MalformedArtifactError(f"source repository {source.repository!r} is not a URL")


def provenance_statement(
    root_digest: str,
    *,
    name: str,
    environment: BuildEnvironment,
    sources: Sequence[Source] = (),
    datasets: Sequence[Dataset] = (),
    base_models: Sequence[BaseModel] = (),
    started_on: datetime | None = None,
    finished_on: datetime | None = None,
) -> Statement:
    """The unsigned SLSA v1 provenance statement about the model `root_digest`.

    Args:
        root_digest: The model root digest (hex SHA-256): the subject.
        name: The subject name (informational).
        environment: From `build_environment`; its source (if any) is recorded unless `sources` name one.
        sources: Training code given explicitly (`--source-repo`/`--source-commit`, a git checkout).
        datasets: Dataset digests.
        base_models: Base models with their signature bundles' digests.
        started_on: When the build started (UTC), if known.
        finished_on: When it finished (default: now).

    Raises:
        MalformedArtifactError: A digest is not SHA-256 hex, a commit not 40/64 hex, a repository empty.
    """
    chosen = list(sources) or ([environment.source] if environment.source is not None else [])
    for s in chosen:
        _check_source(s)
    named = [(d.name, [d.sha256]) for d in datasets] + [
        (b.name, [b.root_digest, b.bundle_sha256]) for b in base_models
    ]
    for dependency, digests in named:
        if not all(is_sha256_hex(x) for x in digests):
            raise MalformedArtifactError(f"{dependency}: a digest is not SHA-256 hex")
    if not is_sha256_hex(root_digest):
        raise MalformedArtifactError(f"model root digest {root_digest!r} is not SHA-256 hex")
    metadata: dict[str, Any] = {}
    if environment.invocation_id:
        metadata["invocationId"] = environment.invocation_id
    if started_on is not None:
        metadata["startedOn"] = _rfc3339(started_on)
    metadata["finishedOn"] = _rfc3339(finished_on or datetime.now(UTC))
    predicate = {
        "buildDefinition": {
            "buildType": environment.build_type,
            "externalParameters": dict(environment.external),
            "internalParameters": dict(environment.internal),
            "resolvedDependencies": [
                *(s.descriptor() for s in chosen),
                *(d.descriptor() for d in datasets),
                *(b.descriptor() for b in base_models),
            ],
        },
        "runDetails": {"builder": {"id": environment.builder_id}, "metadata": metadata},
    }
    return Statement((Subject(name, {"sha256": root_digest}),), SLSA_PROVENANCE_V1, predicate)


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Provenance:
    """A parsed SLSA v1 provenance predicate (its signature is not checked here).

    Attributes:
        builder_id: `runDetails.builder.id`.
        build_type: `buildDefinition.buildType`.
        local: The build says it ran outside CI (the local builder id).
        sources: Dependencies annotated `source` (or whose digest is a `gitCommit`).
        datasets: Dependencies annotated `dataset`.
        base_models: Dependencies annotated `base-model`: what lineage follows.
    """

    builder_id: str
    build_type: str
    local: bool
    sources: tuple[Source, ...]
    datasets: tuple[Dataset, ...]
    base_models: tuple[BaseModel, ...]


def _obj(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise MalformedArtifactError(f"{what} is not an object")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedArtifactError(f"{what} is not a non-empty string")
    return value


def parse_provenance(statement: Statement, *, what: str, limits: Limits | None = None) -> Provenance:
    """The builder and dependencies of a SLSA v1 provenance statement (strict shape; nothing trusted).

    Checks what SLSA v1 requires (`buildDefinition.buildType`, `externalParameters` an object,
    `runDetails.builder.id`), that `resolvedDependencies` is a list of objects, and that every dependency
    modelsec annotates (`modelsec.dev/role`) is well formed: a source with a 40/64-hex `gitCommit` and a
    `git+` URI, a dataset with a SHA-256 digest, a base model with a SHA-256 root digest and bundle digest.
    Other dependencies are kept out of the result and not judged.

    Args:
        statement: A statement whose predicateType is `https://slsa.dev/provenance/v1`.
        what: Names the bundle in errors.
        limits: Unused (the `PredicateParser` signature).

    Raises:
        MalformedArtifactError: Another predicate type, or a field above is missing or malformed (named).
    """
    del limits
    if statement.predicate_type != SLSA_PROVENANCE_V1:
        raise MalformedArtifactError(f"{what}: predicateType {statement.predicate_type!r} is not SLSA v1")
    p = statement.predicate
    definition = _obj(p.get("buildDefinition"), f"{what}: buildDefinition")
    build_type = _text(definition.get("buildType"), f"{what}: buildDefinition.buildType")
    _obj(definition.get("externalParameters"), f"{what}: buildDefinition.externalParameters")
    run = _obj(p.get("runDetails"), f"{what}: runDetails")
    builder = _text(_obj(run.get("builder"), f"{what}: runDetails.builder").get("id"), f"{what}: builder.id")
    deps = definition.get("resolvedDependencies", [])
    if not isinstance(deps, list):
        raise MalformedArtifactError(f"{what}: buildDefinition.resolvedDependencies is not a list")
    sources: list[Source] = []
    datasets: list[Dataset] = []
    bases: list[BaseModel] = []
    for i, raw in enumerate(deps):
        at = f"{what}: resolvedDependencies[{i}]"
        dep = _obj(raw, at)
        annotations = dep.get("annotations", {})
        role = annotations.get(ROLE) if isinstance(annotations, Mapping) else None
        digest = _obj(dep.get("digest", {}), f"{at}.digest")
        if role == "source":
            uri = _text(dep.get("uri"), f"{at}.uri")
            commit = digest.get("gitCommit")
            if not uri.startswith("git+") or not isinstance(commit, str) or not _GIT_COMMIT.fullmatch(commit):
                raise MalformedArtifactError(f"{at}: a source is a git+ URI with a gitCommit digest")
            repo, _, ref = uri[4:].partition("@")
            sources.append(Source(repo, commit, ref))
        elif role == "dataset":
            if not is_sha256_hex(digest.get("sha256")):
                raise MalformedArtifactError(f"{at}: a dataset has a SHA-256 digest")
            datasets.append(Dataset(str(dep.get("name", "")), digest["sha256"]))
        elif role == "base-model":
            bundle = annotations.get(BUNDLE_DIGEST)
            if not is_sha256_hex(digest.get("sha256")) or not is_sha256_hex(bundle):
                raise MalformedArtifactError(
                    f"{at}: a base model has a SHA-256 root digest and {BUNDLE_DIGEST}"
                )
            bases.append(BaseModel(str(dep.get("name", "")), digest["sha256"], bundle))
        elif role is not None:
            raise MalformedArtifactError(f"{at}: unknown {ROLE} {role!r}")
    return Provenance(
        builder, build_type, builder == LOCAL_BUILDER_ID, tuple(sources), tuple(datasets), tuple(bases)
    )
