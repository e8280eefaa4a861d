"""load_model / open_model: verified bytes only, partial loads, plain OMS bundles, TOCTOU, policies."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import (
    DigestMismatchError,
    MalformedArtifactError,
    PolicyError,
    PolicyViolationError,
    SignatureError,
    VerificationError,
)
from modelsec.policy import Policy, PolicySet
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import load_model, open_model
from modelsec.verifier.admission import admit, admit_model

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def _sign(model: Path, key_dir: Path, **kw) -> Policy:  # type: ignore[no-untyped-def]
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], **kw)
    return Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])


def _reference(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(model.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_full_load_equals_plain_safetensors(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    assert _equal(load_model(tiny_model, policy), _reference(tiny_model))


def test_dtypes_alignment_and_edge_shapes(tmp_path: Path, key_dir: Path) -> None:
    m = tmp_path / "m"
    m.mkdir()
    tensors = {
        "a_f16_odd": np.arange(3, dtype=np.float16),  # makes the next tensor misaligned
        "b_f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "c_empty": np.zeros((0, 5), dtype=np.float32),
        "d_scalar": np.array(7, dtype=np.int64),
        "e_bool": np.array([True, False, True]),
        "f_u8": np.arange(5, dtype=np.uint8),
    }
    save_file(tensors, str(m / "model.safetensors"))
    t = torch.zeros(3, dtype=torch.bfloat16)
    from safetensors.torch import save_file as save_torch

    save_torch({"g_bf16": t + 1.5}, str(m / "extra.safetensors"))
    policy = _sign(m, key_dir)
    loaded = load_model(m, policy)
    assert _equal(loaded, _reference(m))
    assert loaded["d_scalar"].shape == () and loaded["c_empty"].shape == (0, 5)


def test_partial_load_reads_only_the_needed_shard(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    opened: list[str] = []

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event == "open" and args and isinstance(args[0], str):
            opened.append(args[0])

    sys.addaudithook(hook)
    opened.clear()
    out = load_model(tiny_model, policy, tensors=["layers.1.weight"])
    assert list(out) == ["layers.1.weight"]
    assert torch.equal(out["layers.1.weight"], _reference(tiny_model)["layers.1.weight"])
    assert not any("model-00001" in p for p in opened), opened


def test_partial_load_refuses_tampered_tensor(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    shard = tiny_model / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # last tensor of the shard
    shard.write_bytes(bytes(data))
    from modelsec.limits import Limits
    from modelsec.modelformat.safetensors_header import read_header

    with open(shard, "rb") as f:
        header, _ = read_header(f, len(data), path=str(shard), limits=Limits())
    last = header.tensors[-1].name
    with pytest.raises(DigestMismatchError, match=rf"`{last}`"):
        load_model(tiny_model, policy, tensors=[last])


def test_partial_load_of_many_tensors_in_parallel(tiny_model: Path, key_dir: Path) -> None:
    """Several tensors of several shards, read and hashed on every core: same tensors, same refusals."""
    policy = _sign(tiny_model, key_dir)
    reference = _reference(tiny_model)
    names = sorted(reference)
    out = load_model(tiny_model, policy, tensors=names)
    assert set(out) == set(names)
    for n in names:
        assert torch.equal(out[n], reference[n]), n
    shard = tiny_model / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="model-00001"):
        load_model(tiny_model, policy, tensors=names)


def test_unknown_tensor(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    with pytest.raises(MalformedArtifactError, match="not in the signed model"):
        load_model(tiny_model, policy, tensors=["nope"])


def test_plain_oms_bundle_partial_load_hashes_whole_shard(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir, tensor_hash=None)
    out = load_model(tiny_model, policy, tensors=["layers.0.bias"])
    assert torch.equal(out["layers.0.bias"], _reference(tiny_model)["layers.0.bias"])
    shard = tiny_model / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # a byte of another tensor of the same shard: the whole shard is refused
    shard.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="model-00001-of-00002"):
        load_model(tiny_model, policy, tensors=["layers.0.bias"])


def test_single_shard_load_and_open(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    shard = tiny_model / "model-00002-of-00002.safetensors"
    ref = _reference(tiny_model)
    loaded = load_model(shard, policy)
    assert set(loaded) == {"layers.1.weight", "layers.1.bias", "layers.1.ids"}
    with open_model(shard, policy) as f:
        assert f.keys() == sorted(loaded)
        assert f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_tensor("layers.1.weight"), ref["layers.1.weight"])
        sl = f.get_slice("layers.1.weight")
        assert sl.get_shape() == [8, 16] and sl.get_dtype() == "F32"
        assert torch.equal(sl[2:4], ref["layers.1.weight"][2:4])
    with open_model(tiny_model, policy) as f:
        assert len(f.keys()) == 6
        assert torch.equal(f.get_tensor("layers.0.ids"), ref["layers.0.ids"])


def test_open_refuses_tampered_shard_before_any_tensor(tiny_model: Path, key_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from modelsec.verifier import _shard_buffers

    built: list[str] = []
    original = _shard_buffers.tensor_from
    monkeypatch.setattr(_shard_buffers, "tensor_from", lambda *a: built.append(a[3]) or original(*a))
    policy = _sign(tiny_model, key_dir)
    shard = tiny_model / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[200] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(VerificationError):
        open_model(shard, policy)
    with pytest.raises(VerificationError):
        load_model(tiny_model, policy)
    data[200] ^= 1
    data[-1] ^= 1  # now a tensor byte instead of a header byte
    shard.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError):
        open_model(shard, policy)
    with pytest.raises(DigestMismatchError):
        load_model(tiny_model, policy)
    assert built == []


def test_toctou_modification_after_load_does_not_reach_tensors(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    loaded = load_model(tiny_model, policy)
    snapshot = {k: v.clone() for k, v in loaded.items()}
    for shard in tiny_model.glob("*.safetensors"):
        data = bytearray(shard.read_bytes())
        n = int.from_bytes(data[:8], "little")
        for i in range(8 + n, len(data)):
            data[i] ^= 0xFF
        with open(shard, "r+b") as f:  # in place, as an attacker with write access would
            f.write(bytes(data))
    assert _equal(loaded, snapshot)


def test_toctou_concurrent_writer_never_yields_modified_bytes(tmp_path: Path, key_dir: Path) -> None:
    m = tmp_path / "m"
    m.mkdir()
    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal((256, 1024)).astype(np.float32)}, str(m / "model.safetensors"))
    policy = _sign(m, key_dir)
    good = _reference(m)["w"].clone()  # safetensors' own tensors are mmap views: they would change too
    shard = m / "model.safetensors"
    original = shard.read_bytes()
    stop = threading.Event()

    def writer() -> None:
        flipped = bytearray(original)
        flipped[-4096:] = bytes(b ^ 0x55 for b in flipped[-4096:])
        with open(shard, "r+b") as f:
            while not stop.is_set():
                f.seek(0)
                f.write(flipped)
                f.flush()
                f.seek(0)
                f.write(original)
                f.flush()

    t = threading.Thread(target=writer)
    t.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        for _ in range(30):
            try:
                w = load_model(m, policy)["w"]
            except VerificationError:
                outcomes["refused"] += 1
                continue
            assert torch.equal(w, good)  # never the modified bytes
            outcomes["ok"] += 1
    finally:
        stop.set()
        t.join()
    # Once the writer is gone, a load gives the signed bytes (whatever the race above yielded).
    assert torch.equal(load_model(m, policy)["w"], good), outcomes


def test_remote_code_and_pickle_refused_by_loader(tiny_model: Path, key_dir: Path) -> None:
    (tiny_model / "modeling_x.py").write_text("raise SystemExit('imported!')\n")
    policy = _sign(tiny_model, key_dir)
    with pytest.raises(PolicyViolationError, match=r"modeling_x\.py"):
        load_model(tiny_model, policy)
    (tiny_model / "modeling_x.py").unlink()
    (tiny_model / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    policy = _sign(tiny_model, key_dir, force=True)
    with pytest.raises(PolicyViolationError, match="pickle"):
        load_model(tiny_model, policy)


def _write_policy(tmp_path: Path, key_dir: Path, body: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(body.replace("KEYS", str(key_dir)))
    return p


GOOD = """
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: local
    match: ["file://ROOT/**"]
    keys:
      - {path: KEYS/ecdsa-p256.pub.pem, name: ci, roles: [weights]}
      - KEYS/sm2.pub.pem
    requireAlgorithms: [ecdsa-p256]
