"""Shard-by-shard embedding: dtypes and shapes kept, untouched bytes identical, bounded memory, bad inputs."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from modelsec.errors import MalformedArtifactError, PolicyError, PolicyViolationError  # noqa: E402
from modelsec.watermark import WatermarkKey, WatermarkParams, detect, embed_model  # noqa: E402
from modelsec.watermark.io import decode, encode  # noqa: E402
from modelsec.watermark.spread_spectrum import carrier_plan  # noqa: E402

KEY = WatermarkKey.from_bytes(bytes(range(1, 33)))
MSG = b"modelsec"

torch.set_num_threads(1)


def _model(root: Path, dtype: Any, *, seed: int = 0, rows: int = 512) -> Path:
    gen = torch.Generator().manual_seed(seed)
    root.mkdir(parents=True)
    tensors = {
        "a.weight": (torch.randn(rows, 256, generator=gen) * 0.05).to(dtype),
        "b.weight": (torch.randn(rows, 300, generator=gen) * 0.02).to(dtype),
        "b.bias": torch.zeros(rows, dtype=dtype),
        "ids": torch.arange(7, dtype=torch.int64),
    }
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt", "note": "x"})
    (root / "config.json").write_text('{"model_type": "toy"}')
    return root


def _raw(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + header_len])
    data = path.read_bytes()[8 + header_len :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[b:e])
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_embed_keeps_dtype_shape_and_untouched_bytes(tmp_path: Path, dtype: Any) -> None:
    src = _model(tmp_path / "src", dtype)
    result = embed_model(src, tmp_path / "out", KEY, MSG)
    before, after = _raw(src / "model.safetensors"), _raw(tmp_path / "out" / "model.safetensors")
    assert before.keys() == after.keys()
    for name in before:
        assert before[name][:2] == after[name][:2]  # dtype and shape
    assert before["ids"] == after["ids"] and before["b.bias"] == after["b.bias"]
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "note": "x"}
    assert (tmp_path / "out" / "config.json").read_bytes() == (src / "config.json").read_bytes()

    # Only carrier blocks change; every change is bounded by max_relative_change and keeps the sign.
    params = WatermarkParams()
    raw_dtype = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}[before["a.weight"][0]]
    for name in ("a.weight", "b.weight"):
        old = np.frombuffer(before[name][2], dtype=raw_dtype)
        new = np.frombuffer(after[name][2], dtype=raw_dtype)
        plan = carrier_plan(KEY, name, tuple(before[name][1]), result.density_log2, params)
        mask = np.zeros(old.size, dtype=bool)
        g = params.block_size
        mask[: (old.size // g) * g].reshape(-1, g)[plan.blocks] = True
        assert np.array_equal(old[~mask], new[~mask])
        o = decode(old, before[name][0]).astype(np.float64)
        n = decode(new, before[name][0]).astype(np.float64)
        assert np.all(np.abs(n - o) <= params.max_relative_change * np.abs(o) + 1e-30)
        assert np.all(np.sign(n) == np.sign(o))
    # The mark survives the cast back to the stored dtype: every bit still beyond most of the margin.
    assert result.detection.detected and result.detection.bit_error_rate == 0
    assert result.detection.min_margin > 0.9 * params.kappa
    found = detect(tmp_path / "out", KEY)
    assert found.detected and found.decoded_message == MSG


def test_bf16_encoding_matches_torch_round_to_nearest_even() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(100_000).astype(np.float32) * 10.0 ** rng.integers(-20, 20, 100_000),
            np.array([0.0, -0.0, 1e-40, 3.38e38, -3.39e38], dtype=np.float32),
        ]
    ).astype(np.float32)
    ours = encode(x, "BF16")
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = np.isfinite(torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    assert np.array_equal(ours[finite], ref[finite])
    assert np.isfinite(decode(ours, "BF16")).all()  # overflow is clamped to the largest finite value
    assert np.array_equal(
        decode(encode(x, "F16"), "F16"), np.clip(x, -65504, 65504).astype(np.float16).astype(np.float32)
    )


def test_non_finite_weights_are_kept_bit_for_bit(tmp_path: Path) -> None:
    src = _model(tmp_path / "src", torch.float32)
    from safetensors.torch import load_file

    tensors = load_file(str(src / "model.safetensors"))
    tensors["a.weight"].view(-1)[::97] = float("nan")
    tensors["a.weight"].view(-1)[5::101] = float("inf")
    save_file(tensors, str(src / "model.safetensors"))
    embed_model(src, tmp_path / "out", KEY, MSG)
    a = load_file(str(src / "model.safetensors"))["a.weight"].view(torch.int32)
    b = load_file(str(tmp_path / "out" / "model.safetensors"))["a.weight"]
    bad = ~torch.isfinite(tensors["a.weight"])
    assert torch.equal(a[bad], b.view(torch.int32)[bad])
    assert detect(tmp_path / "out", KEY, message=MSG).bit_error_rate == 0


def _sharded(root: Path, shards: int = 4, rows: int = 1024) -> Path:
    rng = np.random.default_rng(1)
    from safetensors.numpy import save_file as save_np

    root.mkdir()
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{i}.weight": (rng.standard_normal((rows, 1024)) * 0.02).astype(np.float32)}
        save_np(tensors, str(root / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "model.sig").write_text("stale signature")
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    return root


def test_sharded_model_one_shard_in_memory_at_a_time(tmp_path: Path) -> None:
    src = _sharded(tmp_path / "src", shards=8)
    shard_bytes = 1024 * 1024 * 4
    tracemalloc.start()
    try:
        result = embed_model(src, tmp_path / "out", KEY, MSG)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One 4 MiB shard plus one tensor's carrier working set; the model (32 MiB) is never held at once.
    assert peak < 3.5 * shard_bytes, peak
    assert result.shards == 8 and result.bytes_processed == sum(
        f.stat().st_size for f in src.glob("*.safetensors")
    )
    out = tmp_path / "out"
    assert oct(out.stat().st_mode & 0o777) == "0o755"
    assert sorted(p.name for p in out.rglob("*")) == sorted(
        p.name for p in src.rglob("*") if p.name != "model.sig"
    )  # signature bundles are not copied: they no longer match
    assert (out / "model.safetensors.index.json").read_bytes() == (
        src / "model.safetensors.index.json"
    ).read_bytes()
    assert detect(out, KEY, message=MSG).detected


@pytest.mark.parametrize("kind", ["missing", "empty", "pickle", "garbage", "not-a-dir"])
def test_bad_model_dirs_raise_malformed_artifact(tmp_path: Path, kind: str) -> None:
    model = tmp_path / "m"
    if kind == "empty":
        model.mkdir()
    elif kind == "pickle":
        model.mkdir()
        (model / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    elif kind == "garbage":
        model.mkdir()
        (model / "model.safetensors").write_bytes(b"\xff" * 64)
    elif kind == "not-a-dir":
        model.write_text("x")
    with pytest.raises(MalformedArtifactError) as info:
        detect(model, KEY)
    assert "\n" not in info.value.diagnostics()
    if kind == "pickle":
        assert "pickle checkpoints are not supported" in info.value.diagnostics()
    with pytest.raises(MalformedArtifactError):
        embed_model(model, tmp_path / "out", KEY, MSG)


def test_symlinked_shard_is_refused(tmp_path: Path) -> None:
    src = _model(tmp_path / "src", torch.float32)
    link = tmp_path / "linked"
    link.mkdir()
    os.symlink(src / "model.safetensors", link / "model.safetensors")
    with pytest.raises(PolicyViolationError, match="symlink"):
        detect(link, KEY)


def test_output_directory_and_capacity_errors(tmp_path: Path) -> None:
    src = _model(tmp_path / "src", torch.float32)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(PolicyError, match="not empty"):
        embed_model(src, busy, KEY, MSG)
    with pytest.raises(PolicyError, match="inside"):
        embed_model(src, src / "out", KEY, MSG)
    with pytest.raises(PolicyError, match="message too long"):
        embed_model(src, tmp_path / "o1", KEY, bytes(65))
    with pytest.raises(PolicyError, match="message too long for capacity"):
        embed_model(src, tmp_path / "o2", KEY, bytes(64))
    with pytest.raises(PolicyError, match="empty"):
        embed_model(src, tmp_path / "o3", KEY, b"")
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    save_file({"w": torch.zeros(4, 4)}, str(tiny / "model.safetensors"))
    with pytest.raises(PolicyError, match="no tensor can carry"):
        embed_model(tiny, tmp_path / "o4", KEY, MSG)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    with pytest.raises(PolicyError, match="parent directory does not exist"):
        embed_model(src, tmp_path / "no" / "such" / "dir", KEY, MSG)
    assert not list(tmp_path.glob(".*tmp-*"))  # no staging directory left behind
    empty = tmp_path / "empty-out"
    empty.mkdir()
    assert embed_model(src, empty, KEY, MSG).detection.detected  # an empty directory is accepted


def test_embed_reports_each_shard_as_a_progress_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The library reports its steps on `modelsec.progress` (the CLI draws them on a terminal only)."""
    import logging

    src = _sharded(tmp_path / "src", shards=3)
    with caplog.at_level(logging.INFO, logger="modelsec.progress"):
        embed_model(src, tmp_path / "out", KEY, MSG)
    steps = [r.getMessage() for r in caplog.records if r.name == "modelsec.progress"]
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert [s.split()[2] for s in steps if s.startswith("watermark: writing ")] == shards, steps
