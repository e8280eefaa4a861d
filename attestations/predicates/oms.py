"""The weights manifest: OMS predicate `https://model_signing/signature/v1.0` plus the modelsec extension.

Byte-compatible with PyPI `model-signing` 1.x ("files" serialization): `resources` in OMS order (sorted as
`PurePosixPath` sorts, i.e. by path components: `tokenizer.json` before `tokenizer/vocab.txt`), each
`{"name", "algorithm", "digest"}`; `serialization` records `method`, `hash_type`, `allow_symlinks` and
`ignore_paths`; the single subject digest is SHA-256 over the concatenated raw resource digests, in resource
order (`model_signing._signing.signing.Payload`). OMS verifiers ignore other predicate fields, so
modelsec's per-tensor digests live in an optional `modelsec` object:

```json
"modelsec": {"version": 1, "tensor_hash": "blake3",
             "tensors": {"<file>": {"<tensor>": {"dtype": "BF16", "shape": [4, 4],
                                                 "data_offsets": [0, 32], "digest": "<hex>"}}}}
```

SM2 bundles sign a second manifest with `hash_type` `sm3` (resources with algorithm `sm3`). Its subject
digest carries the model root digest (the SHA-256 root of the SHA-256 manifest, the identity every policy
and attestation uses) together with `sm3` = SM3 over the concatenated SM3 resource digests; a verifier
checks the `sha256` value against SHA-256 digests it computes itself.

Order on verification, as OMS verifies (`model_signing._signing.signing.dsse_payload_to_manifest`): the
subject digest is recomputed over the resources *in the order they are listed*, which is kept. modelsec
before 0.x sorted resources byte by byte (`tokenizer/...` before `tokenizer.json`); those bundles list
their resources in that order and their subject digest was computed in it, so they keep verifying, with the
root digest they were signed with. Everything modelsec computes from now on (`build_manifest`,
`modelsec digest`) uses the OMS order, so a file set has one root digest going forward.

A single-file model (model_signing signing a file rather than a directory) has exactly one resource,
named `.`; `Manifest.single_file` tells the verifier to bind it to the file it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.statement import Statement, Subject, is_sha256_hex
from modelsec.errors import MalformedArtifactError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import FileDigests, TensorDigest, new_hasher
from modelsec.modelformat.model_files import ambiguity_key, oms_order, validate_resource_name

__all__ = [
    "EXTENSION_VERSION",
    "OMS_PREDICATE_TYPE",
    "SINGLE_FILE_NAME",
    "Manifest",
    "Resource",
    "TensorEntry",
    "build_manifest",
    "manifest_statement",
    "parse_manifest",
    "root_digest",
]

OMS_PREDICATE_TYPE = "https://model_signing/signature/v1.0"
EXTENSION_VERSION = 1
_MANIFEST_HASHES = {HashAlgorithm.SHA256, HashAlgorithm.SM3, HashAlgorithm.BLAKE3}
_MAX_IGNORE_PATHS = 1024  # entries of predicate.serialization.ignore_paths a verifier reads
# The resource name OMS gives the one file of a single-file model (`PurePosixPath(".")`).
SINGLE_FILE_NAME = "."


@dataclass(frozen=True, slots=True)
class Resource:
    """One signed file: relative name, digest algorithm and raw digest."""

    name: str
    algorithm: HashAlgorithm
    digest: bytes


# One signed tensor (dtype, shape, byte range within the data section, digest): the same facts the engine
# computes, so the manifest reuses the engine's value type.
TensorEntry = TensorDigest


@dataclass(frozen=True, slots=True)
class Manifest:
    """A weights manifest (one per bundle).

    Attributes:
        model_name: The subject name (informational, never compared).
        hash_type: The file digest algorithm (`sha256`, `sm3`, or `blake3` from model_signing).
        resources: The signed files, in the order signed (OMS order for everything modelsec builds).
        ignore_paths: The signed ignore list, applied exactly.
        allow_symlinks: As signed; modelsec refuses symlinks whatever it says.
        tensor_hash: The per-tensor digest algorithm, or None when the extension is absent.
        tensors: Per-tensor entries by file then tensor name (empty without the extension).
        subject_digest: The subject's digest map as signed.
    """

    model_name: str
    hash_type: HashAlgorithm
    resources: tuple[Resource, ...]
    ignore_paths: tuple[str, ...]
    allow_symlinks: bool
    tensor_hash: HashAlgorithm | None
    tensors: Mapping[str, Mapping[str, TensorEntry]]
    subject_digest: Mapping[str, str]
    _by_name: Mapping[str, Resource] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({r.name: r for r in self.resources}))

    @property
    def names(self) -> tuple[str, ...]:
        """The signed file names, in resource order."""
        return tuple(r.name for r in self.resources)

    @property
    def single_file(self) -> bool:
        """Whether this manifest signs one file rather than a directory (its one resource is named `.`)."""
        return len(self.resources) == 1 and self.resources[0].name == SINGLE_FILE_NAME

    def resource(self, name: str) -> Resource | None:
        """The resource called `name`, or None (a dict lookup: verification asks once per file)."""
        return self._by_name.get(name)


def root_digest(digests: Sequence[bytes], algorithm: HashAlgorithm = HashAlgorithm.SHA256) -> bytes:
    """The OMS root digest: `algorithm` over the concatenated raw resource digests, in resource order."""
    h = new_hasher(algorithm)
    for d in digests:
        h.update(d)
    return h.digest()


def build_manifest(
    model_name: str,
    files: Mapping[str, FileDigests],
    *,
    hash_type: HashAlgorithm,
    ignore_paths: Sequence[str],
    tensor_hash: HashAlgorithm | None,
) -> Manifest:
    """Build the manifest of hashed files.

    Args:
        model_name: Subject name (the model directory name).
        files: Results of `hash_files`, which must include `hash_type` (and SHA-256 for `sm3` manifests).
        hash_type: The file digest algorithm of this manifest.
        ignore_paths: The ignore list to record.
        tensor_hash: The per-tensor digest algorithm used, or None to omit the extension.

    Returns:
        The manifest, resources in OMS order (`oms_order`; `.` alone for a single-file model).
    """
    names = sorted(files, key=oms_order)
    resources = tuple(Resource(n, hash_type, files[n].digests[hash_type]) for n in names)
    # OMS: SHA-256 over the resource digests; an SM3 manifest's subject carries the SHA-256 manifest's root.
    root_of = HashAlgorithm.SHA256 if hash_type is HashAlgorithm.SM3 else hash_type
    subject = {"sha256": root_digest([files[n].digests[root_of] for n in names]).hex()}
    if hash_type is HashAlgorithm.SM3:
        subject["sm3"] = root_digest([r.digest for r in resources], HashAlgorithm.SM3).hex()
    tensors: dict[str, Mapping[str, TensorEntry]] = {}
    if tensor_hash is not None:
        for n in names:
            t = files[n].tensors
            if t is not None:
                tensors[n] = MappingProxyType(
                    {k: TensorEntry(v.dtype, v.shape, v.begin, v.end, v.digest) for k, v in t.items()}
                )
    return Manifest(
        model_name=model_name,
        hash_type=hash_type,
        resources=resources,
        ignore_paths=tuple(ignore_paths),
        allow_symlinks=False,
        tensor_hash=tensor_hash,
        tensors=MappingProxyType(tensors),
        subject_digest=MappingProxyType(subject),
    )


def manifest_statement(manifest: Manifest) -> Statement:
    """The in-toto statement that signs `manifest` (OMS predicate plus the modelsec extension)."""
    predicate: dict[str, Any] = {
        "serialization": {
            "method": "files",
            "hash_type": manifest.hash_type.value,
            "allow_symlinks": manifest.allow_symlinks,
            "ignore_paths": list(manifest.ignore_paths),
        },
        "resources": [
            {"name": r.name, "algorithm": r.algorithm.value, "digest": r.digest.hex()}
            for r in manifest.resources
        ],
    }
    if manifest.tensor_hash is not None:
        predicate["modelsec"] = {
            "version": EXTENSION_VERSION,
            "tensor_hash": manifest.tensor_hash.value,
            "tensors": {
                f: {
                    name: {
                        "dtype": t.dtype,
                        "shape": list(t.shape),
                        "data_offsets": [t.begin, t.end],
                        "digest": t.digest.hex(),
                    }
                    for name, t in entries.items()
                }
                for f, entries in manifest.tensors.items()
            },
        }
    return Statement(
        subjects=(Subject(manifest.model_name, dict(manifest.subject_digest)),),
        predicate_type=OMS_PREDICATE_TYPE,
        predicate=predicate,
    )


def _hex_digest(value: object, *, what: str) -> bytes:
    if not is_sha256_hex(value):
        raise MalformedArtifactError(f"{what} must be 64 lowercase hex characters")
    return bytes.fromhex(value)


_ENTRY_FIELDS = frozenset({"dtype", "shape", "data_offsets", "digest"})


def _entry(w: str, fname: str, tname: str) -> str:
    """How errors name one per-tensor entry of the extension."""
    return f"{w}.tensors[{fname!r}][`{tname}`]"


def _is_count(value: object) -> bool:
    """The common case of `_int`'s check, without building its message (`_int` decides the rest)."""
    return type(value) is int and value >= 0