noMatch: deny
"""


def test_policy_file_and_environment(tiny_model: Path, key_dir: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _sign(tiny_model, key_dir)
    p = _write_policy(tmp_path, key_dir, GOOD.replace("ROOT", os.path.realpath(tiny_model.parent)))
    ps = PolicySet.from_file(p)
    assert admit_model(tiny_model, ps).policy.require_algorithms == {SignatureAlgorithm.ECDSA_P256}
    assert load_model(tiny_model, ps)
    monkeypatch.setenv("MODELSEC_POLICY", str(p))
    assert load_model(tiny_model)  # policy from the environment
    with pytest.raises(PolicyViolationError, match="noMatch"):
        admit(PolicySet.from_file(p), "oci://elsewhere/model")


@pytest.mark.parametrize(
    ("mutation", "match"),
    [
        (lambda s: s.replace("kind: ModelPolicy", "kind: Other"), "kind"),
        (lambda s: s.replace("apiVersion: modelsec.dev/v1alpha1", "apiVersion: v2"), "apiVersion"),
        (lambda s: s.replace("noMatch: deny", "noMatch: allow"), "noMatch"),
        (lambda s: s.replace("    requireAlgorithms", "    requireAlgorithmz"), "unknown field"),
        (lambda s: s.replace("[ecdsa-p256]", "[rsa]"), "requireAlgorithms"),
        (lambda s: s.replace("roles: [weights]", "roles: [admin]"), "roles"),
        (lambda s: s.replace("name: local", "name: local\n    name: again"), "duplicate"),
        (lambda s: s.replace("ecdsa-p256.pub.pem, name", "missing.pem, name"), "missing.pem"),
        (lambda s: s.replace("kind: ModelPolicy", "kind: [ModelPolicy"), "YAML"),
    ],
)
def test_policy_file_errors_name_the_field(mutation, match, key_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from modelsec.errors import Error

    p = _write_policy(tmp_path, key_dir, mutation(GOOD.replace("ROOT", "/x")))
    with pytest.raises(Error, match=match):
        PolicySet.from_file(p)


def test_no_policy_at_all(tiny_model: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("MODELSEC_POLICY", raising=False)
    with pytest.raises(PolicyError, match="MODELSEC_POLICY"):
        load_model(tiny_model)


def test_untrusted_key_loads_nothing(tiny_model: Path, key_dir: Path) -> None:
    sign_model(tiny_model, [load_private_key_file(key_dir / "other.key.pem")])
    with pytest.raises(SignatureError):
        load_model(tiny_model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]))


@pytest.mark.gpu
def test_cuda_load_equals_cpu(tiny_model: Path, key_dir: Path) -> None:
    policy = _sign(tiny_model, key_dir)
    cpu = load_model(tiny_model, policy)
    gpu = load_model(tiny_model, policy, device="cuda:0")
    assert all(v.device.type == "cuda" for v in gpu.values())
    assert _equal(cpu, {k: v.cpu() for k, v in gpu.items()})


def test_sm3_only_policy_skips_sha256_but_still_refuses_tampering(tiny_model: Path, key_dir: Path) -> None:
    import dataclasses

    from modelsec.algorithms import HashAlgorithm
    from modelsec.verifier import verify_signatures

    sign_model(tiny_model, [load_private_key_file(key_dir / "sm2.key.pem")])
    policy = dataclasses.replace(
        Policy.from_key_files([key_dir / "sm2.pub.pem"]), check_hashes=frozenset({HashAlgorithm.SM3})
    )
    assert verify_signatures(tiny_model, policy).file_hashes == (HashAlgorithm.SM3,)
    assert _equal(load_model(tiny_model, policy), _reference(tiny_model))
    config = tiny_model / "config.json"
    config.write_text(config.read_text().replace("16", "17"))
    with pytest.raises(DigestMismatchError, match=r"config\.json: expected sm3 digest"):
        load_model(tiny_model, policy)


def test_a_symlinked_or_missing_shard_is_a_modelsec_error(tiny_model: Path, key_dir: Path) -> None:
    """load_model on one shard path: a symlink or a missing file is refused with a modelsec error, as
    verify_model does, never a raw OSError."""
    sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    link = tiny_model.parent / "link.safetensors"
    os.symlink(tiny_model / "model-00001-of-00002.safetensors", link)
    with pytest.raises(PolicyViolationError, match="symlink"):
        load_model(link, policy)
    with pytest.raises(MalformedArtifactError, match=r"cannot (open|read)"):
        load_model(tiny_model / "missing.safetensors", policy)


def test_each_side_file_is_read_and_parsed_once_per_load(
    tiny_model: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The side files are checked while the shards are read; the final check with the shards' headers reuses
    what that read and parsed (the index's weight map) instead of reading the index again."""
    from modelsec.verifier import side_files

    policy = _sign(tiny_model, key_dir)
    reads: list[str] = []
    real = side_files.read_verified_side_file

    def counting(root_fd, name, expected, limits, model):  # type: ignore[no-untyped-def]
        reads.append(name)
        return real(root_fd, name, expected, limits, model)

    monkeypatch.setattr(side_files, "read_verified_side_file", counting)
    assert _equal(load_model(tiny_model, policy), _reference(tiny_model))
    assert sorted(reads) == sorted(p.name for p in tiny_model.glob("*.json"))


