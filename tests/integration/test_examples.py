"""The examples under `examples/`, run exactly as their documentation shows them.

No command is copied here: `examples/README.md`'s `bash` blocks are read, in order, and each line is run in a
copy of `examples/` (the `modelsec` commands in-process through `run_cli`, `python` scripts with `runpy`),
against the real registry of the session (`registry`) and a real `modelsec serve` started in a thread from
the documented `serve` line. The CI pipelines (`examples/ci/*.yml`) are parsed as GitHub Actions and GitLab CI
would read them, and their `run:` / `script:` lines run the same way with the variables each file says it
needs pointed at the same registry, and the variables the runner itself sets.

What a line may be is a short list (`_Shell.run`); anything else fails the test, so documentation that grows
a step nobody runs is caught.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from modelsec.algorithms import SignatureAlgorithm
from modelsec.signer import generate_private_key_pem
from tests.conftest import REPO, run_cli, write_tiny_model
from tests.integration._lenet_release import require_inputs
from tests.support.oci import Registry
from tests.support.service import InThreadServer

pytestmark = [pytest.mark.integration]

EXAMPLES = REPO / "examples"
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_GITHUB_EXPRESSION = re.compile(r"\$\{\{\s*(secrets|vars)\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_FENCE = re.compile(r"^```(\w*)\s*$")


def bash_blocks(markdown: str) -> list[str]:
    """The bodies of the fenced ```bash blocks of `markdown`, in order."""
    blocks: list[str] = []
    current: list[str] | None = None
    language = ""
    for line in markdown.splitlines():
        fence = _FENCE.match(line.strip())
        if fence and current is None:
            current, language = [], fence.group(1)
        elif line.strip() == "```" and current is not None:
            if language == "bash":
                blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, "an unclosed code fence"
    return blocks


