"""Pickles are refused by their bytes, whatever their names (issue 27.6).

Each case is a real pickle whose `__reduce__` opens a marker file for writing, wrapped the way a consumer
unwraps it by content (`torch.load` reads any zip, `joblib.load` any gzip/xz/bz2 stream), under a name that
`PICKLE_SUFFIXES` does not cover. Each is signed (`--allow-unverifiable`, as a user who insists would) and
then refused under `refusePickle` by every entry point that verifies bytes: `verify_model`, the loader,
the runtime guard's snapshot, the `verify` CLI and `sign` itself. Nothing is unpickled: the marker never
appears. The real safetensors fixtures with their JSON and tokenizer files, and archives whose inspected
content is clean, still pass.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import lzma
import os
import pickle
import shutil
import struct
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import MalformedArtifactError, PickleContentError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.content import pickle_finding
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.guard.snapshot import open_snapshot
from modelsec.verifier.loader import load_model
from tests.support.policies import key_policy

P256 = SignatureAlgorithm.ECDSA_P256.value


class _Touch:
    """Unpickling this opens `path` for writing: the marker that proves a payload ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def _payload(marker: Path, protocol: int = 4) -> bytes:
    return pickle.dumps({"weights": _Touch(marker)}, protocol=protocol)


def _tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _torch_zip(marker: Path) -> bytes:
    # The layout torch.save writes (`<archive>/data.pkl` first, then `byteorder`, `version`), built with
    # zipfile so that the test needs no torch; `torch.load` finds data.pkl by that name.
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("checkpoint/data.pkl", _payload(marker, 2))
        z.writestr("checkpoint/byteorder", "little")
        z.writestr("checkpoint/version", "3\n")
    return out.getvalue()


def _zstd(data: bytes) -> bytes:
    """A zstd frame (RFC 8878) holding `data` in raw blocks: valid for any zstd reader, no library needed."""
    frame = b"\x28\xb5\x2f\xfd" + bytes([0x00]) + bytes([0x58])  # no checksum, window 2^(10+11) bytes
    for i in range(0, max(len(data), 1), 1 << 17):
        block = data[i : i + (1 << 17)]
        last = int(i + (1 << 17) >= len(data))
        frame += struct.pack("<I", last | (0 << 1) | (len(block) << 3))[:3] + block
    return frame


# name -> (bytes given the marker path, what the refusal says the bytes are)
CASES: dict[str, tuple[Callable[[Path], bytes], str]] = {
    "checkpoint.pth.tar": (
        lambda m: _tar({"checkpoint.pth": _torch_zip(m)}),
        "a tar archive whose member 'checkpoint.pth' is a pickle by its name",
    ),
    "weights.tar": (
        lambda m: _tar({"config.json": b"{}", "weights": _torch_zip(m)}),
        "a tar archive whose member 'weights' is a zip archive whose member 'checkpoint/data.pkl' is a",
    ),
    "checkpoint.ckpt.zip": (
        _torch_zip,
        "a zip archive whose member 'checkpoint/data.pkl' is a pickle by its",
    ),
    "classifier.pkl.gz": (lambda m: gzip.compress(_payload(m)), "a gzip-compressed pickle (protocol 4)"),
    "model.joblib.xz": (lambda m: lzma.compress(_payload(m, 3)), "an xz-compressed pickle (protocol 3)"),
    "model.bz2": (
        lambda m: __import__("bz2").compress(_payload(m)),
        "a bzip2-compressed pickle (protocol 4)",
    ),
    "model.zst": (lambda m: _zstd(_payload(m)), "zstd"),
    "weights.tar.gz": (
        lambda m: gzip.compress(_tar({"w": _payload(m, 5)})),
        "a gzip-compressed tar archive whose member 'w' is a pickle (protocol 5)",
    ),
    "notes.txt": (lambda m: _payload(m, 0), "a pickle (protocol 0 or 1)"),
    "tokenizer.model": (lambda m: _payload(m, 1), "a pickle (protocol 0 or 1)"),
    "big-string-first.data": (
        lambda m: pickle.dumps(["x" * (2 * 2**20), _Touch(m)], protocol=0),
        "a pickle (protocol 0 or 1)",
    ),
}


