"""Registry transfers (issue 32.3): parallel layers, chunked uploads, hashes on the fly, bounded retries.

Against the session registry (distribution 2.8, TLS + htpasswd), reached through `tests.support.fault_proxy`
(a real TLS proxy on loopback) where a test needs the registry to fail or needs to see the requests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelsec.attestations.bundle import parse_bundle, sign_statement
from modelsec.attestations.predicates.oms import manifest_statement, parse_manifest
from modelsec.attestations.statement import parse_statement
from modelsec.distribution import push_pull
from modelsec.distribution.push_pull import pull_model, push_model
from modelsec.errors import BackendUnavailableError, DigestMismatchError, RegistryUnreachableError
from modelsec.policy import Policy
from modelsec.registry.client import (
    MANIFEST_MEDIA_TYPE,
    RegistryClient,
    RegistryOptions,
    canonical_json,
    descriptor,
)
from modelsec.registry.referrers import attach_bundle
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier import files as files_module
from modelsec.verifier import verify_model
from tests.support.fault_proxy import FaultProxy, fault_proxy
from tests.support.oci import PASSWORD, USER, Registry

pytestmark = pytest.mark.integration

CHUNK = 64 * 2**10  # small chunks, so the test's 160 KiB shards are uploaded in PATCHes


@pytest.fixture
def proxy(registry: Registry, tls: dict[str, Path]) -> Iterator[FaultProxy]:
    with fault_proxy(registry.address, registry.ca, tls["server"], tls["server_key"]) as running:
        yield running


def _options(tls: dict[str, Path], **extra: object) -> RegistryOptions:
    return RegistryOptions(
        ca_file=tls["ca"], username=USER, password=PASSWORD, timeout=10, chunk_bytes=CHUNK, **extra
    )


@pytest.fixture
def policy(key_dir: Path) -> Policy:
    return Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])


def _model(root: Path, key_dir: Path, seed: int, shards: int = 3) -> Path:
    """`shards` safetensors shards of 160 KiB (chunked at `CHUNK`) and a small config (monolithic), signed."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    for i in range(shards):
        save_file(
            {f"w{i}": rng.standard_normal((160, 256)).astype(np.float32)}, str(root / f"s{i}.safetensors")
        )
    (root / "config.json").write_text('{"model_type": "transfer-test"}')
    sign_model(root, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return root


def _push(model: Path, key_dir: Path, address: str, repo: str, options: RegistryOptions, policy: Policy):
    binder = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    return push_model(model, f"oci://{address}/{repo}:v1", policy, binder, options=options)


def _nothing_landed(dest: Path) -> None:
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".modelsec-pull-")]


def _uploads(proxy: FaultProxy) -> dict[str, list[tuple[str, int, str]]]:
    """Per upload session (its UUID): `(method, body bytes, Content-Range)` of each request, in order."""
    out: dict[str, list[tuple[str, int, str]]] = {}
    for seen in proxy.seen:
        match = re.search(r"/blobs/uploads/([0-9a-f-]{36})", seen.path)
        if match:
            out.setdefault(match.group(1), []).append(
                (seen.method, seen.body_bytes, seen.headers.get("Content-Range", ""))
            )
    return out


