#!/usr/bin/env bash
# mypy --strict over the package as installed: setuptools' package-dir mapping (core/ -> modelsec, signer/ ->
# modelsec.signer, ...) is something mypy cannot follow, so build a link tree with the installed layout.
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=.lint-tree
rm -rf "$TREE" && mkdir -p "$TREE/modelsec"
for f in core/*.py core/py.typed; do ln -s "../../$f" "$TREE/modelsec/$(basename "$f")"; done
for d in core/*/; do d=${d%/}; [ "$(basename "$d")" = __pycache__ ] || ln -s "../../$d" "$TREE/modelsec/$(basename "$d")"; done
for pkg in attestations signer verifier watermark robustness; do ln -s "../../$pkg" "$TREE/modelsec/$pkg"; done
mkdir -p "$TREE/modelsec/v1" && for f in proto/modelsec/v1/*.py proto/modelsec/v1/*.pyi; do ln -s "../../../$f" "$TREE/modelsec/v1/$(basename "$f")"; done
cd "$TREE" && exec ../.venv/bin/mypy --config-file ../pyproject.toml -p modelsec "$@"
