"""The wheel installs exactly the `modelsec` namespace with every subpackage (DESIGN.md, Layout), plus the
runtime guard's start-up file `modelsec-guard.pth` at the root of site-packages (regular and editable)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration
SUBPACKAGES = [
    "attestations",
    "modelformat",
    "signer",
    "signer/schemes",
    "verifier/stores",
    "verifier",
    "watermark",
    "robustness",
    "v1",
    "service",
    "webhook",
]
PTH = REPO / "verifier" / "guard" / "modelsec-guard.pth.in"
GROUP = "vllm.general_plugins"
# What a build needs (pyproject.toml's package-dir), copied so that builds never write into the checkout.
SOURCES = [
    "pyproject.toml",
    "setup.py",
    "README.md",
    "core",
    "signer",
    "verifier",
    "attestations",
    "watermark",
]
SOURCES += ["robustness", "proto", "docs"]  # docs: the man pages and completion scripts the wheel installs


@pytest.mark.slow
def test_wheel_contains_every_subpackage_and_nothing_else(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("modelsec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"modelsec", "modelsec-guard.pth"}, top
    # Installed under the environment's prefix (PREFIX/share): every man page and a completion script per
    # shell, where man and each shell's completion loader look.
    data = {n.split("/data/", 1)[1] for n in names if n.split("/")[0].endswith(".data")}
    pages = {f"share/man/man1/{p.name}" for p in (REPO / "docs" / "man").glob("*.1")}
    completions = {
        "share/bash-completion/completions/modelsec",
        "share/zsh/site-functions/_modelsec",
        "share/fish/vendor_completions.d/modelsec.fish",
    }
    assert len(pages) > 20 and data == pages | completions, sorted(data ^ (pages | completions))
    assert zipfile.ZipFile(wheel).read("modelsec-guard.pth") == PTH.read_bytes()
    for sub in SUBPACKAGES:
        assert f"modelsec/{sub}/__init__.py" in names, sub
    assert "modelsec/errors.py" in names and "modelsec/py.typed" in names
    for stub in ("signing_pb2.py", "signing_pb2.pyi", "signing_pb2_grpc.py", "signing.proto"):
        assert f"modelsec/v1/{stub}" in names, stub
    assert not any(n.startswith("modelsec/tests") for n in names)


def test_verifier_imports_without_torch_and_grpc() -> None:
    code = (
        "import sys; import modelsec.verifier, modelsec.signer, modelsec.attestations, modelsec.cli.main;"
        "heavy = {'torch', 'grpc', 'numpy', 'rich'};"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def copy_sources(dest: Path) -> Path:
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def make_venv(path: Path) -> Path:
    """A fresh venv without pip; pip, setuptools and modelsec's dependencies come from this interpreter's
    site-packages through a `.pth` path line (plain paths: their own `.pth` files are not processed)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    ours = [p for p in sys.path if p.rstrip("/").endswith("site-packages")]
    (site_packages(python) / "_deps_of_the_test_venv.pth").write_text("\n".join(ours) + "\n")
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def pip(python: Path, *args: str) -> None:
    out = subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def start(python: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "MODELSEC_POLICY"}
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=120, env={**base, **env}, cwd="/"
    )


@pytest.mark.parametrize(
    "install",
    [
        ["--no-deps", "--no-build-isolation"],
        ["--no-deps", "--no-build-isolation", "-e"],
        ["--no-deps", "--no-build-isolation", "--config-settings", "editable_mode=strict", "-e"],
    ],
    ids=["regular", "editable", "editable-strict"],
)
@pytest.mark.slow
def test_install_puts_the_guard_pth_into_site_packages(tmp_path: Path, install: list[str]) -> None:
    src = copy_sources(tmp_path / "src")
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", *install, str(src))
    site = site_packages(python)
    assert (site / "modelsec-guard.pth").read_bytes() == PTH.read_bytes()
    where = "import modelsec, sys; print(modelsec.__file__, 'modelsec.verifier.guard.boot' in sys.modules)"
    out = start(python, where)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "False", "the guard must stay inert without MODELSEC_POLICY"
    # Editable (lenient: a finder; strict: a link tree) resolves to the sources, regular to site-packages.
    assert (
        Path(out.stdout.split()[0])
        .resolve()
        .is_relative_to((src / "core" if "-e" in install else site).resolve())
    )
    # The installed .pth runs the guard's boot: with a policy that cannot be read, no user code runs.
    marker = tmp_path / "user-code-ran"
    out = start(python, f"open({str(marker)!r}, 'w')", MODELSEC_POLICY=str(tmp_path / "missing.yaml"))
    assert out.returncode != 0
    assert out.stderr.startswith("modelsec: error: runtime guard not installed: "), out.stderr
    assert "missing.yaml" in out.stderr and not marker.exists()
    eps = start(
        python, f"import importlib.metadata as m; print([e.value for e in m.entry_points(group={GROUP!r})])"
    )
    assert eps.stdout.strip() == "['modelsec.verifier.guard.boot:vllm_plugin']", eps.stdout + eps.stderr
    pip(python, "uninstall", "-y", "-q", "modelsec")
    assert not (site / "modelsec-guard.pth").exists(), "uninstall removes the .pth (it is in RECORD)"


