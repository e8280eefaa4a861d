#!/usr/bin/env bash
# mypy --strict over the package as installed (see scripts/link_tree.sh for why a link tree).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/link_tree.sh
cd .lint-tree && exec ../.venv/bin/mypy --config-file ../pyproject.toml -p modelsec "$@"
