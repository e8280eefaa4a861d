#!/usr/bin/env bash
# import-linter over the package as installed (see scripts/link_tree.sh for why a link tree).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/link_tree.sh
cd .lint-tree && PYTHONPATH=. exec ../.venv/bin/lint-imports --config ../pyproject.toml --no-cache "$@"
