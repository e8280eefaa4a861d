#!/usr/bin/env bash
# Regenerate the modelsec.v1 stubs from proto/modelsec/v1/*.proto (what `make proto` runs).
# Usage: scripts/gen_proto.sh [OUT_DIR]   (default: proto/, next to the .proto files).
# Needs the pinned generators of the `test` extra: grpcio-tools (protoc + the gRPC plugin) and mypy-protobuf
# (typed .pyi for messages and services); tests/unit/service/test_proto.py fails when the committed stubs
# differ from what this produces.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-proto}
BIN=$(dirname "$(command -v python)")
[ -x .venv/bin/python ] && BIN=.venv/bin
mkdir -p "$OUT"
PATH="$BIN:$PATH" "$BIN/python" -m grpc_tools.protoc -Iproto \
  --python_out="$OUT" --grpc_python_out="$OUT" --mypy_out=quiet:"$OUT" --mypy_grpc_out=quiet:"$OUT" \
  proto/modelsec/v1/*.proto
