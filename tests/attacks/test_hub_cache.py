"""The Hugging Face hub cache layout verifies; every other link stays refused.

`huggingface_hub` stores a revision as `<cache>/models--org--name/snapshots/<rev>/` whose entries are
relative links into `<cache>/models--org--name/blobs/<blob>`. The tests build that layout offline from a
normally signed model (bundle included), then check that a link leaving `blobs/`, an absolute link, a blob
that is itself a link, a directory link and a tampered blob are each refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import DigestMismatchError, PolicyViolationError
from modelsec.modelformat.model_files import hub_blob_name
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.trust.bundles import read_bundle
from tests.conftest import write_tiny_model

P256 = SignatureAlgorithm.ECDSA_P256.value
REV = "0123456789abcdef0123456789abcdef01234567"


def _to_hub_layout(model: Path, cache: Path) -> Path:
    """Move every file of `model` into `cache/models--org--tiny/blobs/` and link it from the snapshot."""
    entry = cache / "models--org--tiny"
    blobs, snapshot = entry / "blobs", entry / "snapshots" / REV
    blobs.mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(REV)
    for path in sorted(p for p in model.rglob("*") if p.is_file()):
        rel = path.relative_to(model)
        blob = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.move(path, blobs / blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blobs / blob, link.parent), link)
    return snapshot


@pytest.fixture(autouse=True, params=["openat2", "walk"])
def _resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hub case with openat2 and with the forced component-by-component O_NOFOLLOW walk."""
    from modelsec.modelformat import openat2

    monkeypatch.setattr(openat2, "FORCE_FALLBACK", request.param == "walk")


@pytest.fixture
def hub_snapshot(tmp_path: Path, key_dir: Path) -> Path:
    model = write_tiny_model(tmp_path / "src")
    (model / "1_Pooling").mkdir()
    (model / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 16}))
    sign_model(model, [load_private_key_file(key_dir / f"{P256}.key.pem")])
    snapshot = _to_hub_layout(model, tmp_path / "hub")
    assert os.readlink(snapshot / "1_Pooling" / "config.json").startswith("../../../blobs/")
    assert os.path.islink(snapshot / "model.sig")
    return snapshot


def _policy(key_dir: Path) -> Policy:
    return Policy.from_key_files([key_dir / f"{P256}.pub.pem"])


def _blob(snapshot: Path, name: str) -> Path:
    return snapshot.parent.parent / "blobs" / Path(os.readlink(snapshot / name)).name


def test_hub_snapshot_verifies(hub_snapshot: Path, key_dir: Path) -> None:
    result = verify_model(hub_snapshot, _policy(key_dir))
    assert result.files == 7 and result.tensors == 6
    assert read_bundle(hub_snapshot / "model.sig", _policy(key_dir).limits).hint
    assert verify_model(hub_snapshot / "model-00001-of-00002.safetensors", _policy(key_dir)).files == 1


def test_hub_snapshot_loads(hub_snapshot: Path, key_dir: Path) -> None:
    pytest.importorskip("torch").set_num_threads(1)
    from modelsec.verifier import load_model

    tensors = load_model(hub_snapshot, _policy(key_dir))
    assert sorted(tensors) == sorted(f"layers.{i}.{k}" for i in range(2) for k in ("weight", "bias", "ids"))


def test_tampered_blob_refused(hub_snapshot: Path, key_dir: Path) -> None:
    blob = _blob(hub_snapshot, "1_Pooling/config.json")
    blob.write_text(json.dumps({"word_embedding_dimension": 17}))
    with pytest.raises(DigestMismatchError, match=r"1_Pooling/config\.json"):
        verify_model(hub_snapshot, _policy(key_dir))


def _relink(link: Path, target: str) -> None:
    link.unlink()
    os.symlink(target, link)


def test_link_out_of_blobs_refused(hub_snapshot: Path, key_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    shutil.copy(_blob(hub_snapshot, "config.json"), outside)  # same bytes: only the link is wrong
    _relink(hub_snapshot / "config.json", os.path.relpath(outside, hub_snapshot))
    with pytest.raises(PolicyViolationError, match=r"'config\.json' is a symlink"):
        verify_model(hub_snapshot, _policy(key_dir))


def test_link_into_another_entry_blobs_refused(hub_snapshot: Path, key_dir: Path) -> None:
    other = hub_snapshot.parent.parent.parent / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    shutil.copy(_blob(hub_snapshot, "config.json"), other / "x")
    _relink(hub_snapshot / "config.json", "../../../models--org--other/blobs/x")
    with pytest.raises(PolicyViolationError, match="symlink"):
        verify_model(hub_snapshot, _policy(key_dir))


def test_absolute_link_refused(hub_snapshot: Path, key_dir: Path) -> None:
    _relink(hub_snapshot / "config.json", str(_blob(hub_snapshot, "config.json")))
    with pytest.raises(PolicyViolationError, match="symlink"):
        verify_model(hub_snapshot, _policy(key_dir))


def test_blob_that_is_a_link_refused(hub_snapshot: Path, key_dir: Path, tmp_path: Path) -> None:
    blob = _blob(hub_snapshot, "config.json")
    real = tmp_path / "real.json"
    shutil.move(blob, real)
    os.symlink(real, blob)
    with pytest.raises(PolicyViolationError, match="not a regular file"):
        verify_model(hub_snapshot, _policy(key_dir))
    with pytest.raises(PolicyViolationError):
        verify_model(hub_snapshot / "config.json", _policy(key_dir))


def test_directory_link_refused(hub_snapshot: Path, key_dir: Path) -> None:
    blobs = hub_snapshot.parent.parent / "blobs"
    (blobs / "d").mkdir()
    os.symlink("../../blobs/d", hub_snapshot / "extra")
    with pytest.raises(PolicyViolationError, match="not a regular file"):
        verify_model(hub_snapshot, _policy(key_dir))


def test_bundle_link_out_of_blobs_refused(hub_snapshot: Path, key_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "model.sig"
    shutil.copy(_blob(hub_snapshot, "model.sig"), outside)
    _relink(hub_snapshot / "model.sig", os.path.relpath(outside, hub_snapshot))
    with pytest.raises(PolicyViolationError, match="signature bundle is a symlink"):
        verify_model(hub_snapshot, _policy(key_dir))


def test_same_links_outside_a_hub_entry_refused(hub_snapshot: Path, key_dir: Path, tmp_path: Path) -> None:
    """The layout is recognised by its names: a look-alike whose entry is not `models--*` is refused."""
    moved = tmp_path / "hub" / "not-a-model-entry"
    os.rename(hub_snapshot.parent.parent, moved)
    with pytest.raises(PolicyViolationError, match="symlink"):
        verify_model(moved / "snapshots" / REV, _policy(key_dir))


@pytest.mark.parametrize(
    ("target", "depth", "blob"),
    [
        ("../../blobs/abc", 0, "abc"),
        ("../../../blobs/abc", 1, "abc"),
        ("./../../blobs//abc", 0, "abc"),
        ("../../blobs/abc", 1, None),  # lands in snapshots/blobs/abc
        ("../../../blobs/abc", 0, None),  # above the entry
        ("../../blobs/x/abc", 0, None),
        ("../../blobs", 0, None),
        ("/cache/models--a--b/blobs/abc", 0, None),
        ("abc", 0, None),
        ("../../blobs/..", 0, None),
    ],
)
def test_hub_blob_name(target: str, depth: int, blob: str | None) -> None:
    assert hub_blob_name(target, depth) == blob
