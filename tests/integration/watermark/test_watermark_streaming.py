"""Streaming embed: the written bytes equal the whole-shard writer's, and peak memory stays near one tensor.

The golden digests below were produced by the whole-shard writer (main before the streaming change) on the
model `_write_model` builds; the streaming writer must reproduce them byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from modelsec.errors import MalformedArtifactError
from modelsec.watermark import WatermarkKey, WatermarkParams, embed_model

KEY = WatermarkKey.from_bytes(bytes(range(1, 33)))
MSG = b"stream v1"

GOLDEN = {
    "a.safetensors": "31e46138d0670fa4fa225c529d6cb817972751a7e42d58b0279d8e32e2b8fc75",
    "b.safetensors": "e0139b4164c1e3bcae05189286236dd4d0682151d3abf91563144e804c3c5c32",
    "config.json": "c4fc70e279cda43fd3553e562882ea766a1b88933bbaeac730455af382ed8719",
    "sub/tok.json": "e96760a87768717bcebcfd25ddc7d46b4dbc95a4b0014def080c08539f7d90d0",
}


def _write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...], bytes]]) -> None:
    """A safetensors file with the data in the given order (not name order, unlike safetensors' writer)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(t[3] for t in tensors))


def _write_model(root: Path) -> Path:
    rng = np.random.default_rng(20)
    root.mkdir()
    f32 = (rng.standard_normal((256, 512)) * 0.05).astype("<f4")
    f16 = (rng.standard_normal((256, 256)) * 0.05).astype("<f2")
    bf16 = ((rng.standard_normal((384, 256)) * 0.05).astype("<f4").view("<u4") >> 16).astype("<u2")
    f64 = (rng.standard_normal((128, 256)) * 0.05).astype("<f8")
    ids = np.arange(64, dtype="<i8")
    _write_safetensors(
        root / "a.safetensors",
        [
            ("z.weight", "F32", f32.shape, f32.tobytes()),
            ("ids", "I64", ids.shape, ids.tobytes()),
            ("m.weight", "BF16", bf16.shape, bf16.tobytes()),
            ("b.weight", "F16", f16.shape, f16.tobytes()),
        ],
    )
    g32 = (rng.standard_normal((512, 512)) * 0.02).astype("<f4")
    bias = (rng.standard_normal(512) * 0.01).astype("<f4")
    _write_safetensors(
        root / "b.safetensors",
        [
            ("c.bias", "F32", bias.shape, bias.tobytes()),
            ("c.weight", "F32", g32.shape, g32.tobytes()),
            ("d.weight", "F64", f64.shape, f64.tobytes()),
        ],
    )
    (root / "config.json").write_text('{"model_type": "toy"}')
    (root / "sub").mkdir()
    (root / "sub" / "tok.json").write_bytes(bytes(range(256)) * 40)
    return root


def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_streamed_output_is_byte_identical_to_the_whole_shard_writer(tmp_path: Path) -> None:
    model = _write_model(tmp_path / "m")
    # GOLDEN was written by the whole-shard writer with the uncoded message (`none`).
    result = embed_model(model, tmp_path / "out", KEY, MSG, params=WatermarkParams(message_code="none"))
    assert _digests(tmp_path / "out") == GOLDEN
    assert result.detection.detected
    assert [t.name for t in result.tensors] == ["b.weight", "m.weight", "z.weight", "c.weight", "d.weight"]
    # The statistics are accumulated in the same order as before, so they are equal to the last bit.
    # min_margin is over the 64 pilot bits (presence); the message verdict is separate.
    assert result.detection.min_margin == pytest.approx(3.05789632704367, rel=1e-12)
    assert result.detection.message_matched
    assert result.max_relative_change == pytest.approx(0.11206896551724138, rel=1e-12)
    assert result.relative_l2_change == pytest.approx(0.061069019771278134, rel=1e-12)
    assert result.mean_relative_change == pytest.approx(0.05759677879700384, rel=1e-12)


_PEAK_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from modelsec.watermark import WatermarkKey, embed_model
    import numpy
    from safetensors.numpy import save_file

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        raise SystemExit(field)

    key = WatermarkKey.from_bytes(bytes(range(1, 33)))
    # Warm-up on a one-tensor model: lazily imported modules are not part of the per-shard peak.
    small = Path(sys.argv[2] + "-warm")
    small.mkdir()
    warm = numpy.random.default_rng(2).standard_normal((400, 400), dtype=numpy.float32)
    save_file({"w.weight": warm}, str(small / "model.safetensors"))
    embed_model(small, Path(sys.argv[2] + "-warm-out"), key, b"peak")
    before = rss("VmRSS:")
    embed_model(Path(sys.argv[1]), Path(sys.argv[2]), key, b"peak")
    print(rss("VmHWM:") - before)
    """
)


def test_embed_peak_memory_is_below_the_shard_size(tmp_path: Path) -> None:
    """One 48 MiB shard of 12 tensors: the whole-shard writer peaked at about twice the shard (map + copy)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    root = tmp_path / "big"
    root.mkdir()
    save_file(
        {f"l{i}.weight": rng.standard_normal((1024, 1024), dtype=np.float32) for i in range(12)},
        str(root / "model.safetensors"),
    )
    shard = (root / "model.safetensors").stat().st_size
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(root), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    growth = int(out.stdout.split()[-1])
    assert growth < 0.6 * shard, f"peak grew by {growth / shard:.2f} x the shard size"
    assert (tmp_path / "out" / "model.safetensors").stat().st_size == shard


def test_a_shard_truncated_between_the_passes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelsec.watermark import embed as embed_module

    model = _write_model(tmp_path / "m")
    measure = embed_module._measure

    def measure_then_truncate(*args: object, **kwargs: object) -> object:
        out = measure(*args, **kwargs)  # type: ignore[arg-type]
        with open(model / "b.safetensors", "r+b") as f:
            f.truncate(os.path.getsize(model / "b.safetensors") - 8)
        return out

    monkeypatch.setattr(embed_module, "_measure", measure_then_truncate)
    with pytest.raises(MalformedArtifactError, match=r"b\.safetensors: the file changed"):
        embed_model(model, tmp_path / "out", KEY, MSG)
    assert not (tmp_path / "out").exists()
