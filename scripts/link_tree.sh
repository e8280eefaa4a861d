#!/usr/bin/env bash
# Build .lint-tree/modelsec: the package as installed (setuptools' package-dir mapping: core/ -> modelsec,
# signer/ -> modelsec.signer, ...), real directories holding links to the source files, as a strict editable
# install lays it out. mypy and import-linter cannot follow the mapping, and import-linter does not descend
# into linked directories, so both analyse this tree.
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=.lint-tree
rm -rf "$TREE"
link_package() {  # link_package SRC_DIR DEST_DIR: every .py/.pyi/py.typed below SRC, as links under DEST
  local src=$1 dest=$2
  find "$src" -name __pycache__ -prune -o \( -name '*.py' -o -name '*.pyi' -o -name py.typed \) -print |
    while read -r f; do
      rel=${f#"$src"/}
      mkdir -p "$dest/$(dirname "$rel")"
      ln -s "$PWD/$f" "$dest/$rel"
    done
}
link_package core "$TREE/modelsec"
for pkg in attestations signer verifier watermark robustness; do link_package "$pkg" "$TREE/modelsec/$pkg"; done
link_package proto/modelsec/v1 "$TREE/modelsec/v1"