def _policy(key_dir: Path, **limits: int) -> Policy:
    return key_policy(key_dir, limits=Limits(**limits)) if limits else key_policy(key_dir)


def _sign(model: Path, key_dir: Path, bundle: Path | None = None) -> None:
    paths = {0: bundle} if bundle is not None else None
    sign_model(model, [load_private_key_file(key_dir / f"{P256}.key.pem")], signature_paths=paths)


def _model_with(tiny_model: Path, name: str, data: bytes, key_dir: Path) -> Path:
    (tiny_model / name).write_bytes(data)
    _sign(tiny_model, key_dir)
    return tiny_model


@pytest.mark.parametrize("name", sorted(CASES))
def test_pickle_content_refused_by_verify_model(
    tiny_model: Path, key_dir: Path, tmp_path: Path, name: str
) -> None:
    make, found = CASES[name]
    marker = tmp_path / "ran"
    model = _model_with(tiny_model, name, make(marker), key_dir)
    policy = _policy(key_dir)
    with pytest.raises(PickleContentError) as e:
        verify_model(model, policy)
    assert e.value.path == f"{model}/{name}"
    assert found in e.value.finding
    assert "refusePickle: false" in str(e.value)
    # Only the pickle refusal stood in the way: the same signed bytes verify as opaque files without it.
    assert verify_model(model, dataclasses.replace(policy, refuse_pickle=False)).files >= 1
    assert not marker.exists()


