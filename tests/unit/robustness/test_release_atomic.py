"""`release_model` is all or nothing: a failed stage leaves `--out` untouched, and a rerun then succeeds."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")
import numpy as np  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from modelsec.errors import GateFailedError, PolicyError  # noqa: E402
from modelsec.release import GateSpec, release_model  # noqa: E402
from modelsec.signer import load_private_key_file  # noqa: E402
from modelsec.verifier import verify_model  # noqa: E402
from modelsec.watermark import generate_key_file_text, parse_key  # noqa: E402
from tests.unit.robustness import _helpers as h  # noqa: E402

torch.set_num_threads(1)


ARCH = """from torch import nn


def wide_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 10))
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A wide digits MLP (enough carriers for a watermark: fixtures/wide_mlp.safetensors) and 40 digits."""
    root = tmp_path_factory.mktemp("release-atomic")
    (root / "release_atomic_arch.py").write_text(ARCH)
    sys.path.insert(0, str(root))
    model = root / "model"
    model.mkdir()
    save_file(h.fixture_state("wide_mlp"), str(model / "model.safetensors"))
    _, _, x, y = h.digits()
    np.savez(root / "digits.npz", inputs=x[:40].numpy(), labels=y[:40].numpy())
    yield model, root / "digits.npz"
    sys.path.remove(str(root))


def _gate(data: Path, min_robust_accuracy: float) -> GateSpec:
    return GateSpec.model_validate(
        {
            "architecture": "release_atomic_arch:wide_mlp",
            "data": data,
            "eps": 0.03,
            "stepSize": 0.01,
            "steps": 3,
            "minRobustAccuracy": min_robust_accuracy,
            "minSamples": 5,
        }
    )


def _release(
    model: Path, out: Path, data: Path, key_dir: Path, bar: float, report: Path | None = None
) -> object:
    return release_model(
        model,
        out,
        signers=[
            load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
            load_private_key_file(key_dir / "sm2.key.pem"),
        ],
        watermark_key=parse_key(generate_key_file_text(), source="test key"),
        message=b"r1",
        gate=_gate(data, bar),
        report=report,
    )


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("precreated", [False, True])
def test_failed_gate_leaves_nothing_and_rerun_works(
    inputs: tuple[Path, Path], key_dir: Path, tmp_path: Path, precreated: bool
) -> None:
    model, data = inputs
    out = tmp_path / "released"
    reports = tmp_path.parent / f"{tmp_path.name}-reports"
    reports.mkdir()
    if precreated:
        out.mkdir()
    with pytest.raises(GateFailedError, match="gate FAILED"):
        _release(model, out, data, key_dir, 1.0, report=reports / "failed.md")
    # Nothing signed or watermarked is left behind: --out is as it was, no staging directory remains.
    assert _listing(tmp_path) == (["released"] if precreated else [])
    # The CI report of the failed gate is written, and names no attestation (none was published).
    failed = (reports / "failed.md").read_text()
    assert failed.startswith("# PGD robustness gate: FAILED") and "attestation: none written" in failed
    if precreated:
        assert _listing(out) == []
    # The rerun into the same --out succeeds and the release verifies where it was published.
    result = _release(model, out, data, key_dir, 0.0, report=reports / "passed.xml")
    assert _listing(tmp_path) == ["released"]
    suite = ET.parse(reports / "passed.xml").getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests", "0")) >= 2
    assert _listing(out) == [
        "model.attestations",  # the SLSA provenance (issue 29)
        "model.gate.sig",
        "model.safetensors",
        "model.sig",
        "model.sm2.sig",
        "model.watermark.sig",
    ]
    assert result.out_dir == out  # type: ignore[attr-defined]
    assert all(p.parent == out and p.is_file() for p in result.bundles)  # type: ignore[attr-defined]
    assert verify_model(out, result.policy).root_digest == result.root_digest  # type: ignore[attr-defined]


def test_failed_architecture_import_leaves_nothing(
    inputs: tuple[Path, Path], key_dir: Path, tmp_path: Path
) -> None:
    model, data = inputs
    out = tmp_path / "released"
    gate = _gate(data, 0.0)
    with pytest.raises(PolicyError, match="cannot import nope_mod"):
        release_model(
            model,
            out,
            signers=[load_private_key_file(key_dir / "ecdsa-p256.key.pem")],
            watermark_key=parse_key(generate_key_file_text(), source="test key"),
            message=b"r1",
            gate=gate.model_copy(update={"architecture": "nope_mod:f"}),
        )
    assert _listing(tmp_path) == []


def test_non_empty_out_is_refused_before_any_work(
    inputs: tuple[Path, Path], key_dir: Path, tmp_path: Path
) -> None:
    model, data = inputs
    out = tmp_path / "released"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PolicyError, match="exists and is not empty"):
        _release(model, out, data, key_dir, 0.0)
    assert _listing(tmp_path) == ["released"] and _listing(out) == ["keep.txt"]
    (out / "keep.txt").unlink()
    with pytest.raises(PolicyError, match="outside the release directory"):
        _release(model, out, data, key_dir, 0.0, report=out / "gate.md")
    with pytest.raises(PolicyError, match=r"must end in \.md"):
        _release(model, out, data, key_dir, 0.0, report=tmp_path / "gate.txt")
    assert _listing(tmp_path) == ["released"] and _listing(out) == []