@pytest.mark.slow
def test_multi_layer_round_trip_uploads_large_layers_in_chunks_and_moves_layers_in_parallel(
    tmp_path: Path, key_dir: Path, proxy: FaultProxy, tls: dict[str, Path], policy: Policy
) -> None:
    model = _model(tmp_path / "m", key_dir, seed=32)
    options = _options(tls, transfers=3)
    proxy.delay = 0.05  # each blob request is held, so the layers' transfers overlap when they run together
    pushed = _push(model, key_dir, proxy.address, "transfer/round", options, policy)
    assert pushed.layers == 4  # three shards and config.json (model.sig is a referrer)

    # Each shard (160 KiB + header) went in ceil(size / CHUNK) PATCHes with contiguous Content-Ranges,
    # then one empty PUT with its digest; the small files in one PUT with the body (monolithic).
    sizes = sorted(p.stat().st_size for p in model.glob("s*.safetensors"))
    chunked = []
    monolithic = 0
    for steps in _uploads(proxy).values():
        patches = [s for s in steps if s[0] == "PATCH"]
        if not patches:
            assert [s[0] for s in steps] == ["PUT"] and steps[0][1] <= CHUNK
            monolithic += 1
            continue
        assert steps[-1][0] == "PUT" and steps[-1][1] == 0
        offset = 0
        for _, length, content_range in patches:
            assert content_range == f"{offset}-{offset + length - 1}" and length <= CHUNK
            offset += length
        chunked.append(offset)
    assert sorted(chunked) == sizes and all(len(range(0, s, CHUNK)) >= 3 for s in sizes)
    assert monolithic >= 2  # config.json and the ModelPack config (referrer bundles: their own uploads too)
    assert 2 <= proxy.peak <= 3  # several layers at once, never more than `transfers`

    proxy.reset()
    dest = tmp_path / "pulled"
    result = pull_model(f"oci://{proxy.address}/transfer/round:v1", dest, policy, options=options)
    assert result.root_digest == pushed.root_digest and result.files == 4
    for path in model.iterdir():
        if path.name != "model.sig":
            assert (dest / path.name).read_bytes() == path.read_bytes()
    blob_gets = [s for s in proxy.seen if s.method == "GET" and "/blobs/sha256:" in s.path]
    assert len(blob_gets) >= 4 and 2 <= proxy.peak <= 3
    # each blob was fetched once: hashed while written, never read back from the registry
    assert len({s.path for s in blob_gets}) == len(blob_gets)


