"""Refuse a private module or name imported from outside the package that holds it (issue 26).

A module or name whose last dotted part starts with one underscore (`modelsec.verifier._shard_buffers`,
`modelsec.signer.keys._read_key_file`) is private to the package that holds it: only modules of that package
and of its subpackages may import it. A dependency across packages goes through a public module or function.
import-linter has no contract for this, so `scripts/lint_imports.sh` runs this check over the same link tree
(`.lint-tree/modelsec`, the package as installed). Generated stubs (`modelsec.v1`) are not checked.

Usage: python scripts/check_private_imports.py [TREE]   (default: .lint-tree); exit 1 on any finding.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _module_name(tree: Path, path: Path) -> tuple[str, str]:
    """The dotted module name of `path` below `tree` and the package that holds it."""
    parts = list(path.relative_to(tree).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []
    return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]


def _owner(target: str, modules: set[str]) -> str | None:
    """The package a private `target` belongs to, or None when every part of it is public.

    `modules` holds the names of the plain modules (not packages): a private name inside one
    (`pkg.mod._name`) is private to the module's package.
    """
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            holder = parts[:i]
            if i == len(parts) - 1 and ".".join(holder) in modules:
                holder = holder[:-1]
            return ".".join(holder)
    return None


def main(argv: list[str]) -> int:
    """Print every import of a private module or name across packages; 1 if there is one."""
    tree = Path(argv[1] if len(argv) > 1 else ".lint-tree")
    files = [p for p in sorted((tree / "modelsec").rglob("*.py")) if p.relative_to(tree).parts[1] != "v1"]
    modules = {_module_name(tree, p)[0] for p in files if p.name != "__init__.py"}
    findings = []
    for path in files:
        name, package = _module_name(tree, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(node):
                owner = _owner(target, modules) if target.startswith("modelsec.") else None
                if owner is not None and package != owner and not package.startswith(owner + "."):
                    findings.append(f"{name}:{node.lineno}: imports {target}, private to {owner}")
                    break
    for line in findings:
        print(line)
    if findings:
        print(f"{len(findings)} private imports across packages; make the module public or add a public verb")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