@pytest.mark.parametrize("name", ["classifier.pkl.gz", "checkpoint.pth.tar", "notes.txt"])
def test_pickle_content_refused_by_loader_guard_and_cli(
    tiny_model: Path,
    key_dir: Path,
    tmp_path: Path,
    name: str,
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    pytest.importorskip("torch")
    make, found = CASES[name]
    marker = tmp_path / "ran"
    model = _model_with(tiny_model, name, make(marker), key_dir)
    policy = _policy(key_dir)
    with pytest.raises(PickleContentError, match=name.replace(".", r"\.")) as e:
        load_model(model, policy)
    assert found in e.value.finding
    with pytest.raises(PickleContentError) as g:
        open_snapshot(model, policy)
    assert g.value.path == f"{model}/{name}"
    result = cli("verify", model, "--trusted-key", key_dir / f"{P256}.pub.pem")
    assert result.returncode == 1
    assert f"{name}: pickle content not allowed" in result.stderr
    assert not marker.exists()


def test_single_file_signed_as_one_opaque_file(tmp_path: Path, key_dir: Path) -> None:
    """`modelsec sign classifier.pkl.gz`: its bundle verifies the bytes, then refuses what they are."""
    marker = tmp_path / "ran"
    f = tmp_path / "classifier.pkl.gz"
    f.write_bytes(gzip.compress(_payload(marker)))
    bundle = tmp_path / "classifier.pkl.gz.sig"  # a single file has no default bundle name
    _sign(f, key_dir, bundle)
    with pytest.raises(PickleContentError) as e:
        verify_model(f, key_policy(key_dir), bundles=[bundle])
    assert e.value.finding == "a gzip-compressed pickle (protocol 4)"
    assert not marker.exists()


def test_sign_refuses_pickle_content_unless_told(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tiny_model / "classifier.pkl.gz").write_bytes(gzip.compress(_payload(marker)))
    with pytest.raises(PolicyViolationError, match=r"classifier\.pkl\.gz \(a gzip-compressed pickle"):
        sign_model(tiny_model, [load_private_key_file(key_dir / f"{P256}.key.pem")], refuse_unverifiable=True)
    assert not (tiny_model / "model.sig").exists()
    assert not marker.exists()


def test_renamed_safetensors_pickle_is_malformed(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    """A pickle named `*.safetensors` is held to the strict header parse: refused by sign and verifiers."""
    marker = tmp_path / "ran"
    name = "model-00001-of-00002.safetensors"
    pickled = _payload(marker)
    (tmp_path / name).write_bytes(pickled)
    with pytest.raises(MalformedArtifactError, match=rf"{name}: header length"):
        _sign(tmp_path / name, key_dir, tmp_path / f"{name}.sig")
    _sign(tiny_model, key_dir)
    (tiny_model / name).write_bytes(pickled)  # swapped in after signing
    policy = key_policy(key_dir)
    for verify in (verify_model, open_snapshot, load_model):
        with pytest.raises(MalformedArtifactError, match=rf"{name}: header length"):
            verify(tiny_model, policy)
    assert not marker.exists()


def test_archive_too_large_to_inspect_is_refused_as_may_hold_pickles(tiny_model: Path, key_dir: Path) -> None:
    """The documented decision: an opaque archive is accepted only when inspected whole within the limits."""
    members = {
        "config.json": b"{}",
        "model.safetensors": (tiny_model / "model-00001-of-00002.safetensors").read_bytes(),
    }
    model = _model_with(tiny_model, "model.tar", _tar(members), key_dir)
    policy = _policy(key_dir, max_content_inspect_bytes=4096)
    with pytest.raises(PickleContentError) as e:
        verify_model(model, policy)
    assert e.value.finding.startswith(
        "a tar archive that could not be inspected completely within the first 4096"
    )
    assert "sign the unpacked files instead" in str(e.value)
    # The same archive inspected whole within the default limits holds no pickle and verifies.
    assert verify_model(model, key_policy(key_dir)).files >= 1


def test_clean_models_and_archives_pass(tiny_model: Path, key_dir: Path) -> None:
    """No false positives: safetensors shards, index, config and tokenizer JSON, text, clean archives."""
    (tiny_model / "README.md").write_text("Git v2.35.2 Release Notes\n(The) model card.\n")
    (tiny_model / "merges.txt").write_text("#version: 0.2\nĠ t\nĠ a\n")
    (tiny_model / "extras.tar.gz").write_bytes(gzip.compress(_tar({"a.json": b'{"x": 1}', "b.txt": b"hi\n"})))
    (tiny_model / "data.zip").write_bytes(_zip_clean())
    (tiny_model / "image.bmp").write_bytes(b"BM" + struct.pack("<I", 1 << 30) + os.urandom(64))
    _sign(tiny_model, key_dir)
    assert (
        verify_model(tiny_model, key_policy(key_dir)).files
        == len([p for p in tiny_model.rglob("*") if p.is_file()]) - 1
    )


def _zip_clean() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("tokenizer.json", '{"model": {"vocab": {}}}')
    return out.getvalue()


def test_real_fixture_models_have_no_pickle_finding() -> None:
    """Every file of the shipped safetensors fixtures and the shared corpus's good models is not a pickle."""
    limits = Limits()
    root = Path(__file__).resolve().parents[1]
    checked = 0
    for path in sorted(root.glob("unit/*/fixtures/**/*")):
        if path.is_file() and not path.name.endswith(".py"):
            data = path.read_bytes()
            assert pickle_finding(data[: limits.max_content_inspect_bytes], len(data), limits) is None, path
            checked += 1
    assert checked


def test_payloads_are_live(tmp_path: Path) -> None:
    """The payloads really run when unpickled the way their consumers would: the refusals above matter."""
    marker = tmp_path / "ran"
    pickle.loads(gzip.decompress(CASES["classifier.pkl.gz"][0](marker)))
    assert marker.exists()
    marker.unlink()
    with tarfile.open(fileobj=io.BytesIO(CASES["checkpoint.pth.tar"][0](marker))) as t:
        inner = t.extractfile("checkpoint.pth")
        assert inner is not None
        with zipfile.ZipFile(io.BytesIO(inner.read())) as z:
            pickle.loads(z.read("checkpoint/data.pkl"))
    assert marker.exists()
    if shutil.which("zstd"):
        marker.unlink()
        out = subprocess.run(
            ["zstd", "-dc"], input=CASES["model.zst"][0](marker), capture_output=True, check=True
        )
        pickle.loads(out.stdout)
        assert marker.exists()