def test_tampered_layer_is_refused_and_nothing_lands_while_other_layers_download(
    tmp_path: Path, key_dir: Path, registry: Registry, tls: dict[str, Path], policy: Policy
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    model = _model(tmp_path / "m", key_dir, seed=33, shards=4)
    pushed = _push(model, key_dir, registry.address, "transfer/tampered", options, policy)
    shard = model / "s2.safetensors"
    digest = "sha256:" + hashlib.sha256(shard.read_bytes()).hexdigest()
    blob = registry.blob_path(digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    dest = tmp_path / "pulled"
    with pytest.raises(DigestMismatchError) as refused:
        pull_model(f"oci://{registry.address}/transfer/tampered:v1", dest, policy, options=options)
    assert refused.value.expected == digest and "s2.safetensors" in refused.value.path
    assert refused.value.actual == "sha256:" + hashlib.sha256(bytes(data)).hexdigest()
    _nothing_landed(dest)
    assert pushed.layers == 5


def test_transient_failures_of_idempotent_requests_and_uploads_are_retried(
    tmp_path: Path, key_dir: Path, proxy: FaultProxy, tls: dict[str, Path], policy: Policy
) -> None:
    model = _model(tmp_path / "m", key_dir, seed=34, shards=2)
    options = _options(tls, transfers=2)
    proxy.fail("HEAD", r"/blobs/sha256:", "drop", 1)  # the connection closed without an answer
    proxy.fail("PATCH", r"/blobs/uploads/", "503", 1)  # a chunk refused: resumed where the registry says
    proxy.fail("POST", r"/blobs/uploads/", "drop", 1)  # an upload never started: started again
    pushed = _push(model, key_dir, proxy.address, "transfer/retry", options, policy)
    outcomes = [(s.method, s.outcome) for s in proxy.seen]
    for fault in (("HEAD", "drop"), ("PATCH", "503"), ("POST", "drop")):
        assert fault in outcomes

    proxy.reset()
    shard = "sha256:" + hashlib.sha256((model / "s1.safetensors").read_bytes()).hexdigest()
    proxy.fail("GET", re.escape(f"/blobs/{shard}"), "503", 1)
    proxy.fail("GET", re.escape(f"/blobs/{shard}"), "cut", 1)  # body cut half-way: resumed from there
    proxy.fail("GET", r"/manifests/", "drop", 1)
    proxy.fail("GET", r"/manifests/", "cut", 1)  # a manifest's body cut: read again
    dest = tmp_path / "pulled"
    result = pull_model(f"oci://{proxy.address}/transfer/retry:v1", dest, policy, options=options)
    assert result.root_digest == pushed.root_digest
    shard_gets = [s for s in proxy.seen if shard in s.path]
    assert [s.outcome for s in shard_gets] == ["503", "cut", "forwarded"]
    assert [s.outcome for s in proxy.seen if "/manifests/" in s.path][:3] == ["drop", "cut", "forwarded"]
    for path in model.glob("s*.safetensors"):
        assert (dest / path.name).read_bytes() == path.read_bytes()


@pytest.mark.slow
def test_retries_are_bounded_and_the_last_error_names_registry_and_blob(
    tmp_path: Path, key_dir: Path, proxy: FaultProxy, tls: dict[str, Path], policy: Policy
) -> None:
    model = _model(tmp_path / "m", key_dir, seed=35, shards=1)
    options = _options(tls, retries=2, transfers=1)
    _push(model, key_dir, proxy.address, "transfer/bounded", options, policy)
    digest = "sha256:" + hashlib.sha256((model / "s0.safetensors").read_bytes()).hexdigest()
    proxy.reset()
    proxy.fail("GET", re.escape(f"/blobs/{digest}"), "503", 10)
    dest = tmp_path / "pulled"
    with pytest.raises(BackendUnavailableError) as refused:
        pull_model(f"oci://{proxy.address}/transfer/bounded:v1", dest, policy, options=options)
    assert proxy.address in str(refused.value) and digest in str(refused.value)
    assert "HTTP 503" in str(refused.value)
    assert [s.outcome for s in proxy.seen if digest in s.path] == ["503"] * 3  # the first and two retries
    _nothing_landed(dest)

    proxy.reset()
    proxy.fail("GET", re.escape(f"/blobs/{digest}"), "drop", 10)
    with pytest.raises(RegistryUnreachableError) as lost:
        pull_model(f"oci://{proxy.address}/transfer/bounded:v1", dest, policy, options=options)
    assert lost.value.registry == proxy.address and digest in lost.value.what
    assert lost.value.problem == "connection"
    assert len([s for s in proxy.seen if digest in s.path]) == 3
    _nothing_landed(dest)


def test_a_manifest_put_is_not_sent_twice(tmp_path: Path, proxy: FaultProxy, tls: dict[str, Path]) -> None:
    client = RegistryClient(proxy.address, _options(tls))
    manifest = canonical_json({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "layers": []})
    proxy.fail("PUT", r"/manifests/", "503", 1)
    with pytest.raises(BackendUnavailableError, match="HTTP 503") as refused:
        client.put_manifest("transfer/once", "v1", manifest, MANIFEST_MEDIA_TYPE)
    assert proxy.address in str(refused.value)
    assert [(s.method, s.outcome) for s in proxy.seen if "/manifests/" in s.path] == [("PUT", "503")]
    proxy.fail("DELETE", r"/manifests/", "drop", 1)
    with pytest.raises(RegistryUnreachableError):
        client.request("DELETE", "transfer/once/manifests/sha256:" + "0" * 64)
    assert [s.method for s in proxy.seen if "/manifests/" in s.path] == ["PUT", "DELETE"]


def test_a_file_changed_since_it_was_hashed_is_not_committed(
    tmp_path: Path, registry: Registry, tls: dict[str, Path]
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    client = RegistryClient(registry.address, options)
    for size in (1000, 3 * CHUNK + 5):  # monolithic and chunked
        path = tmp_path / f"f{size}"
        path.write_bytes(np.random.default_rng(size).bytes(size))
        signed = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        changed = bytearray(path.read_bytes())
        changed[-1] ^= 1
        path.write_bytes(bytes(changed))
        with pytest.raises(DigestMismatchError) as refused:
            client.push_file("transfer/changed", path, size, digest=signed)
        assert (refused.value.path, refused.value.expected) == (str(path), signed)
        assert refused.value.actual == "sha256:" + hashlib.sha256(bytes(changed)).hexdigest()
        assert not client.blob_exists("transfer/changed", signed)
        assert not client.blob_exists("transfer/changed", refused.value.actual)
        # without an expected digest the file is hashed as it is sent, and that digest is committed
        assert client.push_file("transfer/changed", path, size) == refused.value.actual
        assert client.blob_exists("transfer/changed", refused.value.actual)


def test_a_download_cut_mid_body_resumes_at_the_bytes_written(
    tmp_path: Path, proxy: FaultProxy, tls: dict[str, Path]
) -> None:
    client = RegistryClient(proxy.address, _options(tls))
    data = np.random.default_rng(36).bytes(3 * 2**20 + 7)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    client.put_blob("transfer/resume", digest, len(data), data)
    proxy.reset()
    proxy.fail("GET", re.escape(f"/blobs/{digest}"), "cut", 1)
    with open(tmp_path / "blob", "wb") as sink:
        client.stream_blob("transfer/resume", digest, len(data), sink, what="resume")
    assert (tmp_path / "blob").read_bytes() == data
    gets = [s for s in proxy.seen if digest in s.path]
    assert [s.outcome for s in gets] == ["cut", "forwarded"]
    start = int(gets[1].headers["Range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= len(data) // 2  # only the bytes not yet written were sent again


def test_an_openssl_error_left_in_the_calling_thread_does_not_fail_a_push(
    tmp_path: Path, key_dir: Path, registry: Registry, policy: Policy
) -> None:
    import _ssl
    import ctypes

    libcrypto = ctypes.CDLL(_ssl.__file__)  # the libcrypto Python's ssl uses, through _ssl's dependencies
    engine_by_id, peek = getattr(libcrypto, "ENGINE_by_id", None), libcrypto.ERR_peek_error
    if engine_by_id is None:
        pytest.skip("this libcrypto has no ENGINE API")
    engine_by_id.restype, engine_by_id.argtypes, peek.restype = (
        ctypes.c_void_p,
        [ctypes.c_char_p],
        ctypes.c_ulong,
    )
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    model = _model(tmp_path / "m", key_dir, seed=37)
    # What SoftHSM2's C_Initialize does when a PKCS#11 key is loaded in-process: an ENGINE lookup that
    # fails and leaves "no such engine" in this thread's OpenSSL error queue. The layers then move on
    # worker threads, and this thread's next requests reuse the connections they opened.
    assert engine_by_id(b"modelsec-no-such-engine") is None and peek() != 0
    pushed = _push(model, key_dir, registry.address, "transfer/stale", options, policy)
    dest = tmp_path / "pulled"
    assert engine_by_id(b"modelsec-no-such-engine") is None and peek() != 0
    pull_model(
        f"oci://{registry.address}/transfer/stale@{pushed.manifest_digest}", dest, policy, options=options
    )
    assert (dest / "s0.safetensors").read_bytes() == (model / "s0.safetensors").read_bytes()


# Pull reads each byte once (issue 32.3): the layer's digests are computed as it is written and handed to
# the verifier, bound to the staged file's identity.


def _flip_in_place(path: Path) -> None:
    """Change one byte of a staged tensor in place (same inode and size) and set its mtime back."""
    time.sleep(0.05)  # past the file system clock tick (FileIdentity: a write in the same tick is unseen)
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(before.st_size - 1)
        last = f.read(1)
        f.seek(before.st_size - 1)
        f.write(bytes([last[0] ^ 1]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _files_the_verifier_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that grows by the names of every file the verifier hashes from disk from now on."""
    hashed: list[str] = []
    engine = files_module.hash_files

    def spy(root_fd: int, names: list[str], **kw: object) -> object:
        hashed.extend(names)
        return engine(root_fd, names, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(files_module, "hash_files", spy)
    return hashed


@pytest.mark.parametrize("sm2", [False, True], ids=["ecdsa", "ecdsa+sm2"])
def test_pull_verifies_the_digests_taken_as_written_and_reads_no_layer_again(
    tmp_path: Path, key_dir: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch, sm2: bool
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    model = _model(tmp_path / "m", key_dir, seed=38 + sm2)
    keys = [key_dir / "ecdsa-p256.pub.pem"]
    if sm2:  # a second bundle with SM3 file digests: streamed as well (the SHA-256 is the layer digest)
        sign_model(model, [load_private_key_file(key_dir / "sm2.key.pem")])
        keys.append(key_dir / "sm2.pub.pem")
    policy = Policy.from_key_files(keys)
    pushed = _push(model, key_dir, registry.address, f"transfer/once{int(sm2)}", options, policy)
    hashed_by_verifier = _files_the_verifier_hashes(monkeypatch)
    dest = tmp_path / "pulled"
    result = pull_model(f"oci://{registry.address}/transfer/once{int(sm2)}:v1", dest, policy, options=options)
    assert result.root_digest == pushed.root_digest and result.files == 4
    assert len(result.signers) == len(keys)  # each bundle verified
    assert hashed_by_verifier == []  # every layer's digests (file, header, tensors) came from the download
    for path in model.glob("s*.safetensors"):
        assert (dest / path.name).read_bytes() == path.read_bytes()
    # The same directory verified from disk: the same root digest, and every file hashed there.
    assert verify_model(dest, policy).root_digest == pushed.root_digest
    assert sorted(hashed_by_verifier) == sorted(
        p.name for p in model.iterdir() if not p.name.endswith(".sig")
    )


def test_a_download_started_again_is_hashed_from_its_first_byte_again(
    tmp_path: Path,
    key_dir: Path,
    proxy: FaultProxy,
    tls: dict[str, Path],
    policy: Policy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tmp_path / "m"
    model.mkdir()
    # Over two 1 MiB reads: the cut comes after some bytes were written (and hashed), so the restart must
    # truncate the file and begin hashing again.
    weights = np.random.default_rng(42).standard_normal((768, 1024)).astype(np.float32)
    save_file({"w": weights}, str(model / "s0.safetensors"))
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    options = RegistryOptions(ca_file=tls["ca"], username=USER, password=PASSWORD, timeout=10, transfers=1)
    pushed = _push(model, key_dir, proxy.address, "transfer/restart", options, policy)
    shard = "sha256:" + hashlib.sha256((model / "s0.safetensors").read_bytes()).hexdigest()
    proxy.reset()
    proxy.fail("GET", re.escape(f"/blobs/{shard}"), "cut", 1)  # half the body written and hashed
    proxy.fail("GET", re.escape(f"/blobs/{shard}"), "no-range", 1)  # then the whole blob again, from byte 0
    hashed_by_verifier = _files_the_verifier_hashes(monkeypatch)
    dest = tmp_path / "pulled"
    result = pull_model(f"oci://{proxy.address}/transfer/restart:v1", dest, policy, options=options)
    assert [s.outcome for s in proxy.seen if shard in s.path] == ["cut", "no-range"]
    assert result.root_digest == pushed.root_digest
    assert (dest / "s0.safetensors").read_bytes() == (model / "s0.safetensors").read_bytes()
    # The restart began the per-tensor and header hashing again too: its digests were used, not re-read.
    assert hashed_by_verifier == []


@pytest.mark.parametrize("when", ["before verification", "after verification"])
def test_a_staged_file_changed_after_it_was_written_is_refused_and_nothing_lands(
    tmp_path: Path,
    key_dir: Path,
    registry: Registry,
    policy: Policy,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    model = _model(tmp_path / "m", key_dir, seed=39)
    pushed = _push(model, key_dir, registry.address, "transfer/staged", options, policy)
    verify = push_pull.verify_model
    tampered: list[Path] = []

    def tamper_around_verify(staging: Path, *args: object, **kw: object) -> object:
        shard = Path(staging) / "s1.safetensors"
        tampered.append(shard)
        if when == "before verification":
            _flip_in_place(shard)
        result = verify(staging, *args, **kw)  # type: ignore[arg-type]
        if when == "after verification":
            _flip_in_place(shard)
        return result

    monkeypatch.setattr(push_pull, "verify_model", tamper_around_verify)
    dest = tmp_path / "pulled"
    with pytest.raises(DigestMismatchError) as refused:
        pull_model(
            f"oci://{registry.address}/transfer/staged@{pushed.manifest_digest}",
            dest,
            policy,
            options=options,
        )
    assert tampered and refused.value.path == str(tampered[0])
    assert "file identity" in str(refused.value) and refused.value.expected != refused.value.actual
    _nothing_landed(dest)


def test_a_blob_tampered_in_its_header_is_refused_on_its_layer_digest(
    tmp_path: Path, key_dir: Path, registry: Registry, policy: Policy
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    model = _model(tmp_path / "m", key_dir, seed=40)
    _push(model, key_dir, registry.address, "transfer/header", options, policy)
    digest = "sha256:" + hashlib.sha256((model / "s0.safetensors").read_bytes()).hexdigest()
    blob = registry.blob_path(digest)
    data = bytearray(blob.read_bytes())
    data[:8] = (2**40).to_bytes(8, "little")  # a header length no parser accepts
    blob.write_bytes(bytes(data))
    dest = tmp_path / "pulled"
    with pytest.raises(DigestMismatchError) as refused:
        pull_model(f"oci://{registry.address}/transfer/header:v1", dest, policy, options=options)
    assert refused.value.expected == digest and refused.value.path.endswith("s0.safetensors")
    assert refused.value.actual == "sha256:" + hashlib.sha256(bytes(data)).hexdigest()
    _nothing_landed(dest)


def test_a_tensor_digest_the_signed_manifest_lists_otherwise_is_refused(
    tmp_path: Path, key_dir: Path, registry: Registry, policy: Policy
) -> None:
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, chunk_bytes=CHUNK)
    model = _model(tmp_path / "m", key_dir, seed=41)
    pushed = _push(model, key_dir, registry.address, "transfer/tensor", options, policy)
    # A trusted key signs a manifest whose file digests are right and one tensor digest is not.
    bundle = parse_bundle((model / "model.sig").read_bytes(), source="model.sig")
    signed = parse_manifest(parse_statement(bundle.envelope.payload, what="model.sig"), what="model.sig")
    entry = signed.tensors["s1.safetensors"]["w1"]
    wrong = bytes([entry.digest[0] ^ 1]) + entry.digest[1:]
    tensors = {**signed.tensors, "s1.safetensors": {"w1": dataclasses.replace(entry, digest=wrong)}}
    forged = sign_statement(
        manifest_statement(dataclasses.replace(signed, tensors=tensors)),
        load_private_key_file(key_dir / "ecdsa-p256.key.pem"),
    )
    client = RegistryClient(registry.address, options)
    manifest = client.get_manifest("transfer/tensor", pushed.manifest_digest)[0]
    subject = descriptor(MANIFEST_MEDIA_TYPE, manifest)
    client.delete_referrer("transfer/tensor", pushed.referrers[1], pushed.manifest_digest)
    attach_bundle(client, "transfer/tensor", subject, forged)
    dest = tmp_path / "pulled"
    with pytest.raises(DigestMismatchError) as refused:
        pull_model(
            f"oci://{registry.address}/transfer/tensor@{pushed.manifest_digest}",
            dest,
            policy,
            options=options,
        )
    assert refused.value.path.endswith("s1.safetensors:`w1`") and refused.value.algorithm == "blake3"
    assert (refused.value.expected, refused.value.actual) == (wrong.hex(), entry.digest.hex())
    _nothing_landed(dest)