def _int(value: object, *, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedArtifactError(f"{what} must be a non-negative integer")
    return value


def _parse_serialization(
    ser: object, what: str, limits: Limits
) -> tuple[HashAlgorithm, bool, tuple[str, ...]]:
    """`predicate.serialization`: the hash type, `allow_symlinks` and the ignore list, strictly."""
    if isinstance(ser, Mapping) and ser.get("method") == "shards":
        raise MalformedArtifactError(
            f"{what}: predicate.serialization.method 'shards' (model_signing "
            "`hashing.Config().use_shard_serialization`) is not supported; sign with the 'files' "
            "serialization (model_signing's default, `use_file_serialization`)"
        )
    if not isinstance(ser, Mapping) or ser.get("method") != "files":
        raise MalformedArtifactError(f"{what}: predicate.serialization.method must be 'files'")
    if ser.get("hash_type") == "blake2b":
        raise MalformedArtifactError(
            f"{what}: predicate.serialization.hash_type 'blake2b' (model_signing "
            '`use_file_serialization(hashing_algorithm="blake2")`) is not supported; sign with '
            "hashing_algorithm 'sha256' (the default) or 'blake3'"
        )
    try:
        hash_type = HashAlgorithm(str(ser.get("hash_type")))
    except ValueError:
        raise MalformedArtifactError(
            f"{what}: predicate.serialization.hash_type {ser.get('hash_type')!r} is not supported"
        ) from None
    if hash_type not in _MANIFEST_HASHES:
        raise MalformedArtifactError(f"{what}: hash_type {hash_type} is not supported")
    allow_symlinks = ser.get("allow_symlinks", False)
    if not isinstance(allow_symlinks, bool):
        raise MalformedArtifactError(f"{what}: predicate.serialization.allow_symlinks must be a boolean")
    raw_ignore = ser.get("ignore_paths", [])
    if not isinstance(raw_ignore, list):
        raise MalformedArtifactError(f"{what}: predicate.serialization.ignore_paths must be a list")
    if len(raw_ignore) > _MAX_IGNORE_PATHS:
        raise MalformedArtifactError(
            f"{what}: predicate.serialization.ignore_paths has {len(raw_ignore)} entries, more than the "
            f"limit of {_MAX_IGNORE_PATHS}"
        )
    ignore = tuple(validate_resource_name(p, what=f"{what}: ignore_paths", limits=limits) for p in raw_ignore)

    return hash_type, allow_symlinks, ignore


def _parse_resources(
    raw_resources: object, hash_type: HashAlgorithm, what: str, limits: Limits
) -> dict[str, Resource]:
    """`predicate.resources`: clean, unique, unambiguous names with `hash_type` digests, in signed order."""
    if not isinstance(raw_resources, list) or not raw_resources:
        raise MalformedArtifactError(f"{what}: predicate.resources must list at least one file")
    if len(raw_resources) > limits.max_files:
        raise MalformedArtifactError(f"{what}: predicate.resources lists more than {limits.max_files} files")
    resources: dict[str, Resource] = {}
    ambiguous: dict[str, str] = {}
    for i, entry in enumerate(raw_resources):
        if not isinstance(entry, Mapping):
            raise MalformedArtifactError(f"{what}: predicate.resources[{i}] is not an object")
        if entry.get("name") == SINGLE_FILE_NAME and len(raw_resources) == 1:
            name = SINGLE_FILE_NAME  # a single-file model (OMS: PurePosixPath(".")), bound to one file
        else:
            name = validate_resource_name(
                entry.get("name"), what=f"{what}: predicate.resources[{i}]", limits=limits
            )
        if entry.get("algorithm") != hash_type.value:
            raise MalformedArtifactError(
                f"{what}: resources[{i}] ({name!r}) algorithm {entry.get('algorithm')!r} "
                f"!= hash_type {hash_type}"
            )
        if name in resources:
            raise MalformedArtifactError(f"{what}: predicate.resources lists {name!r} twice")
        other = ambiguous.setdefault(ambiguity_key(name), name)
        if other != name:
            raise MalformedArtifactError(
                f"{what}: predicate.resources names {other!r} and {name!r}, which are ambiguous (equal after "
                "Unicode NFC normalisation or case folding: one file on some file systems)"
            )
        resources[name] = Resource(
            name, hash_type, _hex_digest(entry.get("digest"), what=f"{what}: {name!r} digest")
        )
    return resources


def _check_ignored_not_signed(ignore: Sequence[str], resources: Mapping[str, Resource], what: str) -> None:
    """Refuse an ignore list that names a signed file, or a directory holding one (OMS semantics).

    Such a manifest contradicts itself: which one wins would differ between verifiers (modelsec checks every
    listed resource, another implementation might skip it), so it is refused as malformed. Names compare as
    the file system would see them (`ambiguity_key`: NFC, case folded).
    """
    if not ignore:
        return
    covered: dict[str, str] = {}  # the key of each resource and of each folder above it -> the resource
    for name in resources:
        if name == SINGLE_FILE_NAME:
            continue
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            covered.setdefault(ambiguity_key("/".join(parts[:depth])), name)
    for path in ignore:
        signed = covered.get(ambiguity_key(path))
        if signed is not None:
            raise MalformedArtifactError(
                f"{what}: predicate.serialization.ignore_paths names {path!r}, but the manifest signs "
                f"{signed!r}: a signed file cannot be ignored"
            )


def parse_manifest(statement: Statement, *, what: str, limits: Limits | None = None) -> Manifest:
    """Interpret a verified statement as a weights manifest, strictly, before any file is opened.

    Checks the predicate type, the `files` serialization, the hash type, every resource name
    (`validate_resource_name`: no traversal, absolute, backslash, NUL, percent-escape or dot segments;
    corpus MAN01), duplicate names, names equal after Unicode NFC normalisation or case folding (so a
    single-file verify or load refuses them as the directory walk does), at least one resource, a
    single subject whose digest equals the root digest of the resources in the order they are listed (as
    OMS verifies; module docstring), an ignore list that names no signed file nor a folder holding one
    (compared as `ambiguity_key` compares), and the extension's shape when present. A manifest whose one
    resource is named `.` is a single-file model (OMS names a signed file so); `.` anywhere else is refused.

    Not verified (refused, naming model_signing's option): the `shards` serialization
    (`hashing.Config().use_shard_serialization`) and `blake2b` file digests
    (`use_file_serialization(hashing_algorithm="blake2")`). Neither is reachable from model_signing's CLI
    (only from its Python API); shards name byte ranges rather than files, which the one-pass engine, the
    loader's per-file binding and the guard's private copies do not model, and BLAKE2b has no
    `HashAlgorithm` identity in modelsec. Both are refused before any file is opened.

    Args:
        statement: The statement parsed from the verified payload.
        what: Names the bundle in errors.
        limits: Limits for names and counts; defaults to `Limits()`.

    Returns:
        The manifest.

    Raises:
        MalformedArtifactError: Any field is missing, mistyped, unsafe or inconsistent; the message names it.
    """
    limits = limits or Limits()
    if statement.predicate_type != OMS_PREDICATE_TYPE:
        raise MalformedArtifactError(
            f"{what}: predicateType must be {OMS_PREDICATE_TYPE!r}, got {statement.predicate_type!r}"
        )
    pred = statement.predicate
    hash_type, allow_symlinks, ignore = _parse_serialization(pred.get("serialization"), what, limits)
    resources = _parse_resources(pred.get("resources"), hash_type, what, limits)
    _check_ignored_not_signed(ignore, resources, what)
    # Kept in the signed order: the subject digest is checked over exactly this order (module docstring).
    ordered = tuple(resources.values())

    if len(statement.subjects) != 1:
        raise MalformedArtifactError(f"{what}: statement must have exactly one subject")
    subject = statement.subjects[0]
    if hash_type is HashAlgorithm.SM3:
        expected_key, expected = "sm3", root_digest([r.digest for r in ordered], HashAlgorithm.SM3)
        if not is_sha256_hex(subject.digest.get("sha256", "")):
            raise MalformedArtifactError(f"{what}: SM3 manifest subject lacks the sha256 model root digest")
    else:
        expected_key, expected = "sha256", root_digest([r.digest for r in ordered])
    if subject.digest.get(expected_key) != expected.hex():
        raise MalformedArtifactError(
            f"{what}: subject digest {expected_key} does not match the resources (root digest "
            f"{expected.hex()})"
        )

    tensor_hash, tensors = _parse_extension(pred.get("modelsec"), ordered, what=what, limits=limits)
    return Manifest(
        model_name=subject.name,
        hash_type=hash_type,
        resources=ordered,
        ignore_paths=ignore,
        allow_symlinks=allow_symlinks,
        tensor_hash=tensor_hash,
        tensors=tensors,
        subject_digest=subject.digest,
    )


def _parse_extension(
    ext: object, resources: Sequence[Resource], *, what: str, limits: Limits
) -> tuple[HashAlgorithm | None, Mapping[str, Mapping[str, TensorEntry]]]:
    if ext is None:
        return None, MappingProxyType({})
    w = f"{what}: predicate.modelsec"
    if not isinstance(ext, Mapping) or ext.get("version") != EXTENSION_VERSION:
        raise MalformedArtifactError(f"{w}: unsupported extension (version must be {EXTENSION_VERSION})")
    try:
        tensor_hash = HashAlgorithm(str(ext.get("tensor_hash")))
    except ValueError:
        raise MalformedArtifactError(f"{w}.tensor_hash {ext.get('tensor_hash')!r} is not supported") from None
    raw = ext.get("tensors")
    if not isinstance(raw, Mapping):
        raise MalformedArtifactError(f"{w}.tensors must be an object")
    names = {r.name for r in resources}
    files: dict[str, Mapping[str, TensorEntry]] = {}
    for fname, entries in raw.items():
        if fname not in names:
            raise MalformedArtifactError(f"{w}.tensors names {fname!r}, which is not a signed resource")
        if not isinstance(entries, Mapping) or len(entries) > limits.max_tensors_per_file:
            raise MalformedArtifactError(f"{w}.tensors[{fname!r}] must be an object")
        parsed: dict[str, TensorEntry] = {}
        for tname, t in entries.items():
            # The entry's display name is formatted only for an error: a manifest holds thousands of entries.
            if not isinstance(t, Mapping) or t.keys() != _ENTRY_FIELDS:
                raise MalformedArtifactError(
                    f"{_entry(w, fname, tname)} must have exactly dtype, shape, data_offsets, digest"
                )
            dtype, shape, offsets, digest = t["dtype"], t["shape"], t["data_offsets"], t["digest"]
            if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
                raise MalformedArtifactError(f"{_entry(w, fname, tname)} is mistyped")
            if len(offsets) != 2:
                raise MalformedArtifactError(f"{_entry(w, fname, tname)}.data_offsets must have two entries")
            begin, end = offsets
            if not (_is_count(begin) and _is_count(end)):
                what = f"{_entry(w, fname, tname)}.data_offsets"
                begin, end = _int(begin, what=what), _int(end, what=what)
            if begin > end:
                raise MalformedArtifactError(f"{_entry(w, fname, tname)}.data_offsets are reversed")
            dims = tuple(shape)
            if not all(map(_is_count, dims)):
                dims = tuple(_int(d, what=f"{_entry(w, fname, tname)}.shape") for d in dims)
            raw = bytes.fromhex(digest) if is_sha256_hex(digest) else None
            if raw is None:
                raw = _hex_digest(digest, what=f"{_entry(w, fname, tname)}.digest")  # raises, naming it
            parsed[tname] = TensorEntry(dtype, dims, begin, end, raw)
        files[fname] = MappingProxyType(parsed)
    return tensor_hash, MappingProxyType(files)
