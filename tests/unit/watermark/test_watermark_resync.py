"""Re-synchronisation: group inference, permutation and scaling undone, unrelated references refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelsec.watermark import (
    ArraySource,
    NeuronGroup,
    TensorRef,
    WatermarkKey,
    detect,
    embed_model,
    infer_groups,
    resynchronise,
)

from ._helpers import load_state, permute_scale_mlp
from .conftest import mlp_state

MSG = b"ACME-clf"


def test_infer_groups_bert_and_numbered_stacks() -> None:
    refs = []
    for i in range(2):
        p = f"encoder.layer.{i}"
        refs += [
            TensorRef(f"{p}.attention.self.query.weight", "F32", (384, 384)),
            TensorRef(f"{p}.attention.self.query.bias", "F32", (384,)),
            TensorRef(f"{p}.attention.self.key.weight", "F32", (384, 384)),
            TensorRef(f"{p}.attention.self.value.weight", "F32", (384, 384)),
            TensorRef(f"{p}.attention.self.value.bias", "F32", (384,)),
            TensorRef(f"{p}.attention.output.dense.weight", "F32", (384, 384)),
            TensorRef(f"{p}.intermediate.dense.weight", "F32", (1536, 384)),
            TensorRef(f"{p}.intermediate.dense.bias", "F32", (1536,)),
            TensorRef(f"{p}.output.dense.weight", "F32", (384, 1536)),
        ]
    refs += [
        TensorRef("net.0.weight", "F32", (512, 64)),
        TensorRef("net.0.bias", "F32", (512,)),
        TensorRef("net.2.weight", "F32", (512, 512)),
        TensorRef("net.10.weight", "F32", (10, 512)),
        TensorRef("embeddings.word_embeddings.weight", "F32", (30522, 384)),
    ]
    groups = {g.producers[0]: g for g in infer_groups(refs)}
    assert groups["encoder.layer.1.intermediate.dense.weight"] == NeuronGroup(
        ("encoder.layer.1.intermediate.dense.weight", "encoder.layer.1.intermediate.dense.bias"),
        ("encoder.layer.1.output.dense.weight",),
    )
    assert groups["encoder.layer.0.attention.self.value.weight"].consumers == (
        "encoder.layer.0.attention.output.dense.weight",
    )
    assert groups["encoder.layer.0.attention.self.query.weight"].consumers == ()
    # Numbered layers are ordered numerically (10 after 2), and chain only when the shapes do.
    assert groups["net.0.weight"] == NeuronGroup(("net.0.weight", "net.0.bias"), ("net.2.weight",))
    assert groups["net.2.weight"].consumers == ("net.10.weight",)
    assert "embeddings.word_embeddings.weight" not in groups
    assert len(groups) == 2 * 4 + 2


def test_permutation_and_scaling_are_undone(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    key = WatermarkKey.from_bytes(bytes(range(1, 33)))
    ref = tmp_path / "ref"
    ref.mkdir()
    save_file(mlp_state(), str(ref / "model.safetensors"))
    embed_model(ref, tmp_path / "marked", key, MSG)
    attacked = permute_scale_mlp(load_state(tmp_path / "marked"))
    blind = detect(attacked, key, message=MSG)
    assert not blind.detected and blind.bit_error_rate > 0.3  # the attack works without the reference
    found = detect(attacked, key, message=MSG, reference=ref)
    assert found.detected and found.bit_error_rate == 0 and found.resynchronised
    assert found.resync is not None and found.resync.permuted == 2 and found.resync.rescaled == 2
    assert found.min_margin > 2.9
    # The transforms map the attacked tensors back onto the marked ones (up to the mark itself).
    transforms, _ = resynchronise(ArraySource(attacked), ArraySource(load_state(tmp_path / "marked")))
    from modelsec.watermark.resync import ResyncedSource

    view = ResyncedSource(ArraySource(attacked), transforms)
    marked = load_state(tmp_path / "marked")
    for name in ("net.0.weight", "net.2.weight", "net.4.weight", "net.0.bias"):
        got = view.read(TensorRef(name, "F32", marked[name].shape))
        assert np.allclose(got, marked[name], rtol=1e-4, atol=1e-6)


def test_unrelated_reference_is_skipped_not_trusted() -> None:
    suspect = ArraySource(mlp_state(seed=1))
    unrelated = ArraySource(mlp_state(seed=2))
    transforms, report = resynchronise(suspect, unrelated)
    assert transforms == {} and set(report.skipped) == {"net.0.weight", "net.2.weight"}
    assert all("mean matched cosine" in why for why in report.skipped.values())
    shape_mismatch = ArraySource(mlp_state(seed=1, hidden=256))
    _, report = resynchronise(suspect, shape_mismatch)
    assert all("shapes differ" in why for why in report.skipped.values())


def test_greedy_fallback_without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Colliding row maxima need a real assignment: SciPy's optimum, or the greedy fallback without SciPy."""
    import numpy as np

    from modelsec.watermark import resync

    similarity = np.array([[0.9, 0.8], [0.85, 0.1]])  # both rows prefer suspect 0
    assert resync._assign(similarity).tolist() == [1, 0]  # Hungarian: 0.8 + 0.85 > 0.9 + 0.1

    def no_scipy(name: str) -> object:
        raise ImportError(name)

    monkeypatch.setattr(resync.importlib, "import_module", no_scipy)
    assert resync._assign(similarity).tolist() == [0, 1]  # greedy: the largest entry first


def test_resync_undoes_permutation_and_scaling_without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_scipy(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    state = mlp_state()
    attacked = permute_scale_mlp(state)
    transforms, report = resynchronise(ArraySource(attacked), ArraySource(state))
    assert report.permuted == 2 and not report.skipped
    perm = transforms["net.0.weight"].rows
    assert perm is not None and sorted(perm.perm.tolist()) == list(range(512))
