"""Cached virtual environments holding each released `model-signing`, for the interop matrix.

Each version lives in `<repo>/.venv/ms-venvs/<version>` (ignored by git, created once per machine). A
`.ok` marker is written only after the install finished and `import model_signing` worked, so an
interrupted creation is redone rather than trusted; a lock file serialises concurrent test processes.

A version's venv is an overlay on the test environment's site-packages (a `.pth` line after its own
site-packages, and that environment's pip): pip installs only `model-signing` and the dependencies whose
versions differ (sigstore 3 for 1.0.x), which shadow the test environment's copies. On a fresh clone that
takes seconds a version instead of a minute. Only the directory is appended, so the test environment's
own `.pth` files (modelsec's editable install, the runtime guard) are not run: modelsec is not importable.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".venv" / "ms-venvs"
VERSIONS = ("1.0.0", "1.0.1", "1.1.0", "1.1.1")
# 1.0.x declare `sigstore` without an upper bound but use the sigstore 3 API (sigstore 4 moved the
# models), and sigstore 3 imports pyOpenSSL, which must match the installed `cryptography`.
_EXTRA = {
    "1.0.0": ["sigstore>=3.6,<4", "pyopenssl>=24.2,<26"],
    "1.0.1": ["sigstore>=3.6,<4", "pyopenssl>=24.2,<26"],
    # 1.1.x import OpenSSL (certificate mode) without declaring pyOpenSSL.
    "1.1.0": ["pyopenssl>=24.2"],
    "1.1.1": ["pyopenssl>=24.2"],
}


class VenvUnavailable(Exception):
    """The environment could not be built because the package index is unreachable."""


def python_for(version: str, *, timeout: float = 900) -> Path:
    """The interpreter of the venv holding model-signing `version`, creating it on first use.

    Raises:
        VenvUnavailable: pip could not reach the package index.
        RuntimeError: The install failed for another reason (the output is included).
    """
    venv = VENVS / version
    python = venv / "bin" / "python"
    marker = venv / ".ok"
    if marker.exists():
        return python
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        Path(purelib, "_test_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        cmd = [
            str(python),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            f"model-signing=={version}",
            *_EXTRA.get(version, []),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ})
        if r.returncode != 0:
            out = r.stdout + r.stderr
            shutil.rmtree(venv, ignore_errors=True)
            unreachable = (
                "No matching distribution" in out
                or "Could not find a version" in out
                or "NewConnectionError" in out
                or "Failed to establish" in out
                or "Temporary failure in name resolution" in out
            )
            if unreachable:
                raise VenvUnavailable(f"PyPI unreachable for model-signing=={version}: {out[-400:]}")
            raise RuntimeError(f"pip install model-signing=={version} failed:\n{out[-4000:]}")
        r = subprocess.run(
            [str(python), "-c", "import model_signing, model_signing.signing, model_signing.verifying"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"model-signing=={version} does not import:\n{r.stderr[-4000:]}")
        marker.write_text(version)
    return python


if __name__ == "__main__":
    for v in sys.argv[1:] or VERSIONS:
        print(v, python_for(v))
