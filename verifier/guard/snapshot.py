"""One verified snapshot per model directory: the runtime guard's view of a model.

The first time a process opens a model directory through a guarded entry point, `open_snapshot` verifies it
whole — in this order, each step only if the earlier ones passed:

1. the bundles' signatures with the policy's trusted keys and required algorithms, then the pinned root
   digests (`expected_digests`, e.g. from `$MODELSEC_MODEL_DIGEST`), before any model file is opened;
2. the file set (nothing added, removed or renamed; no links except the Hugging Face cache layout's;
   pickle formats and, unless the policy allows remote code, `*.py` refused);
3. every file's digests and the model root digest (each file read once: tensor files streamed through the
   hashing engine, every other file read into private memory and hashed there), then the side-file rules
   over the verified bytes (pickle content under `refusePickle`, remote code in any JSON file, the index);
4. where the deciding policy asks for one (`loadReceipt`), the node's TPM-quoted load receipt
   (`modelsec.verifier.receipts`): once per snapshot, for every tensor file, device `cpu`. A required receipt
   that cannot be emitted refuses the snapshot, so the framework's load fails and nothing is served.

It then builds a private read-only tree (`modelsec.verifier.guard.private_files`): every non-tensor file
holds the bytes that were hashed in step 3 — never a second read of the original path — and every
`*.safetensors` file is an empty placeholder whose reads the hooked `safe_open` / `load_file` serve from the
verified loader (which reads the shard once more into private memory and compares its digests again before
building a tensor). A file changed after verification is therefore never used: side files come from the copy,
and a changed shard is refused.

Snapshots are cached per process by (real path, root digest, policy); a new signed version of the directory
(another root digest) gets a new snapshot. Not covered: files outside the model directory that a framework
reads on its own (e.g. a global chat-template cache); those are the framework's configuration, not the model.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from modelsec.errors import MalformedArtifactError, PolicyViolationError, SignatureError
from modelsec.modelformat.hashing import FileDigests, hash_files, hash_source, is_safetensors_name
from modelsec.modelformat.model_files import open_beneath, open_model_root
from modelsec.policy import Policy, PolicySet
from modelsec.signer.layout import SIGNATURE_FILE_NAMES, find_default_bundles
from modelsec.verifier.admission import ModelAdmission, admit_opened, opened_model_uri, report_warnings
from modelsec.verifier.audit import record_verified_model
from modelsec.verifier.guard.private_files import PrivateTree
from modelsec.verifier.pinning import DigestPin, digests_for_model
from modelsec.verifier.receipts import emit_receipt_for
from modelsec.verifier.verification import SignedModel, check_digests, check_file_set, verify_signatures

__all__ = [
    "MAX_SIDE_FILE_BYTES",
    "VerifiedSnapshot",
    "check_relative_name",
    "find_signed_root",
    "open_snapshot",
    "snapshot_containing",
]

MAX_SIDE_FILE_BYTES = 2**30
"""Largest non-tensor file copied into a snapshot (1 GiB): larger side files are refused, not skipped."""


@dataclass(frozen=True, slots=True)
class VerifiedSnapshot:
    """A model directory verified whole, with its private read-only tree.

    Attributes:
        source: The signed model directory as given (its files are never read again, except tensor files
            through the verified loader).
        path: The private tree a framework is given in place of `source` (same relative names).
        root_digest: The verified model root digest (hex).
        policy: The policy it was verified under.
        signed: The verified bundles and what each file hashes to.
        storage: `"memfd"` or `"directory"` (see `modelsec.verifier.guard.private_files`).
        files: Signed files in the tree.
        bytes_hashed: Bytes read and hashed to verify it.
    """

    source: Path
    path: Path
    root_digest: str
    policy: Policy
    signed: SignedModel
    storage: str
    files: int
    bytes_hashed: int

    def source_path(self, rel: str) -> Path:
        """The original path of the signed file `rel`."""
        return self.source / rel

    def refuse_unsigned(self, rel: str) -> None:
        """Refuse `rel` (relative to the tree) if the model directory has it but the tree does not.

        Such a path is in the directory but is no signed file or directory: its bundle ignores it (or it
        appeared after verification). A framework would otherwise see it as missing and fail with its own
        error about the private tree's path.

        Raises:
            PolicyViolationError: `rel` exists in `source` but not in the verified tree.
        """
        rel = os.path.normpath(rel)
        if rel in ("", ".") or os.path.lexists(self.path / rel) or not os.path.lexists(self.source / rel):
            return
        raise PolicyViolationError(
            f"{self.source / rel}: not signed by the bundles of {self.source} (they ignore it, or it "
            "appeared after verification); the modelsec runtime guard serves only signed files"
        )


class _BytesSource:
    """A `ChunkSource` over bytes already in private memory."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self._view, self._pos, self._chunk = memoryview(data), 0, chunk

    def read_exact(self, n: int) -> bytes:
        if self._pos + n > len(self._view):
            raise MalformedArtifactError("file shorter than its header says")
        out = bytes(self._view[self._pos : self._pos + n])
        self._pos += n
        return out

    def chunks(self) -> Iterator[memoryview]:
        while self._pos < len(self._view):
            end = min(len(self._view), self._pos + self._chunk)
            yield self._view[self._pos : end]
            self._pos = end


