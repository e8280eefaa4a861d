#!/usr/bin/env bash
# import-linter over the package as installed (see scripts/link_tree.sh for why a link tree), after the
# check that no private module or name is imported across packages (scripts/check_private_imports.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/link_tree.sh
# import-linter has no contract for private modules: none may be imported from outside its package.
.venv/bin/python scripts/check_private_imports.py .lint-tree
cd .lint-tree && PYTHONPATH=. exec ../.venv/bin/lint-imports --config ../pyproject.toml --no-cache "$@"