def test_sdist_carries_what_the_pth_build_needs(tmp_path: Path) -> None:
    src = copy_sources(tmp_path / "src")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "dist")],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    names = tarfile.open(tmp_path / "dist" / out.stdout.strip().splitlines()[-1]).getnames()
    root = names[0].split("/")[0]
    assert f"{root}/setup.py" in names and f"{root}/verifier/guard/modelsec-guard.pth.in" in names


def _site_with(tmp_path: Path, pth: bytes, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Start `python -S` (no site-packages: modelsec is not importable) and process one .pth directory."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(parents=True)
    (site_dir / "x.pth").write_bytes(pth)
    base = {k: v for k, v in os.environ.items() if k not in ("MODELSEC_POLICY", "PYTHONPATH")}
    program = f"import site; site.addsitedir({str(site_dir)!r}); {code}"
    return subprocess.run(
        [sys.executable, "-S", "-c", program], capture_output=True, text=True, timeout=60, env={**base, **env}
    )


def test_a_raising_pth_line_only_warns_which_is_why_the_guard_line_exits(tmp_path: Path) -> None:
    marker = tmp_path / "user-code-ran"
    out = _site_with(tmp_path, b"import modelsec.verifier.guard.boot\n", f"open({str(marker)!r}, 'w')")
    assert out.returncode == 0 and marker.exists(), "site reports the error and the process goes on"
    assert "Error processing line" in out.stderr


def test_guard_line_exits_when_modelsec_cannot_be_imported(tmp_path: Path) -> None:
    marker = tmp_path / "user-code-ran"
    out = _site_with(tmp_path, PTH.read_bytes(), f"open({str(marker)!r}, 'w')", MODELSEC_POLICY="/etc/p.yaml")
    assert out.returncode == 1 and not marker.exists()
    assert out.stderr.splitlines() == [
        "modelsec: error: runtime guard not installed: cannot import modelsec.verifier.guard.boot: "
        "ModuleNotFoundError: No module named 'modelsec'"
    ]


@pytest.mark.parametrize("value", [None, ""])
def test_guard_line_is_inert_without_a_policy(tmp_path: Path, value: str | None) -> None:
    env = {} if value is None else {"MODELSEC_POLICY": value}
    out = _site_with(tmp_path, PTH.read_bytes(), "import sys; print(sorted(sys.modules))", **env)
    plain = _site_with(tmp_path / "plain", b"\n", "import sys; print(sorted(sys.modules))")
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout == plain.stdout, "the line imports nothing"


def test_completion_scripts_are_current() -> None:
    spec = importlib.util.spec_from_file_location("gen_completion", REPO / "scripts" / "gen_completion.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scripts: dict[str, str] = module.generate()
    for name, text in scripts.items():
        committed = (REPO / "docs" / "completion" / name).read_text()
        assert committed.rstrip("\n") == text.rstrip("\n"), (
            f"run `make man` and commit docs/completion/{name}"
        )
    assert "_MODELSEC_COMPLETE=bash_complete" in scripts["bash/modelsec"]


def _makefile_editable_options() -> list[str]:
    """The options of the Makefile's editable install (`EDITABLE`), as the developer's venv gets them."""
    text = (REPO / "Makefile").read_text()
    match = re.search(r"^EDITABLE\s*:?=\s*(.+)$", text, re.MULTILINE)
    assert match is not None and "$(EDITABLE)" in text, "the Makefile installs modelsec through $(EDITABLE)"
    return match.group(1).split()


@pytest.mark.slow
def test_an_editable_install_type_checks_from_outside_the_repository(tmp_path: Path) -> None:
    """mypy, run elsewhere against an environment with the Makefile's editable install, sees the types."""
    src = copy_sources(tmp_path / "src")
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", "--no-deps", "--no-build-isolation", *_makefile_editable_options(), str(src))
    elsewhere = tmp_path / "app"
    elsewhere.mkdir()
    (elsewhere / "app.py").write_text(
        "import modelsec\nfrom modelsec.errors import DigestMismatchError\n"
        "from modelsec.verifier import verify_model\n"
        "reveal_type(modelsec.__version__)\nreveal_type(verify_model)\nreveal_type(DigestMismatchError)\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(python), "--no-incremental",
         "--cache-dir", str(tmp_path / "cache"), "--config-file", "/dev/null", "app.py"],
        cwd=elsewhere, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'Revealed type is "str"' in out.stdout or 'Revealed type is "builtins.str"' in out.stdout
    assert "def (model_path:" in out.stdout and "DigestMismatchError" in out.stdout
    assert "import-not-found" not in out.stdout and "import-untyped" not in out.stdout