_lock = threading.Lock()
_building: dict[tuple[str, str, object], threading.Lock] = {}
_by_key: dict[tuple[str, str, object], VerifiedSnapshot] = {}
_by_tree: dict[str, VerifiedSnapshot] = {}


def _policy_key(policy: object) -> object:
    try:
        hash(policy)
    except TypeError:
        return id(policy)
    return policy


def find_signed_root(path: Path, *, max_levels: int = 32) -> Path:
    """The nearest directory at or above `path` (a directory or a file) that holds a default bundle.

    Only bundles are looked for here; whether they verify, and whether `path` is a signed file of that
    model, is decided by `open_snapshot`.

    Raises:
        SignatureError: No directory up to `max_levels` above holds `model.sig`, `model.p384.sig` or
            `model.sm2.sig`.
    """
    start = path if path.is_dir() else path.parent
    current = Path(os.path.abspath(start))
    for _ in range(max_levels + 1):
        if find_default_bundles(current):
            return current
        if current.parent == current:
            break
        current = current.parent
    raise SignatureError(
        f"{path}: no signature bundle ({', '.join(SIGNATURE_FILE_NAMES)}) in its directory or above"
    )


def check_relative_name(value: object, argument: str, model: object) -> None:
    """Refuse a `subfolder` or file name that could leave the model directory it is joined to.

    Frameworks join these names onto the verified tree with `os.path.join`, so an absolute name would
    discard the tree and a `..` segment would climb out of it: either reads files that were never verified.
    Only the name is looked at (nothing is read); a relative name without `..` stays inside the tree.

    Args:
        value: The name as given (None and `""` mean none; other non-path values are left to the framework).
        argument: The parameter's name, for the message (`subfolder`, `filename`, `config_file_name`).
        model: The model reference it was given with, for the message (a path in a verified tree is named
            by the model directory behind it).

    Raises:
        PolicyViolationError: `value` is absolute or has a `..` segment.
    """
    if not isinstance(value, str | os.PathLike):
        return
    name = os.fspath(value)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if os.path.isabs(name):
        why = "is absolute"
    elif ".." in name.replace("\\", "/").split("/"):
        why = "has a '..' segment"
    else:
        return
    hit = snapshot_containing(model) if isinstance(model, str | os.PathLike) and model else None
    if hit is not None:  # name the model the user gave, not its private tree
        model = hit[0].source / hit[1] if hit[1] else hit[0].source
    raise PolicyViolationError(
        f"{model}: {argument}={name!r} {why}; the modelsec runtime guard serves only files inside the signed "
        "model directory (give a relative path without '..')"
    )


def snapshot_containing(path: str | os.PathLike[str]) -> tuple[VerifiedSnapshot, str] | None:
    """The snapshot whose private tree holds `path`, and `path` relative to it (`""` for the tree itself)."""
    candidates = {os.path.abspath(os.fspath(path))}
    candidates.add(os.path.realpath(os.fspath(path)))
    with _lock:
        trees = list(_by_tree.items())
    for p in candidates:
        for top, snap in trees:
            if p == top:
                return snap, ""
            if p.startswith(top + os.sep):
                return snap, p[len(top) + 1 :]
    return None


def _read_side_file(root_fd: int, name: str, model: str) -> bytes:
    fd = open_beneath(root_fd, name, what=model)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_SIDE_FILE_BYTES + 1)
    if len(data) > MAX_SIDE_FILE_BYTES:
        raise MalformedArtifactError(
            f"{model}/{name}: larger than {MAX_SIDE_FILE_BYTES} bytes; the runtime guard copies every "
            "non-tensor file into private memory and refuses larger ones"
        )
    return data


def open_snapshot(
    model_dir: str | os.PathLike[str],
    policy: Policy | PolicySet | None = None,
    *,
    expected_digests: Collection[str] | None = None,
    pins: Collection[DigestPin] | None = None,
) -> VerifiedSnapshot:
    """Verify a model directory whole (once per process) and return its private read-only tree.

    See the module docstring for what is verified and in which order.

    Args:
        model_dir: The signed model directory (holding `model.sig` and/or `model.sm2.sig`).
        policy: A `Policy`, a `PolicySet` (matched as `file://<real path>`), or None for `$MODELSEC_POLICY`.
        expected_digests: Root digests (`sha256:<hex>` or hex) the model must have; None: no pin.
        pins: `$MODELSEC_MODEL_DIGEST`'s pins, when `expected_digests` is None: those that apply are chosen
            for the `file://` path of the directory that was opened (`digests_for_model`), never for a path
            resolved before the open.

    Returns:
        The snapshot (cached: a second call for the same directory, root digest and policy returns it
        without hashing again).

    Raises:
        SignatureError: No trusted or required signature.
        DigestMismatchError: A file differs, or the root digest is not one of `expected_digests`.
        FileSetMismatchError: Files added, removed or renamed.
        MalformedArtifactError: Malformed bundle, manifest, header, index or side file; a side file larger
            than `MAX_SIDE_FILE_BYTES`.
        PolicyViolationError: Pickle formats, remote code, links; no policy matches.
        PolicyError: No usable policy.
        BackendUnavailableError: No writable place for the private tree; or the policy requires a load
            receipt (`loadReceipt.required`) and the node's TPM cannot be reached (no snapshot is made).
    """
    model_dir = Path(os.fspath(model_dir))
    # Opened once: the policy is chosen from the descriptor, and the snapshot keeps it for the tensor files
    # it serves later (a cached snapshot lives as long as the process).
    root_fd = open_model_root(model_dir)
    try:
        return _open_snapshot(model_dir, root_fd, policy, expected_digests, pins)
    finally:
        os.close(root_fd)


