#!/bin/sh
# Install modelsec into a fresh virtual environment: the one install step of the container image
# (Dockerfile, build stage) and of tests/integration/deploy/test_image.py, which runs it where no Docker daemon is.
#
#   deploy/image/install.sh SRC PREFIX
#
# SRC: the source tree (the Docker build context); PREFIX: the virtual environment to create (the image copies
# it whole into the runtime stage). Dependencies come only from the hash-pinned lock $MODELSEC_LOCK (default
# SRC/requirements/image.txt: the extras grpc, webhook, oci, sigstore, timestamp and postgres, and the build
# backend; scripts/lock_image.sh regenerates it for other extras): pip refuses any file whose hash differs.
set -eu
SRC=${1:?usage: install.sh SRC PREFIX}
PREFIX=${2:?usage: install.sh SRC PREFIX}
LOCK=${MODELSEC_LOCK:-$SRC/requirements/image.txt}
PYTHON=${PYTHON:-python3}
PIP="$PREFIX/bin/python -m pip --no-cache-dir --disable-pip-version-check --quiet"

"$PYTHON" -m venv "$PREFIX"
$PIP install --require-hashes --no-deps -r "$LOCK"
# A regular (not editable) install, built from the locked setuptools (no build isolation, so nothing unpinned
# is fetched): the runtime stage has no source tree. The wheel also places the runtime guard's
# modelsec-guard.pth in site-packages (setup.py).
$PIP install --no-deps --no-build-isolation "$SRC"
# Every dependency the package declares is in the lock: a missing one fails the build here, not at run time.
$PIP check
# Bytecode now: at run time the root filesystem is read-only (PYTHONDONTWRITEBYTECODE is set as well).
"$PREFIX/bin/python" -m compileall -q "$PREFIX/lib" >/dev/null
# The image is unusable if the console script cannot start.
"$PREFIX/bin/modelsec" --help >/dev/null
