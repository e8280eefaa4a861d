"""Another transformers release over the test environment, for guard tests that must hold on both.

`path_for(version)` installs `transformers==<version>` and the requirements the test environment does not
meet (`_EXTRA`; `pip install --target --no-deps`: the environment's huggingface-hub, tokenizers,
safetensors and torch serve the rest) into `<repo>/.venv/transformers-overlays/<version>`, once per
machine, and returns that directory. A child
interpreter of the test environment with it first on `PYTHONPATH` imports that transformers and still runs
the environment's `.pth` files (modelsec and its start-up hook). A `.ok` marker is written only after
`import transformers` reported the version, so an interrupted install is redone, not trusted; a lock file
serialises concurrent test processes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / ".venv" / "transformers-overlays"
# 5.25 requires `kernels` (which requires tomlkit) and refuses to load a model without it.
_EXTRA = {"5.25.0": ["kernels>=0.19.1,<0.20", "tomlkit>=0.13.3"]}
_IMPORTS = {"5.25.0": "kernels, "}


class OverlayUnavailable(Exception):
    """The package index could not be reached."""


def path_for(version: str, *, timeout: float = 600) -> Path:
    """The directory holding transformers `version`, to put first on `PYTHONPATH`.

    Raises:
        OverlayUnavailable: pip could not reach the package index.
        RuntimeError: The install failed for another reason, or the wrong version imports.
    """
    target = OVERLAYS / version
    marker = target / ".ok"
    if marker.exists():
        return target
    OVERLAYS.mkdir(parents=True, exist_ok=True)
    with open(OVERLAYS / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps"]
        cmd += ["--target", str(target), f"transformers=={version}", *_EXTRA.get(version, [])]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ})
        if r.returncode != 0:
            out = r.stdout + r.stderr
            shutil.rmtree(target, ignore_errors=True)
            if any(
                s in out for s in ("No matching distribution", "Could not find a version", "NewConnection")
            ):
                raise OverlayUnavailable(f"transformers=={version} cannot be installed: {out[-400:]}")
            raise RuntimeError(f"pip install transformers=={version} failed:\n{out[-4000:]}")
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import {_IMPORTS.get(version, '')}transformers; print(transformers.__version__)",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(target)},
        )
        if r.returncode != 0 or r.stdout.strip() != version:
            raise RuntimeError(f"transformers=={version} does not import from {target}:\n{r.stderr[-4000:]}")
        marker.write_text(version)
    return target


if __name__ == "__main__":
    for v in sys.argv[1:]:
        print(v, path_for(v))
