"""Write the shell completion scripts of the `modelsec` CLI (docs/completion/), installed with the package.

Usage: python scripts/gen_completion.py [OUT_DIR]   (default: docs/completion; `make man`)

click's completion source for each shell, as `_MODELSEC_COMPLETE=<shell>_source modelsec` prints it, under the
name and folder each shell's completion loader looks for: `bash/modelsec` (bash-completion, installed to
share/bash-completion/completions), `zsh/_modelsec` (share/zsh/site-functions) and `fish/modelsec.fish`
(share/fish/vendor_completions.d); pyproject.toml's `[tool.setuptools.data-files]` installs them.
The scripts call back into `modelsec` for the candidates, so they do not change with the commands;
tests/integration/test_packaging_data.py checks the committed ones are current.
"""

from __future__ import annotations

import sys
from pathlib import Path

from click.shell_completion import get_completion_class

from modelsec.cli.main import main

FILES = {"bash": "bash/modelsec", "zsh": "zsh/_modelsec", "fish": "fish/modelsec.fish"}


def generate() -> dict[str, str]:
    """`{relative path: script}` for each shell."""
    out = {}
    for shell, name in FILES.items():
        completion = get_completion_class(shell)
        assert completion is not None, shell
        out[name] = completion(main, {}, "modelsec", "_MODELSEC_COMPLETE").source()
    return out


def write(out_dir: Path) -> list[Path]:
    """Write the scripts into `out_dir`; the paths written."""
    written = []
    for name, text in generate().items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text if text.endswith("\n") else text + "\n")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/completion")):
        print(path)
