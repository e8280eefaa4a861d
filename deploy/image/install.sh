#!/bin/sh
# Install modelsec into a fresh virtual environment: the one install step of the container image
# (Dockerfile, build stage) and of tests/integration/deploy/test_image.py, which runs it where no Docker daemon is.
#
#   deploy/image/install.sh SRC PREFIX
#
# SRC: the source tree (the Docker build context); PREFIX: the virtual environment to create (the image copies
# it whole into the runtime stage). $MODELSEC_EXTRAS: the optional features (pyproject.toml extras); the
# default serves `modelsec serve`, `modelsec webhook serve` and the oci:// store without torch.
set -eu
SRC=${1:?usage: install.sh SRC PREFIX}
PREFIX=${2:?usage: install.sh SRC PREFIX}
EXTRAS=${MODELSEC_EXTRAS:-grpc,webhook,oci,sigstore,timestamp,postgres}
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv "$PREFIX"
# A regular (not editable) install: the runtime stage has no source tree. The wheel also places the runtime
# guard's modelsec-guard.pth in site-packages (setup.py).
"$PREFIX/bin/python" -m pip install --no-cache-dir --disable-pip-version-check --quiet "$SRC[$EXTRAS]"
# Bytecode now: at run time the root filesystem is read-only (PYTHONDONTWRITEBYTECODE is set as well).
"$PREFIX/bin/python" -m compileall -q "$PREFIX/lib" >/dev/null
# The image is unusable if the console script cannot start.
"$PREFIX/bin/modelsec" --help >/dev/null
