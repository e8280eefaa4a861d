"""`embed_within_budget` keeps only candidates whose message reads back exactly.

The embedder puts every code bit at margin `kappa` *before* the cast back to the stored dtype; at a tiny
margin the rounding of a float16 tensor moves some bits' normalised correlation below zero. The pilot bits
still say "present" (2 of 64 wrong keep confidence 0.92), but a message bit read wrong is another message.
Measured on `_model` (23-byte message, 184 of the 192 message bits a 0.26M-weight carrier set holds; real
embeds, no mock): at kappa 0.002 every carrier set keeps 64/64 pilot bits; with the dense layer in float32
only its own set reads 184/184 message bits, the float16 embedding table alone and the mixed set read 183,
and the embedding table alone moves the weights least. With both tensors float16 every set reads 182-183
at kappa 0.001 and 0.002.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from modelsec.errors import GateFailedError  # noqa: E402
from modelsec.watermark import WatermarkKey, detect, embed_model  # noqa: E402
from modelsec.watermark.budget import embed_within_budget  # noqa: E402
from modelsec.watermark.spread_spectrum import WatermarkParams  # noqa: E402
from tests.unit.watermark import _helpers as H  # noqa: E402

torch.set_num_threads(1)
KEY = WatermarkKey.from_bytes(bytes(range(1, 33)))
MESSAGE = b"ACME/model v1.23 (2025)"


def _model(root: Path, *, dense_dtype: type) -> Path:
    """A float16 embedding table (0.26M weights) and a dense layer (0.26M weights, `dense_dtype`)."""
    rng = np.random.default_rng(0)
    return H.save_state(
        {
            "embed.weight": (rng.standard_normal((4096, 64)) * 0.01).astype(np.float16),
            "net.2.weight": (rng.standard_normal((512, 512)) * 0.04).astype(dense_dtype),
            "net.2.bias": (rng.standard_normal(512) * 0.01).astype(np.float32),
        },
        root,
    )


class RelativeL2Probe:
    """Fidelity as the relative L2 change of all weights, measured from the written files."""

    metric = "relative-l2-change"
    size = 1

    def __init__(self) -> None:
        self._reference: H.Arrays = {}

    def digest(self) -> str:
        return "sha256:" + "00" * 32

    def prepare(self, model_dir: Path) -> None:
        self._reference = {k: v.astype(np.float64) for k, v in H.load_state(model_dir).items()}

    def loss(self, marked_dir: Path) -> tuple[float, float | None]:
        marked = H.load_state(marked_dir)
        change = sum(float(((marked[k] - v) ** 2).sum()) for k, v in self._reference.items())
        return math.sqrt(change / sum(float((v**2).sum()) for v in self._reference.values())), None


def test_a_present_mark_with_message_errors_is_skipped_for_one_that_reads_back(tmp_path: Path) -> None:
    src = _model(tmp_path / "src", dense_dtype=np.float32)
    probe = RelativeL2Probe()
    probe.prepare(src)
    # The premise, on a real embed: the cheapest carrier set keeps presence but not the message.
    cheap = embed_model(
        src, tmp_path / "cheap", KEY, MESSAGE, params=WatermarkParams(kappa=0.002, carrier_set="embeddings")
    )
    assert cheap.detection.detected and cheap.detection.message_matched is False
    assert cheap.detection.message_matches is not None and cheap.detection.message_matches < 184
    cheap_loss, _ = probe.loss(tmp_path / "cheap")

    r = embed_within_budget(
        src,
        tmp_path / "out",
        KEY,
        MESSAGE,
        probe=probe,
        params=WatermarkParams(kappa=0.002),
        min_kappa=0.002,
        max_fidelity_loss=0.1,
    )
    assert r.detection.detected and r.detection.message_matched is True
    assert r.params.carrier_set == "no-embeddings"  # the only set that reads back
    assert r.fidelity is not None and cheap_loss < r.fidelity.value <= 0.1
    again = detect(tmp_path / "out", KEY, message=MESSAGE)
    assert again.detected and again.message_matched is True and again.decoded_message == MESSAGE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cheap", "out", "src"]  # no candidate left behind


def test_every_candidate_present_with_message_errors_is_refused_saying_so(tmp_path: Path) -> None:
    src = _model(tmp_path / "src", dense_dtype=np.float16)
    with pytest.raises(GateFailedError) as e:
        embed_within_budget(
            src,
            tmp_path / "out",
            KEY,
            MESSAGE,
            probe=RelativeL2Probe(),
            params=WatermarkParams(kappa=0.002, message_code="none"),  # uncoded: errors stay errors
            min_kappa=0.001,
            steps=1,
            max_fidelity_loss=0.1,
        )
    message = str(e.value)
    assert "kappa 0.001/" in message  # the weakest margin tried
    assert "present but its message does not read back exactly" in message and "/184 message bits" in message
    assert "the message cannot be read back" in message
    assert "false-positive bound" not in message  # it was kept: the pilot bits were found
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_a_margin_too_weak_to_read_back_moves_the_search_up(tmp_path: Path) -> None:
    """Both tensors float16, the embedding table alone: the message reads back from kappa 0.006 (183/184 at
    0.002-0.004) and the loss grows with the margin (0.00647 at 0.002, 0.00657 at 0.02, over the 0.00654
    budget at 0.03). The old search gave up when `min_kappa` did not read back; the bisection now moves up
    from a margin too weak and down from one over budget."""
    src = _model(tmp_path / "src", dense_dtype=np.float16)
    r = embed_within_budget(
        src,
        tmp_path / "out",
        KEY,
        MESSAGE,
        probe=RelativeL2Probe(),
        params=WatermarkParams(kappa=0.03),
        min_kappa=0.002,
        steps=3,
        max_fidelity_loss=0.00654,
    )
    assert r.params.carrier_set == "embeddings" and 0.002 < r.params.kappa < 0.03
    assert r.detection.detected and r.detection.message_matched is True
    assert r.fidelity is not None and r.fidelity.value <= 0.00654
    again = detect(tmp_path / "out", KEY, message=MESSAGE)
    assert again.detected and again.decoded_message == MESSAGE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