def _open_snapshot(
    model_dir: Path,
    opened_fd: int,
    policy: Policy | PolicySet | None,
    expected_digests: Collection[str] | None,
    pins: Collection[DigestPin] | None,
) -> VerifiedSnapshot:
    admission = admit_opened(model_dir, opened_fd, None, policy)
    if expected_digests is None and pins is not None:
        expected_digests = digests_for_model(
            pins, admission.uri or opened_model_uri(model_dir, opened_fd, None)
        )
    signed = verify_signatures(model_dir, admission, expected_digests=expected_digests, root_fd=opened_fd)
    report_warnings(signed.warnings)
    key = (admission.uri, signed.root_digest, _policy_key(admission))
    with _lock:
        hit = _by_key.get(key)
        if hit is not None:
            return hit
        build_lock = _building.setdefault(key, threading.Lock())
    with build_lock:
        with _lock:
            hit = _by_key.get(key)
        if hit is not None:
            return hit
        own_fd = os.dup(opened_fd)  # the snapshot's own: it serves tensor files through it later
        try:
            snap = _build(model_dir, admission, dataclasses.replace(signed, root_fd=own_fd), expected_digests)
        except BaseException:
            os.close(own_fd)
            raise
        with _lock:
            _by_key[key] = snap
            _by_tree[os.path.abspath(snap.path)] = snap
            _by_tree[os.path.realpath(snap.path)] = snap
            _building.pop(key, None)
        return snap


def _build(
    model_dir: Path, admission: ModelAdmission, signed: SignedModel, pins: Collection[str] | None
) -> VerifiedSnapshot:
    started = time.monotonic()
    policy = admission.policy
    model, limits = str(model_dir), policy.limits
    names = check_file_set(signed, policy)
    # Whole files are compared, so per-tensor digests would only repeat hash work over the same bytes.
    signed_files = dataclasses.replace(signed, tensor_hash=None)
    shards = [n for n in names if is_safetensors_name(n)]
    side = [n for n in names if not is_safetensors_name(n)]
    copies: dict[str, bytes] = {}
    root_fd = signed.open_root()
    try:
        computed: dict[str, FileDigests] = dict(
            hash_files(
                root_fd, shards, algorithms=signed.file_hashes, tensor_hash=None, limits=limits, model=model
            )
        )
        for name in side:
            data = _read_side_file(root_fd, name, model)
            computed[name] = hash_source(
                _BytesSource(data, limits.hash_chunk_bytes),
                name,
                len(data),
                algorithms=signed.file_hashes,
                tensor_hash=None,
                limits=limits,
                what=f"{model}/{name}",
            )
            copies[name] = data
        check_digests(signed_files, computed, policy, root_fd, whole_model=True)
    finally:
        os.close(root_fd)
    # The receipt states what the framework will be served: every verified tensor file, as CPU tensors (the
    # guard builds them on the CPU; the framework moves them). Emitted before the tree exists, so that a
    # required receipt that cannot be emitted leaves no snapshot: the framework's load raises, nothing loaded.
    emit_receipt_for(
        admission,
        signed.root_digest,
        model_dir.name,
        shards,
        sum(len(d.header.tensors) for n in shards if (d := computed[n]).header is not None),
        "cpu",
        pins,
    )
    tree = PrivateTree(model_dir.name)
    try:
        for name in names:
            if name in copies:
                tree.add_file(name, copies.pop(name))
            else:
                tree.add_placeholder(name)
    except BaseException:
        tree.close()
        raise
    bytes_hashed = sum(d.size for d in computed.values())
    record_verified_model(
        event="snapshot",
        model=model_dir,
        root_digest=signed.root_digest,
        bundles=signed.bundles,
        files=len(names),
        bytes_hashed=bytes_hashed,
        seconds=time.monotonic() - started,
        storage=tree.storage,
    )
    return VerifiedSnapshot(
        source=model_dir,
        path=tree.path,
        root_digest=signed.root_digest,
        policy=policy,
        signed=signed,
        storage=tree.storage,
        files=len(names),
        bytes_hashed=bytes_hashed,
    )
