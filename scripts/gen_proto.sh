#!/usr/bin/env bash
# Regenerate the modelsec.v1 stubs from proto/modelsec/v1/*.proto (what `make proto` runs).
# Usage: [PYTHON=...] scripts/gen_proto.sh [OUT_DIR]   (default: proto/, next to the .proto files).
# Needs the pinned generators of the `test` extra: grpcio-tools (protoc + the gRPC plugin) and mypy-protobuf
# (typed .pyi for messages and services); tests/integration/service/test_proto.py fails when the committed stubs
# differ from what this produces.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-proto}
# The interpreter whose environment has the generators: $PYTHON, else the project venv, else python3.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3); fi
fi
BIN=$(dirname "$PY")  # protoc-gen-mypy / protoc-gen-mypy_grpc live next to it
mkdir -p "$OUT"
PATH="$BIN:$PATH" "$PY" -m grpc_tools.protoc -Iproto \
  --python_out="$OUT" --grpc_python_out="$OUT" --mypy_out=quiet:"$OUT" --mypy_grpc_out=quiet:"$OUT" \
  proto/modelsec/v1/*.proto
