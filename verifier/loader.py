"""Load-time verification: tensors reach device memory only after their bytes were verified.

Invariant (DESIGN.md decision 5, "hash exactly the bytes you load"): every tensor returned here is built
from a *private* buffer that modelsec filled itself from a descriptor opened without following links, that
was hashed while it was filled, and whose digests matched the signed manifest before the first tensor was
built. The path is never re-opened after hashing and nothing is memory-mapped, so a write to the file
after (or during) verification changes nothing that was returned: the load either returns the verified
bytes or is refused.

* Whole shards: the buffer is the whole file (pinned host memory when the target is CUDA; otherwise fresh
  private memory in transparent huge pages where the kernel has them, small shards carved from shared
  mappings). A reader thread maps fresh memory and fills it in `Limits.hash_chunk_bytes` steps while the
  caller's thread hashes what has arrived, so allocating, reading and hashing overlap; a shard of fewer
  than 8 chunks is filled first and hashed after, without a thread. Shards are processed two at a time
  (one per core: two reader threads each take the next shard, `_shard_buffers.read_shards`); side files are
  compared and interpreted meanwhile.
* Partial loads (`tensors=[...]`) with per-tensor digests in the signed manifest read only the needed byte
  ranges; the header's dtype, shape and offsets must equal the signed entry, and the range's digest must
  equal the signed tensor digest. Without per-tensor digests (a plain OMS bundle, e.g. from
  `model_signing`) the shard holding the tensor is verified whole.
* Tensors are views of the verified buffer (no copy) unless a tensor's offset is misaligned for its dtype
  (then it is copied once, still from the verified buffer), and are moved to `device` only at the end.

torch is imported only by the functions that build tensors (`modelsec.verifier` imports without it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import os
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.predicates.oms import TensorEntry
from modelsec.errors import (
    DigestMismatchError,
    MalformedArtifactError,
)
from modelsec.modelformat.hashing import FileDigests, hash_files, is_safetensors_name, new_hasher
from modelsec.modelformat.model_files import open_beneath
from modelsec.modelformat.safetensors_header import (
    SafetensorsHeader,
    read_header,
)
from modelsec.policy import Policy, PolicySet, model_uri
from modelsec.verifier import _shard_buffers as shard_io
from modelsec.verifier.admission import (
    ModelAdmission,
    admit_model,
    admit_opened,
    opened_model_uri,
    report_warnings,
)
from modelsec.verifier.audit import record_verified_model
from modelsec.verifier.pinning import pinned_root_digests
from modelsec.verifier.side_files import InterpretedSideFiles
from modelsec.verifier.verification import (
    INDEX_NAME,
    SignedModel,
    check_digests,
    check_file_set,
    open_model_path,
    precheck_file,
    read_verified_index,
    verify_files,
    verify_signatures,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "LoadedModel",
    "VerifiedSafeOpen",
    "load_model",
    "load_signed_model",
    "open_model",
    "resolve_policy",
]


def emit_receipt_for(
    admission: ModelAdmission,
    root_digest: str,
    model_name: str,
    files: Sequence[str],
    tensors: int,
    device: str,
    pins: Collection[str] | None,
) -> str | None:
    """`modelsec.verifier.receipts.emit_receipt_for`, importing that module only when a receipt is asked for.

    The receipt machinery (TPM access, the receipt store) is imported by the first load under a policy with
    `loadReceipt`, not by `from modelsec.verifier import load_model`.
    """
    if admission.policy.load_receipt is None:
        return None
    from modelsec.verifier import receipts

    return receipts.emit_receipt_for(admission, root_digest, model_name, files, tensors, device, pins)


def resolve_policy(model_path: Path, policy: Policy | PolicySet | ModelAdmission | None) -> Policy:
    """The `Policy` that verifies the bytes of `model_path` (`ModelAdmission.policy` of `admit_model`).

    For the checks made before the signatures are read (a single file's prechecks); the other matching
    policies are checked when the admission is passed to `verify_signatures`.

    Raises:
        PolicyError: No policy given and `$MODELSEC_POLICY` is unset or invalid.
        PolicyViolationError: No policy of the set matches `file://<real path>`.
    """
    return admit_model(model_path, policy).policy


def _split_path(model_path: Path) -> tuple[Path, str | None]:
    if model_path.is_dir() and not model_path.is_symlink():
        return model_path, None
    return model_path.parent, model_path.name


def _check_pins(model_path: Path, expected_digests: Collection[str] | None) -> None:
    """Refuse a malformed or contradictory pin before the model is opened.

    The pins that apply are chosen again from the opened descriptor (`_opened`): the path may name another
    folder by then.
    """
    model_dir = model_path if model_path.is_dir() else model_path.parent
    pinned_root_digests(model_uri(model_dir), expected_digests)


def _verify_whole_shards(
    signed: SignedModel, names: Sequence[str], policy: Policy, *, pinned: bool, whole_model: bool
) -> dict[str, shard_io.VerifiedShard]:
    """Read every named file once into private memory (shards) or hash it (side files), then compare."""
    # Whole files are loaded, so their file digests cover every byte: computing per-tensor digests too
    # would only repeat hash work over the same bytes.
    signed = dataclasses.replace(signed, tensor_hash=None)
    model, limits = str(signed.model_dir), policy.limits
    shards = [n for n in names if is_safetensors_name(n)]
    side_names = [n for n in names if not is_safetensors_name(n)]
    root_fd = signed.open_root()
    try:
        side: dict[str, FileDigests] = dict(
            hash_files(
                root_fd,
                side_names,
                algorithms=signed.file_hashes,
                tensor_hash=signed.tensor_hash,
                limits=limits,
                model=model,
            )
        )
        computed = dict(side)
        # The side files' digests are known: compare and interpret them (JSON parsing can take a noticeable
        # share of a load) while the shards are read and hashed, not after; the final check reuses what
        # this one read and parsed (the indexes are then checked against the shards' headers).
        interpreted = InterpretedSideFiles()
        read = shard_io.read_shards(
            root_fd,
            shards,
            signed,
            limits,
            pinned,
            model,
            workers=min(os.cpu_count() or 1, 2),
            meanwhile=lambda: check_digests(
                signed, side, policy, root_fd, whole_model=False, interpreted=interpreted
            ),
        )
        buffers: dict[str, Any] = {}
        for n in shards:
            computed[n], buffers[n] = read[n]
        check_digests(signed, computed, policy, root_fd, whole_model=whole_model, interpreted=interpreted)
    finally:
        os.close(root_fd)
    result = {}
    for n in shards:
        header = computed[n].header
        if header is None:  # every *.safetensors name is parsed by the engine; fail closed regardless
            raise MalformedArtifactError(f"{model}/{n}: no parsed header")
        result[n] = shard_io.VerifiedShard(n, buffers[n], header)
    return result


def _load_tensors_by_digest(
    signed: SignedModel,
    wanted: Mapping[str, tuple[str, TensorEntry]],
    policy: Policy,
    headers: dict[str, SafetensorsHeader] | None = None,
) -> dict[str, Any]:
    """Partial load with per-tensor digests: read only the needed ranges, compare each with the manifest.

    `headers` caches parsed headers across calls (`VerifiedSafeOpen` reads one tensor per call): a cached
    file was already checked against the signed file set, and its header is reused. That stays safe if the
    file changes afterwards: each tensor's signed dtype, shape and offsets are compared with the header and
    its bytes with the signed digest on every read.
    """
    model, limits = str(signed.model_dir), policy.limits
    assert_hash = signed.tensor_hash
    if assert_hash is None:  # callers only come here with an extension; fail closed regardless
        raise MalformedArtifactError(f"{model}: no per-tensor digests in the signed manifest")
    by_file: dict[str, list[str]] = {}
    for tname, (file, _) in wanted.items():
        by_file.setdefault(file, []).append(tname)
    cache = headers if headers is not None else {}
    unchecked = sorted(f for f in by_file if f not in cache)
    if unchecked:
        check_file_set(signed, policy, only=unchecked)
    out: dict[str, Any] = {}
    # Tensors are read and hashed on every core: preadv and the hashers release the GIL.
    workers = min(os.cpu_count() or 1, len(wanted))
    pool = (
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="modelsec-tensor") if workers > 1 else None
    )
    root_fd = signed.open_root()
    try:
        for file, tnames in by_file.items():
            what = f"{model}/{file}"
            fd = open_beneath(root_fd, file, what=model)
            try:
                header = cache.get(file)
                if header is None:
                    with os.fdopen(os.dup(fd), "rb") as f:
                        header, _ = read_header(f, os.fstat(fd).st_size, path=what, limits=limits)
                    cache[file] = header
                jobs = [(fd, t, wanted[t][1], header, assert_hash, what) for t in tnames]
                if pool is None or len(jobs) == 1:
                    built = [_verified_tensor(*j) for j in jobs]
                else:
                    futures = [pool.submit(_verified_tensor, *j) for j in jobs]
                    try:
                        built = [future.result() for future in futures]
                    finally:  # on the first refusal nothing more is read, and `fd` outlives every read
                        for future in futures:
                            future.cancel()
                        wait(futures)
                out.update(zip(tnames, built, strict=True))
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)
        if pool is not None:
            pool.shutdown(wait=True)
    return out


def _verified_tensor(
    fd: int, tname: str, entry: TensorEntry, header: SafetensorsHeader, algorithm: HashAlgorithm, what: str
) -> Any:
    """One tensor read into private memory, its signed facts and digest checked, built from those bytes."""
    try:
        info = header.tensor(tname)
    except KeyError:
        raise DigestMismatchError(
            f"{what}:`{tname}`", "present", "absent from the header", compared="tensor"
        ) from None
    signed_facts = (entry.dtype, entry.shape, entry.begin, entry.end)
    if (info.dtype, info.shape, info.begin, info.end) != signed_facts:
        raise DigestMismatchError(
            f"{what}:`{tname}`",
            f"{entry.dtype}{list(entry.shape)}@{entry.begin}-{entry.end}",
            f"{info.dtype}{list(info.shape)}@{info.begin}-{info.end}",
            compared="dtype/shape/offsets",
        )
    raw = shard_io.read_range(fd, header.data_start + info.begin, info.end - info.begin, what)
    h = new_hasher(algorithm)
    h.update(memoryview(raw.numpy()).cast("B") if raw.numel() else b"")
    digest = h.digest()
    if not hmac.compare_digest(digest, entry.digest):
        raise DigestMismatchError(
            f"{what}:`{tname}`", entry.digest.hex(), digest.hex(), algorithm=algorithm.value
        )
    return shard_io.tensor_from(raw, -info.begin, info, tname, what)


def _shards_for_without_digests(signed: SignedModel, tensors: Sequence[str], policy: Policy) -> list[str]:
    """Which shards hold `tensors` when the manifest has no per-tensor digests: from the signed index."""
    model = str(signed.model_dir)
    shard_names = [n for n in signed.manifest.names if is_safetensors_name(n)]
    if INDEX_NAME not in signed.manifest.names:
        return shard_names  # no index: verify every shard (still correct, only slower)
    root_fd = signed.open_root()
    try:
        index_digest = hash_files(
            root_fd,
            [INDEX_NAME],
            algorithms=signed.file_hashes,
            tensor_hash=None,
            limits=policy.limits,
            model=model,
        )
    finally:
        os.close(root_fd)
    weight_map = read_verified_index(signed, index_digest[INDEX_NAME], policy)
    files = []
    for t in tensors:
        target = weight_map.get(t)
        if target is None:
            raise MalformedArtifactError(f"{model}: tensor `{t}` is not in the signed model")
        files.append(target)
    return sorted(set(files))


def load_model(
    model_path: str | os.PathLike[str],
    policy: Policy | PolicySet | ModelAdmission | None = None,
    *,
    device: str = "cpu",
    tensors: Sequence[str] | None = None,
    bundles: Sequence[Path] | None = None,
    expected_digests: Collection[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Verify a model (or one shard, or some tensors) and return its tensors built from the verified bytes.

    What is verified before any tensor is built: the bundles' signatures with the policy's keys and the
    required algorithms; for a whole directory, the file set (nothing added, removed or renamed), every
    file's digests and the model root digest, `auto_map`/`*.py` (refused unless the policy allows remote
    code), pickle formats (refused), and the index (targets must be signed shards holding the tensors); for
    one shard, that shard's digests; for `tensors=[...]`, each tensor's dtype, shape, offsets and
    per-tensor digest (or its whole shard without per-tensor digests). Metadata never affects trust.

    Args:
        model_path: A model directory, or one `*.safetensors` shard inside it.
        policy: A `Policy`, a `PolicySet` (every policy matching `file://<real path>` must pass, a failure of
            one in `mode: warn` is issued as a `PolicyWarning` instead; `modelsec.verifier.admission`), an
            admission, or None for `$MODELSEC_POLICY`.
        device: `"cpu"` or `"cuda[:N]"`: verified bytes are staged in pinned host memory for CUDA and copied
            to the device only after verification.
        tensors: Only these tensor names (e.g. one pipeline stage); None for all.
        bundles: Explicit bundle paths; default names in the model directory otherwise.
        expected_digests: The model root digests (`sha256:<hex>`, as in the admission annotation) the
            signed model must have, checked right after the signatures and before any model file is
            opened. `$MODELSEC_MODEL_DIGEST` (a bare `sha256:<hex>` or the `modelsec.dev/models`
            annotation value; the entry naming `file://<real path of the model directory>` decides, else
            any) is always read as well, as `modelsec verify` and the runtime guard read it: when both are
            given both pin (the root must be one of each; an argument never widens or replaces the
            variable). None and the variable unset: no pin.

    Returns:
        Tensor name -> tensor on `device` (dtype and shape as in the safetensors header).

    Raises:
        SignatureError: No trusted or required signature.
        DigestMismatchError: A file, tensor or the root digest differs from the manifest, or the root
            digest is not pinned (`expected_digests`, `$MODELSEC_MODEL_DIGEST`); `compared` is
            `"root digest"` then and no model file was opened.
        FileSetMismatchError: Files added, removed or renamed.
        MalformedArtifactError: Malformed bundle, manifest, header or index; an unknown tensor name.
        PolicyViolationError: Pickle, remote code, symlinks; no policy matches.
        PolicyError: No usable policy; `expected_digests` or `$MODELSEC_MODEL_DIGEST` is malformed (the
            message names which), or the two pin no digest in common (nothing is read).
        BackendUnavailableError: torch is not installed, or `device` is a CUDA device this node lacks; or
            the policy requires a load receipt (`loadReceipt.required`) and the node's TPM cannot be reached
            (nothing is returned; `modelsec.verifier.receipts`).
        UnsupportedAlgorithmError: `device` is neither CPU nor CUDA.

    Example:
        >>> weights = load_model(Path("/models/llm"), device="cuda:0")  # doctest: +SKIP
    """
    model_path = Path(os.fspath(model_path))
    device = shard_io.check_device(device)
    with _opened(model_path, policy, bundles, expected_digests) as (
        signed,
        single,
        resolved,
        admission,
        pins,
    ):
        out = _load_selected(signed, single, resolved, device, tensors)
        entries = signed.tensor_entries()
        files = (
            sorted({entries[t][0] for t in out if t in entries})
            if entries
            else [single]
            if single is not None
            else [n for n in signed.manifest.names if is_safetensors_name(n)]
        )
        emit_receipt_for(admission, signed.root_digest, signed.model_dir.name, files, len(out), device, pins)
        return out


@contextlib.contextmanager
def _opened(
    model_path: Path,
    policy: Policy | PolicySet | ModelAdmission | None,
    bundles: Sequence[Path] | None,
    expected_digests: Collection[str] | None,
) -> Iterator[tuple[SignedModel, str | None, Policy, ModelAdmission, Collection[str] | None]]:
    """The model root opened once, its policy chosen from the descriptor, its signatures verified.

    Yields the signed model (its `root_fd` open for as long as the context lasts: every read goes through
    it), the single file's name or None, the policy that verifies the bytes, the admission and the pins.
    """
    _check_pins(model_path, expected_digests)
    root_fd, single, model_dir = open_model_path(model_path)
    try:
        pins = pinned_root_digests(opened_model_uri(model_dir, root_fd, None), expected_digests)
        admission = admit_opened(model_path, root_fd, single, policy)
        resolved = admission.policy
        if single is not None:
            precheck_file(model_dir / single, resolved, root_fd=root_fd)
        signed = verify_signatures(
            model_dir, admission, bundles=bundles, expected_digests=pins, root_fd=root_fd
        )
        report_warnings(signed.warnings)
        yield signed, single, resolved, admission, pins
    finally:
        os.close(root_fd)


def _load_selected(
    signed: SignedModel, single: str | None, resolved: Policy, device: str, tensors: Sequence[str] | None
) -> dict[str, Any]:
    model_dir = signed.model_dir
    pinned = device.startswith("cuda")
    model = str(model_dir)
    if tensors is not None:
        entries = signed.tensor_entries()
        if entries:
            unknown = [t for t in tensors if t not in entries]
            if unknown:
                raise MalformedArtifactError(f"{model}: tensor(s) {unknown} are not in the signed model")
            selected = {t: entries[t] for t in tensors}
            if single is not None and any(f != single for f, _ in selected.values()):
                raise MalformedArtifactError(f"{model}/{single}: does not hold all of {list(tensors)}")
            return shard_io.to_device(_load_tensors_by_digest(signed, selected, resolved), device)
        files = [single] if single is not None else _shards_for_without_digests(signed, tensors, resolved)
        names = check_file_set(signed, resolved, only=files)
        shards = _verify_whole_shards(signed, names, resolved, pinned=pinned, whole_model=False)
        out: dict[str, Any] = {}
        views: shard_io.TypedViews = {}
        for shard in shards.values():
            out.update(shard_io.tensors_of(shard, set(tensors) - set(out), f"{model}/{shard.name}", views))
        missing = [t for t in tensors if t not in out]
        if missing:
            raise MalformedArtifactError(f"{model}: tensor(s) {missing} are not in the signed model")
        return shard_io.to_device(out, device)
    return _load_whole(signed, single, resolved, device).tensors


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """Tensors built from verified bytes, with the identity they were verified under.

    Attributes:
        tensors: Tensor name -> tensor on the requested device.
        root_digest: The model root digest the verified bundles sign (the attestation subject).
        shards: The safetensors files the tensors came from, in manifest order.
    """

    tensors: dict[str, Any]
    root_digest: str
    shards: tuple[str, ...]


def _load_whole(signed: SignedModel, single: str | None, policy: Policy, device: str) -> LoadedModel:
    started = time.monotonic()
    model = str(signed.model_dir)
    names = check_file_set(signed, policy, only=[single] if single is not None else None)
    pinned = device.startswith("cuda")
    shards = _verify_whole_shards(signed, names, policy, pinned=pinned, whole_model=single is None)
    if single is None:
        record_verified_model(
            event="load",
            model=signed.model_dir,
            root_digest=signed.root_digest,
            bundles=signed.bundles,
            files=len(names),
            bytes_hashed=sum(int(s.buffer.numel()) for s in shards.values()),
            seconds=time.monotonic() - started,
        )
    result: dict[str, Any] = {}
    views: shard_io.TypedViews = {}  # shared by the shards carved from one mapping
    for shard in shards.values():
        for k, v in shard_io.tensors_of(shard, None, f"{model}/{shard.name}", views).items():
            if k in result:
                raise MalformedArtifactError(
                    f"{model}/{shard.name}: tensor `{k}` also appears in another shard"
                )
            result[k] = v
    return LoadedModel(shard_io.to_device(result, device), signed.root_digest, tuple(shards))


def load_signed_model(
    model_path: str | os.PathLike[str],
    policy: Policy | PolicySet | ModelAdmission | None = None,
    *,
    device: str = "cpu",
    bundles: Sequence[Path] | None = None,
    expected_digests: Collection[str] | None = None,
) -> LoadedModel:
    """`load_model` of a whole model (or one shard) that also returns the verified root digest.

    Same checks (`$MODELSEC_MODEL_DIGEST` included), errors and single read pass as `load_model`; for
    callers that attest about what they loaded (the robustness gate), so that the subject is the digest
    the loaded bytes were verified under.
    """
    model_path = Path(os.fspath(model_path))
    device = shard_io.check_device(device)
    with _opened(model_path, policy, bundles, expected_digests) as (
        signed,
        single,
        resolved,
        admission,
        pins,
    ):
        loaded = _load_whole(signed, single, resolved, device)
        emit_receipt_for(
            admission,
            loaded.root_digest,
            signed.model_dir.name,
            loaded.shards,
            len(loaded.tensors),
            device,
            pins,
        )
        return loaded


class _VerifiedSlice:
    """The part of safetensors' `PySafeSlice` API that loaders use, over a verified tensor."""

    def __init__(self, tensor: Any, dtype: str) -> None:
        self._tensor, self._dtype = tensor, dtype

    def get_shape(self) -> list[int]:
        return list(self._tensor.shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, index: Any) -> Any:
        return self._tensor[index]

    def __len__(self) -> int:
        return int(self._tensor.shape[0])


class VerifiedSafeOpen:
    """A lazy, `safetensors.safe_open`-like view of a verified model or shard.

    Signatures, the file set and the refusals are checked when it is opened. A single shard is verified
    whole at open; for a directory each tensor is verified before it is returned (per-tensor digest, or
    its whole shard, which is then kept in private memory for later tensors of that shard). `metadata()`
    verifies the whole shard first: header bytes are covered only by the file digest.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        policy: Policy | PolicySet | ModelAdmission | None = None,
        *,
        device: str = "cpu",
        bundles: Sequence[Path] | None = None,
        signed: SignedModel | None = None,
        expected_digests: Collection[str] | None = None,
    ) -> None:
        model_path = Path(os.fspath(model_path))
        self._device = shard_io.check_device(device)
        self._root_fd: int | None = None
        receipt: tuple[ModelAdmission, Collection[str] | None] | None = None
        if signed is not None:
            # The runtime guard's snapshot: verified already, through the root descriptor it holds.
            self._dir, self._single = _split_path(model_path)
            if self._dir != signed.model_dir:
                # A file in a subfolder of the signed model (e.g. `text_encoder/model.safetensors`).
                self._dir = signed.model_dir
                self._single = os.path.relpath(model_path, signed.model_dir)
            self._policy = admit_model(model_path, policy).policy
            if self._single is not None:
                precheck_file(model_path, self._policy)
        else:
            # Opened once; the policy is chosen from the descriptor, which every later read goes through.
            _check_pins(model_path, expected_digests)
            self._root_fd, self._single, self._dir = open_model_path(model_path)
            try:
                pins = pinned_root_digests(opened_model_uri(self._dir, self._root_fd, None), expected_digests)
                admission = admit_opened(model_path, self._root_fd, self._single, policy)
                self._policy = admission.policy
                if self._single is not None:
                    precheck_file(self._dir / self._single, self._policy, root_fd=self._root_fd)
                signed = verify_signatures(
                    self._dir, admission, bundles=bundles, expected_digests=pins, root_fd=self._root_fd
                )
                report_warnings(signed.warnings)
                receipt = (admission, pins)
            except BaseException:
                self.close()
                raise
        self._signed = signed
        names = check_file_set(self._signed, self._policy, only=[self._single] if self._single else None)
        if self._single is None:
            # A directory gets the directory checks up front, as `load_model` makes them: every side file's
            # digests, remote code in any JSON file, and the index; tensor files are checked as they are read.
            side = [n for n in names if not is_safetensors_name(n)]
            verify_files(self._signed, side, self._policy, tensor_hash=None, whole_model=False)
        self._shards: dict[str, shard_io.VerifiedShard] = {}
        self._headers: dict[str, SafetensorsHeader] = {}  # parsed once per file for per-tensor reads
        self._lock = threading.Lock()
        files = (
            [self._single]
            if self._single
            else [n for n in self._signed.manifest.names if is_safetensors_name(n)]
        )
        self._files = files
        self._entries = self._signed.tensor_entries(files)
        if self._single is not None:
            # One shard opened explicitly (as loaders do): verify it whole now, so a tampered shard is
            # refused before any of its tensors is built, and serve every tensor from that buffer.
            self._shard(self._single)
        if receipt is not None:
            # `open_model` itself (the guard's snapshot emitted its own): the receipt states the tensors now
            # served, before the caller can read any; a required receipt that cannot be emitted closes it.
            try:
                emit_receipt_for(
                    receipt[0], self._signed.root_digest, self._dir.name, files, len(self.keys()), device,
                    receipt[1],
                )  # fmt: skip
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> VerifiedSafeOpen:
        return self

    def __exit__(self, *exc: object) -> None:
        self._shards.clear()
        self.close()

    def close(self) -> None:
        """Close the model root's descriptor (tensors not yet read can no longer be read)."""
        fd, self._root_fd = getattr(self, "_root_fd", None), None
        if fd is not None:
            # Later reads open the directory by path again: never a descriptor number that was closed.
            if getattr(self, "_signed", None) is not None and self._signed.root_fd == fd:
                self._signed = dataclasses.replace(self._signed, root_fd=None)
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def _shard(self, name: str) -> shard_io.VerifiedShard:
        with self._lock:
            if name not in self._shards:
                pinned = self._device.startswith("cuda")
                self._shards.update(
                    _verify_whole_shards(self._signed, [name], self._policy, pinned=pinned, whole_model=False)
                )
            return self._shards[name]

    def _file_of(self, name: str) -> str:
        if self._entries:
            hit = self._entries.get(name)
            if hit is None or hit[0] not in self._files:
                raise MalformedArtifactError(f"{self._dir}: tensor `{name}` is not in the signed model")
            return hit[0]
        for file in self._files:
            try:
                self._shard(file).header.tensor(name)
            except KeyError:
                continue
            return file
        raise MalformedArtifactError(f"{self._dir}: tensor `{name}` is not in the signed model")

    def keys(self) -> list[str]:
        """The tensor names (from the signed manifest, or from verified shards)."""
        if self._entries:
            return sorted(t for t, (f, _) in self._entries.items() if f in self._files)
        return sorted(t.name for f in self._files for t in self._shard(f).header.tensors)

    def metadata(self) -> dict[str, str] | None:
        """The `__metadata__` of the (first) shard, from a fully verified header."""
        if not self._files:
            return None
        meta = self._shard(self._files[0]).header.metadata
        return dict(meta) if meta is not None else None

    def get_tensor(self, name: str) -> Any:
        """The tensor `name`, verified, on the device given at open."""
        file = self._file_of(name)
        if file in self._shards or not self._entries:
            shard = self._shard(file)
            info = shard.header.tensor(name)
            tensor = shard_io.tensor_from(
                shard.buffer, shard.header.data_start, info, name, f"{self._dir}/{file}"
            )
        else:
            wanted = {name: self._entries[name]}
            tensor = _load_tensors_by_digest(self._signed, wanted, self._policy, self._headers)[name]
        return shard_io.to_device({name: tensor}, self._device)[name]

    def get_slice(self, name: str) -> _VerifiedSlice:
        """A slice object over the verified tensor (`get_shape()`, `get_dtype()`, indexing)."""
        tensor = self.get_tensor(name)
        file = self._file_of(name)
        dtype = self._entries[name][1].dtype if self._entries else self._shard(file).header.tensor(name).dtype
        return _VerifiedSlice(tensor, dtype)


def open_model(
    model_path: str | os.PathLike[str],
    policy: Policy | PolicySet | ModelAdmission | None = None,
    *,
    device: str = "cpu",
    bundles: Sequence[Path] | None = None,
    expected_digests: Collection[str] | None = None,
) -> VerifiedSafeOpen:
    """Open a model directory or shard lazily; every tensor it returns was verified first.

    Args:
        model_path: A model directory or one shard.
        policy: A `Policy`, a `PolicySet`, or None for `$MODELSEC_POLICY`.
        device: Where returned tensors go.
        bundles: Explicit bundle paths.
        expected_digests: Model root digests the signed model must have, pinned together with
            `$MODELSEC_MODEL_DIGEST` as `load_model` pins them.

    Returns:
        A `safe_open`-like object (`keys()`, `get_tensor()`, `get_slice()`, `metadata()`).

    Where the policy asks for one (`loadReceipt`), the load receipt is emitted at open, naming every tensor
    the view serves (without per-tensor digests in the bundle, counting them verifies every shard at open).

    Raises:
        The errors of `load_model`, at open (signatures, file set, refusals, a required load receipt that
        cannot be emitted) or at access (digests).
    """
    return VerifiedSafeOpen(
        model_path, policy, device=device, bundles=bundles, expected_digests=expected_digests
    )
