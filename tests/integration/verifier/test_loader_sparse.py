"""A signed shard swapped for a huge sparse file is refused by its length, before anything is allocated.

The loader used to allocate `fstat().st_size` bytes for the shard's private buffer before reading it: a
64 GiB sparse file (`truncate`) then failed with a raw torch RuntimeError (or, on a host with the memory,
reading it in). The length is now checked against what the signed manifest allows first: the per-tensor
extension's data-section end, or, without it, the header (bounded by limits) whose tensors must tile the
file. Each load runs in a child process whose peak RSS is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.algorithms import HashAlgorithm
from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model

pytest.importorskip("torch")

SPARSE_BYTES = 64 * 2**30
# Importing torch costs a few hundred MiB of RSS; touching even 1/64 of the sparse file would cost 1 GiB.
MAX_PEAK_RSS_KIB = 900 * 1024

_CHILD = r"""
import json, resource, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from modelsec.errors import Error
from modelsec.policy import Policy
from modelsec.verifier import load_model
model, key, tensor = sys.argv[1], sys.argv[2], sys.argv[3] or None
try:
    load_model(model, Policy.from_key_files([Path(key)]), tensors=[tensor] if tensor else None)
    outcome = {"error": None}
except Error as e:
    outcome = {"error": type(e).__name__, "message": e.diagnostics()}
except Exception as e:
    import traceback
    outcome = {"error": "raw " + type(e).__name__, "message": traceback.format_exc()}
# VmHWM is this process image's own peak RSS; ru_maxrss would also count the parent's pages when the child
# was forked from a large test process before its exec.
with open("/proc/self/status") as status:
    outcome["peak_kib"] = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
print(json.dumps(outcome))
"""


def _load_in_child(model: Path, key: Path, tensor: str = "") -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), str(key), tensor],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MODELSEC_GUARD": "0"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("tensor_hash", [HashAlgorithm.BLAKE3, None], ids=["per-tensor", "plain-oms"])
def test_a_sparse_64_gib_shard_is_refused_by_its_length(
    tmp_path: Path, key_dir: Path, tensor_hash: HashAlgorithm | None
) -> None:
    model = write_tiny_model(tmp_path / "m")
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], tensor_hash=tensor_hash)
    shard = model / "model-00002-of-00002.safetensors"
    os.truncate(shard, SPARSE_BYTES)  # the signed header stays; 64 GiB of holes follow
    assert shard.stat().st_size == SPARSE_BYTES and shard.stat().st_blocks * 512 < 2**20

    outcome = _load_in_child(model, key_dir / "ecdsa-p256.pub.pem")
    print(f"sparse 64 GiB shard ({tensor_hash}): {outcome}")
    assert outcome["error"] == "MalformedArtifactError", outcome
    assert "model-00002-of-00002.safetensors" in str(outcome["message"])
    assert int(str(outcome["peak_kib"])) < MAX_PEAK_RSS_KIB


@pytest.mark.slow
def test_the_length_check_passes_an_untouched_model(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], tensor_hash=None)
    outcome = _load_in_child(model, key_dir / "ecdsa-p256.pub.pem")
    assert outcome["error"] is None, outcome