def test_the_loader_refuses_an_index_naming_a_tensor_its_shard_lacks(tiny_model: Path, key_dir: Path) -> None:
    """The index's parsed map, reused from the check made while the shards were read, is still held against
    every shard's header."""
    import json

    index = tiny_model / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["ghost"] = "model-00002-of-00002.safetensors"
    index.write_text(json.dumps(doc))
    policy = _sign(tiny_model, key_dir, refuse_unverifiable=False)
    with pytest.raises(
        MalformedArtifactError,
        match=r"model\.safetensors\.index\.json: weight_map names `ghost`, which "
        r"'model-00002-of-00002\.safetensors' does not hold",
    ):
        load_model(tiny_model, policy)


def _tampered_index(model: Path) -> bytes:
    """The index rewritten to say what the signed one does not: a tensor no shard holds, a code reference."""
    import json

    doc = json.loads((model / "model.safetensors.index.json").read_text())
    doc["weight_map"]["ghost"] = "model-00002-of-00002.safetensors"
    doc["auto_map"] = {"AutoModel": "evil.Model"}
    return json.dumps(doc).encode()


def test_an_index_changed_after_it_was_hashed_is_refused_before_its_map_is_used(
    tiny_model: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The map the loader checks is decoded from bytes re-hashed against the signed digest: an index swapped
    between the hashing pass and the check is a digest mismatch naming it, not a map taken from the swap."""
    from modelsec.verifier import side_files

    policy = _sign(tiny_model, key_dir)
    index = tiny_model / "model.safetensors.index.json"
    tampered = _tampered_index(tiny_model)
    real = side_files.read_verified_side_file

    def swap_then_read(root_fd, name, expected, limits, model):  # type: ignore[no-untyped-def]
        if name == index.name:
            index.write_bytes(tampered)
        return real(root_fd, name, expected, limits, model)

    monkeypatch.setattr(side_files, "read_verified_side_file", swap_then_read)
    with pytest.raises(DigestMismatchError) as refused:
        load_model(tiny_model, policy)
    assert refused.value.path.endswith("/model.safetensors.index.json")


def test_an_index_changed_after_its_check_is_never_read_again(
    tiny_model: Path, key_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final check (with the shards' headers) holds the map decoded from the verified bytes against the
    headers; an index rewritten after that first check is not read, so nothing from it is used (CHANGELOG:
    issue 32 gives up noticing such a change, not checking what is used)."""
    from modelsec.verifier import loader, side_files

    policy = _sign(tiny_model, key_dir)
    index = tiny_model / "model.safetensors.index.json"
    tampered = _tampered_index(tiny_model)
    reads: list[str] = []
    real_read, real_check = side_files.read_verified_side_file, loader.check_digests
    checks = 0

    def counting(root_fd, name, expected, limits, model):  # type: ignore[no-untyped-def]
        reads.append(name)
        return real_read(root_fd, name, expected, limits, model)

    def swap_after_first_check(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal checks
        checks += 1
        if checks == 2:  # the side files were checked while the shards were read
            index.write_bytes(tampered)
            reads.clear()
        return real_check(*args, **kwargs)

    monkeypatch.setattr(side_files, "read_verified_side_file", counting)
    monkeypatch.setattr(loader, "check_digests", swap_after_first_check)
    assert _equal(load_model(tiny_model, policy), _reference(tiny_model))
    assert checks == 2
    assert reads == []


@pytest.mark.parametrize("name", ["MODEL.SAFETENSORS.INDEX.JSON", "model.safetensors.index.json"])
def test_an_index_of_any_spelling_is_held_against_the_shards_headers(
    tiny_model: Path, key_dir: Path, name: str
) -> None:
    """Whether the index is a `*.json` side file or only named like an index, the map read while the shards
    were still being read is checked against their headers in the final check."""
    index = tiny_model / "model.safetensors.index.json"
    tampered = _tampered_index(tiny_model).replace(b'"auto_map"', b'"not_code"')
    index.unlink()
    (tiny_model / name).write_bytes(tampered)
    policy = _sign(tiny_model, key_dir, refuse_unverifiable=False)
    with pytest.raises(
        MalformedArtifactError,
        match=rf"{re.escape(name)}: weight_map names `ghost`, which 'model-00002-of-00002\.safetensors' "
        "does not hold",
    ):
        load_model(tiny_model, policy)