def script_lines(script: str) -> list[str]:
    """The commands of a shell script: `\\` continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


class _Shell:
    """The few things a documented line may do, each done as the shell would, in `cwd` with `env`."""

    def __init__(self, cwd: Path, env: Mapping[str, str]) -> None:
        self.cwd = cwd
        self.env = dict(env)
        self.servers: list[InThreadServer] = []
        self.ran: list[str] = []

    def expand(self, text: str) -> str:
        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name not in self.env:
                pytest.fail(f"${name} is used but neither documented nor set: {text}")
            return self.env[name]

        return _VARIABLE.sub(value, text)

    def run(self, line: str) -> None:
        words = shlex.split(line)
        if words[0] == "export":
            name, _, raw = line.removeprefix("export").strip().partition("=")
            self.env[name] = self.expand(raw)
        elif words[0] == "umask":
            pass  # the key file below is written 0600 whatever the umask
        elif words[:2] == ["mkdir", "-p"]:
            for name in words[2:]:
                self._path(self.expand(name)).mkdir(parents=True, exist_ok=True)
        elif words[0] == "pip":
            assert any("modelsec" in w for w in words), line  # the CI installs modelsec; so did this test
        elif words[0] == "printf" and len(words) == 5 and words[3] == ">":
            target = self._path(self.expand(words[4]))
            target.write_text(words[1].replace("%s", self.expand(words[2]), 1).replace("\\n", "\n"))
            target.chmod(0o600)
        elif words[0] == "envsubst" and words[1] == "<" and words[3] == ">":
            (self.cwd / words[4]).write_text(self.expand((self.cwd / words[2]).read_text()))
        elif words[0] == "python":
            argv = [self.expand(w) for w in words[1:]]
            with mock.patch.object(sys, "argv", argv), _chdir(self.cwd):
                runpy.run_path(str(self.cwd / argv[0]), run_name="__main__")
        elif words[:2] == ["modelsec", "serve"] and words[-1] == "&":
            self._serve([self.expand(w) for w in words[2:-1]])
        elif words[0] == "modelsec":
            args = [self.expand(w) for w in words[1:]]
            result = run_cli(*args, env=self.env, cwd=self.cwd)
            if result.returncode != 0:
                pytest.fail(
                    f"`{line}` exited {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
                )
        else:
            pytest.fail(f"a documented line this test cannot run as written: {line}")
        self.ran.append(words[0] if words[0] != "modelsec" else " ".join(words[:2]))

    def _path(self, raw: str) -> Path:
        return Path(raw) if os.path.isabs(raw) else self.cwd / raw

    def _serve(self, args: list[str]) -> None:
        """`modelsec serve --config FILE &`: the server of that file, on a free port (the documented one may
        be taken on this machine), and MODELSEC_SERVER pointed at it, as the documented export intends."""
        assert args[0] == "--config" and len(args) == 2, args
        config = self.cwd / args[1]
        text = config.read_text()
        listen = yaml.safe_load(text)["listen"]
        assert self.env.get("MODELSEC_SERVER") == listen, "MODELSEC_SERVER should name the documented listen"
        moved = config.with_name(f".{config.name}.free-port.yaml")
        moved.write_text(text.replace(f"listen: {listen}", "listen: 127.0.0.1:0", 1))
        server = InThreadServer(moved)
        self.servers.append(server)
        self.env["MODELSEC_SERVER"] = server.target

    def close(self) -> None:
        for server in self.servers:
            server.stop()


class _chdir:
    def __init__(self, path: Path) -> None:
        self.path, self.saved = path, ""

    def __enter__(self) -> None:
        self.saved = os.getcwd()
        os.chdir(self.path)

    def __exit__(self, *exc: object) -> None:
        os.chdir(self.saved)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[_Shell]:
    sh = _Shell(tmp_path, {})
    yield sh
    sh.close()


@pytest.mark.slow
def test_readme_examples_run_as_documented(tmp_path: Path, registry: Registry) -> None:
    require_inputs()
    pytest.importorskip("grpc")
    work = tmp_path / "examples"
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__", "ci"))
    blocks = bash_blocks((EXAMPLES / "README.md").read_text())
    sh = _Shell(work, {"PWD": str(work), "REGISTRY": registry.address, **registry.env()})
    saved_path = list(sys.path)
    try:
        for block in blocks:
            for line in script_lines(block):
                sh.run(line)
    finally:
        sh.close()
        sys.path[:] = saved_path
    # What the documentation promises, as a user checks it: the released, pulled and server-signed models.
    assert (work / "released" / "model.sig").is_file()
    assert (work / "pulled" / "model.safetensors").is_file()
    assert (work / "lenet5" / "model.sig").is_file()
    for needed in (
        "python",
        "modelsec release",
        "modelsec push",
        "modelsec pull",
        "modelsec policy",
        "modelsec sign",
    ):
        assert needed in sh.ran, f"the README no longer runs {needed}"


def _github_env(
    job: Mapping[str, Any], secrets: Mapping[str, str], variables: Mapping[str, str]
) -> dict[str, str]:
    def value(m: re.Match[str]) -> str:
        source = secrets if m.group(1) == "secrets" else variables
        if m.group(2) not in source:
            pytest.fail(f"the workflow needs {m.group(1)}.{m.group(2)}, which its header does not list")
        return source[m.group(2)]

    return {k: _GITHUB_EXPRESSION.sub(value, str(v)) for k, v in job.get("env", {}).items()}


def _checkout(root: Path) -> tuple[Path, str]:
    """A repository checkout as the pipelines expect it: model/ and keys/ci-p256.pub.pem; the private PEM."""
    write_tiny_model(root / "model", seed=31)
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (root / "keys").mkdir()
    (root / "keys" / "ci-p256.pub.pem").write_bytes(public)
    return root, private.decode()


def _documented_variables(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))


def test_github_actions_pipeline_signs_attests_and_pushes(tmp_path: Path, registry: Registry) -> None:
    path = EXAMPLES / "ci" / "github-actions.yml"
    workflow = yaml.safe_load(path.read_text())
    header = _documented_variables(path)
    checkout, private_pem = _checkout(tmp_path / "checkout")
    secrets = {
        "REGISTRY_USERNAME": registry.env()["MODELSEC_OCI_USERNAME"],
        "REGISTRY_PASSWORD": registry.env()["MODELSEC_OCI_PASSWORD"],
        "MODELSEC_SIGNING_KEY": private_pem,
    }
    variables = {"MODELSEC_REGISTRY": registry.address}
    for name in [*secrets, *variables]:
        assert name in header, f"{path.name} does not say it needs {name}"
    (tmp_path / "runner").mkdir()
    runner = {  # what the GitHub runner sets for a tag push
        "GITHUB_ACTIONS": "true",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "acme/models",
        "GITHUB_WORKFLOW_REF": "acme/models/.github/workflows/release-model.yml@refs/tags/model-v1",
        "GITHUB_REF": "refs/tags/model-v1",
        "GITHUB_SHA": "0123456789abcdef0123456789abcdef01234567",
        "GITHUB_RUN_ID": "7",
        "GITHUB_RUN_ATTEMPT": "1",
        "RUNNER_ENVIRONMENT": "github-hosted",
        "RUNNER_TEMP": str(tmp_path / "runner"),
        "MODELSEC_OCI_CA": registry.ca.as_posix(),
    }
    (job,) = workflow["jobs"].values()
    sh = _Shell(checkout, {**runner, **_github_env(job, secrets, variables)})
    try:
        for step in job["steps"]:
            for line in script_lines(step.get("run", "")):
                sh.run(line)
    finally:
        sh.close()
    assert {"modelsec sign", "modelsec attest", "modelsec push", "modelsec pull"} <= set(sh.ran)
    pulled = tmp_path / "runner" / "pulled"
    assert sorted(p.name for p in pulled.iterdir() if p.suffix == ".safetensors") == sorted(
        p.name for p in (checkout / "model").iterdir() if p.suffix == ".safetensors"
    )
    provenance = checkout / "model" / "model.attestations" / "slsa.dev-provenance-v1.sig"
    assert provenance.is_file()


def test_gitlab_ci_pipeline_signs_attests_and_pushes(tmp_path: Path, registry: Registry) -> None:
    path = EXAMPLES / "ci" / "gitlab-ci.yml"
    pipeline = yaml.safe_load(path.read_text())
    header = _documented_variables(path)
    checkout, private_pem = _checkout(tmp_path / "checkout")
    key_file = tmp_path / "signing-key-variable"  # a variable of type File: GitLab writes it, names its path
    key_file.write_text(private_pem)
    key_file.chmod(0o600)
    predefined = {  # what GitLab sets for the job
        "GITLAB_CI": "true",
        "CI_REGISTRY": registry.address,
        "CI_REGISTRY_IMAGE": f"{registry.address}/acme/models",
        "CI_REGISTRY_USER": registry.env()["MODELSEC_OCI_USERNAME"],
        "CI_REGISTRY_PASSWORD": registry.env()["MODELSEC_OCI_PASSWORD"],
        "CI_COMMIT_SHA": "0123456789abcdef0123456789abcdef01234567",
        "CI_SERVER_URL": "https://gitlab.example.org",
        "CI_PROJECT_PATH": "acme/models",
        "CI_PROJECT_URL": "https://gitlab.example.org/acme/models",
        "CI_RUNNER_ID": "12",
        "CI_RUNNER_VERSION": "17.0.0",
        "CI_JOB_URL": "https://gitlab.example.org/acme/models/-/jobs/99",
    }
    for name in ("MODELSEC_SIGNING_KEY", *predefined):
        assert name in header, f"{path.name} does not say it needs {name}"
    job = pipeline["release-model"]
    sh = _Shell(
        checkout, {**predefined, "MODELSEC_SIGNING_KEY": str(key_file), "MODELSEC_OCI_CA": str(registry.ca)}
    )
    for name, raw in job.get("variables", {}).items():  # GitLab expands variables in variables
        sh.env[name] = sh.expand(str(raw))
    try:
        for line in job["script"]:
            for command in script_lines(line):
                sh.run(command)
    finally:
        sh.close()
    assert {"modelsec sign", "modelsec attest", "modelsec push", "modelsec pull"} <= set(sh.ran)
    assert (checkout / "pulled" / "model.sig").is_file()


def test_an_undocumented_step_fails_the_runner(tmp_path: Path) -> None:
    """The runner refuses what it cannot run as written, so the docs cannot grow an unchecked step."""
    sh = _Shell(tmp_path, {})
    with pytest.raises(pytest.fail.Exception, match="cannot run as written"):
        sh.run("curl -O https://example.org/model.tar")
    with pytest.raises(pytest.fail.Exception, match=r"\$UNSET is used"):
        sh.run("modelsec verify $UNSET")
