#!/usr/bin/env bash
# The main job on real input: sign the real all-MiniLM-L6-v2 weights (3 shards + index) with ECDSA P-256
# and SM2, verify them, and show that one flipped byte is refused. Expects the venv made by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=demo
rm -rf "$OUT" && mkdir -p "$OUT/keys"

echo "== 1. real weights -> standard sharded Hugging Face checkpoint"
$BIN/python examples/make_sharded_minilm.py "$OUT/all-MiniLM-L6-v2"
MODEL="$OUT/all-MiniLM-L6-v2"

echo "== 2. keys (ECDSA P-256 for OMS/model_signing interop, SM2 with SM3)"
$BIN/modelsec keygen -a ecdsa-p256 -o "$OUT/keys/ci-p256"
$BIN/modelsec keygen -a sm2 -o "$OUT/keys/ci-sm2"

echo "== 3. sign (one read pass: SHA-256 + SM3 + per-tensor BLAKE3)"
$BIN/modelsec sign "$MODEL" -k "$OUT/keys/ci-p256.key.pem" -k "$OUT/keys/ci-sm2.key.pem"

echo "== 4. verify (both algorithms required)"
$BIN/modelsec verify "$MODEL" -k "$OUT/keys/ci-p256.pub.pem" -k "$OUT/keys/ci-sm2.pub.pem" --require ecdsa-p256,sm2

echo "== 5. verify one shard only (a node holding shard 2 of 3)"
$BIN/modelsec verify "$MODEL/model-00002-of-00003.safetensors" -k "$OUT/keys/ci-sm2.pub.pem" --require sm2

echo "== 6. flip one byte of shard 3 and verify again (must be refused, exit 1)"
cp -r "$MODEL" "$OUT/tampered"
$BIN/python - "$OUT/tampered/model-00003-of-00003.safetensors" <<'PY'
import sys
p = sys.argv[1]
data = bytearray(open(p, "rb").read())
data[len(data) // 2] ^= 0x01
open(p, "wb").write(bytes(data))
PY
set +e
$BIN/modelsec verify "$OUT/tampered" -k "$OUT/keys/ci-p256.pub.pem" -k "$OUT/keys/ci-sm2.pub.pem"
rc=$?
set -e
if [ "$rc" -ne 1 ]; then echo "demo: tampered model was not refused (exit $rc)" >&2; exit 1; fi
echo "== refused as expected (exit 1). Demo complete: $MODEL"
