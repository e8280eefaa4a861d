#!/bin/sh
# Regenerate requirements/image.txt: every dependency of the container image (the extras below, and the
# build backend, which `install.sh` uses without build isolation) pinned with its hashes, so the image
# build installs exactly these files (`pip install --require-hashes`). Run after changing pyproject.toml's
# dependencies, with the Python of the image (3.12: markers and wheels are resolved for it); needs
# pip-tools (PyPI `pip-tools`, MODELSEC_PIP_COMPILE names its pip-compile) and the package index.
#
#   scripts/lock_image.sh [EXTRAS]     # default: grpc,webhook,oci,sigstore,timestamp,postgres
set -eu
cd "$(dirname "$0")/.."
EXTRAS=${1:-grpc,webhook,oci,sigstore,timestamp,postgres}
COMPILE=${MODELSEC_PIP_COMPILE:-pip-compile}  # not PIP_*: pip reads those as its options
"$COMPILE" --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
  --extra "$EXTRAS" --output-file requirements/image.txt --upgrade \
  pyproject.toml requirements/build.in
