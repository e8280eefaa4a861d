"""Step 5 of model verification: JSON side files interpreted, only after their bytes matched the manifest.

Code references (`auto_map`, `custom_pipelines`) are refused unless the policy allows remote code, and then
only local references to signed modules pass; `model.safetensors.index.json` must name signed shards that
hold the tensors it maps.
"""

from __future__ import annotations

import hmac
import os
import posixpath
import re
from collections.abc import Collection, Mapping, Sequence

from modelsec._strict_json import strict_loads
from modelsec.algorithms import HashAlgorithm
from modelsec.errors import DigestMismatchError, MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.hashing import FileDigests, new_hasher
from modelsec.modelformat.model_files import open_beneath
from modelsec.policy import Policy

__all__ = [
    "INDEX_NAME",
    "CodeReference",
    "check_index",
    "check_json_code",
    "check_remote_code",
    "parse_index",
    "read_verified_side_file",
    "remote_code_references",
]

INDEX_NAME = "model.safetensors.index.json"


def read_verified_side_file(
    root_fd: int, name: str, expected: FileDigests, limits: Limits, model: str
) -> bytes:
    """Read a small side file again and make sure it is byte-identical to what was hashed."""
    if expected.size > limits.max_json_side_file_bytes:
        raise MalformedArtifactError(
            f"{model}/{name}: {expected.size} bytes, larger than the JSON side-file limit of "
            f"{limits.max_json_side_file_bytes} bytes (Limits.max_json_side_file_bytes); refused unread"
        )
    fd = open_beneath(root_fd, name, what=model)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limits.max_json_side_file_bytes + 1)
    algorithm = (
        HashAlgorithm.SHA256 if HashAlgorithm.SHA256 in expected.digests else next(iter(expected.digests))
    )
    h = new_hasher(algorithm)
    h.update(data)
    if not hmac.compare_digest(h.digest(), expected.digests[algorithm]):
        raise DigestMismatchError(
            f"{model}/{name}", expected.digests[algorithm].hex(), h.digest().hex(), algorithm=algorithm.value
        )
    return data


def check_json_code(
    root_fd: int,
    computed: Mapping[str, FileDigests],
    signed_names: Collection[str],
    policy: Policy,
    model: str,
) -> None:
    """Re-read every hashed `*.json` file (bounded, re-hashed) and refuse the code references in it.

    Raises:
        DigestMismatchError: A JSON file changed since it was hashed.
        MalformedArtifactError: Too large, or not strict JSON.
        PolicyViolationError: Code references the policy refuses (`check_remote_code`).
    """
    for name in computed:
        if not name.endswith(".json"):
            continue
        what = f"{model}/{name}"
        raw = read_verified_side_file(root_fd, name, computed[name], policy.limits, model)
        # Every JSON file is parsed (no byte-level pre-filter): `"auto\\u005fmap"` is `auto_map` to a loader.
        references = remote_code_references(strict_loads(raw, what=what, bounded_ints=False), what=what)
        check_remote_code(
            name, references, signed_names, allow_remote_code=policy.allow_remote_code, model=model
        )


_CODE_KEYS = ("auto_map", "custom_pipelines")


class CodeReference(str):
    """A code reference (`module.Class`) as written, with `field`: where the document names it.

    A `str`, so callers comparing references with strings keep working; `field` is the JSON path of the key
    that names the code (`auto_map`, `vision_config.auto_map`, `custom_pipelines.<task>.impl`).
    """

    field: str

    def __new__(cls, value: str, field: str) -> CodeReference:  # noqa: D102 - see the class docstring
        ref = super().__new__(cls, value)
        ref.field = field
        return ref


def _field(ref: str) -> str:
    return ref.field if isinstance(ref, CodeReference) else "auto_map/custom_pipelines"


_CLASS_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+\Z")


def remote_code_references(doc: object, *, what: str = "JSON document") -> list[str]:
    """Every code reference a Hugging Face loader could import from a JSON document, at any depth.

    A reference is a value under an `auto_map` object (`"AutoModel": "modeling_x.Model"`, or a tokenizer's
    `[slow, fast]` list whose entries may be null) or a `custom_pipelines.<task>.impl` value, wherever the
    key occurs in the document (e.g. `vision_config.auto_map`). The references are returned as written,
    not checked; see `check_remote_code`.

    Args:
        doc: A decoded JSON document (strict_loads output).
        what: Names the document in errors.

    Returns:
        The references (`CodeReference`: the string as written, and the field naming it), in document
        order (empty when the document names no code).

    Raises:
        MalformedArtifactError: An `auto_map` is not an object, or one of its values is not a string or a
            list of strings and nulls; a `custom_pipelines` entry's `impl` is not a string.
    """
    references: list[str] = []
    # Iterative, so a document nested as deeply as the JSON decoder allows cannot exhaust the stack here.
    stack: list[tuple[str, object]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
            continue
        if not isinstance(value, dict):
            continue
        for key, item in reversed(list(value.items())):
            where = f"{path}.{key}" if path else key
            if key == "auto_map":
                references.extend(
                    CodeReference(t, where) for t in _auto_map_targets(item, f"{what}: {where}")
                )
            elif key == "custom_pipelines" and isinstance(item, dict):
                for task, spec in item.items():
                    impl = spec.get("impl") if isinstance(spec, dict) else None
                    if impl is not None and not isinstance(impl, str):
                        raise MalformedArtifactError(f"{what}: {where}.{task}.impl must be a string")
                    if impl is not None:
                        references.append(CodeReference(impl, f"{where}.{task}.impl"))
            stack.append((where, item))
    return references


def _auto_map_targets(value: object, what: str) -> list[str]:
    if not isinstance(value, dict):
        raise MalformedArtifactError(f"{what} must be an object (auto class -> module.Class)")
    targets: list[str] = []
    for auto_class, target in value.items():
        entries = target if isinstance(target, list) else [target]
        for entry in entries:
            if isinstance(entry, str):
                targets.append(entry)
            elif entry is not None or not isinstance(target, list):
                raise MalformedArtifactError(
                    f"{what}.{auto_class} must be a module.Class string or a list of them (or nulls)"
                )
    return targets


def check_remote_code(
    json_name: str,
    references: Sequence[str],
    signed_names: Collection[str],
    *,
    allow_remote_code: bool,
    model: str,
) -> None:
    """Refuse the code references of one JSON file unless policy allows them and the code is signed.

    Without `allow_remote_code` any reference is refused. With it, each reference must be local: a dotted
    `module.Class` (or `package.module.Class`) whose module file (`module.py`, `package/module.py`),
    relative to the directory holding `json_name`, is one of `signed_names`. A cross-repository reference
    (`org/repo--module.Class`: anything with `--` or `/`) would make a loader fetch code from the Hub and
    is always refused. Whether the signed module is safe to run is not judged here.

    Args:
        json_name: The JSON file's relative name in the model (e.g. `text_encoder/config.json`).
        references: From `remote_code_references`.
        signed_names: The signed resource names of the model.
        allow_remote_code: The policy's remote-code rule.
        model: Names the model in errors.

    Raises:
        PolicyViolationError: Remote code is not allowed, a reference is cross-repository, or its module is
            not a signed file.
        MalformedArtifactError: A reference is not a dotted Python name.
    """
    if not references:
        return
    what = f"{model}/{json_name}"
    if not allow_remote_code:
        fields = list(dict.fromkeys(_field(r) for r in references))
        verb = "requires" if len(fields) == 1 else "require"
        raise PolicyViolationError(
            f"{what}: {', '.join(fields)} {verb} remote code ({', '.join(references)}); refused by policy"
        )
    base = posixpath.dirname(json_name)
    for ref in references:
        if "--" in ref or "/" in ref:
            raise PolicyViolationError(
                f"{what}: {_field(ref)} reference {str(ref)!r} names code in another repository; refused "
                "(only signed code of this model may run, and nothing is fetched)"
            )
        if not _CLASS_REFERENCE.match(ref):
            raise MalformedArtifactError(
                f"{what}: {_field(ref)} reference {str(ref)!r} is not a module.Class name"
            )
        module = posixpath.join(base, *ref.split(".")[:-1]) + ".py"
        if module not in signed_names:
            raise PolicyViolationError(
                f"{what}: {_field(ref)} reference {str(ref)!r} needs {module!r}, which is not a signed file "
                "of the model"
            )


def parse_index(raw: bytes, signed: set[str], what: str) -> dict[str, str]:
    """The weight_map of an index file; every target a signed `*.safetensors` name in `signed`.

    Raises:
        MalformedArtifactError: Not strict JSON, no weight_map object, or a target that is not a signed shard.
    """
    doc = strict_loads(raw, what=what, bounded_ints=False)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise MalformedArtifactError(f"{what}: weight_map is missing or not an object")
    for tensor, target in weight_map.items():
        if not isinstance(target, str) or target not in signed or not target.endswith(".safetensors"):
            raise MalformedArtifactError(
                f"{what}: weight_map[`{tensor}`] -> {target!r} is not a signed safetensors file of the model"
            )
    return weight_map


def check_index(
    root_fd: int, computed: Mapping[str, FileDigests], signed: set[str], limits: Limits, model: str
) -> None:
    """Re-read the verified index and check that each tensor it maps is held by its (hashed) shard.

    Raises:
        DigestMismatchError: The index changed since it was hashed.
        MalformedArtifactError: A bad index, or a tensor its shard does not hold.
    """
    what = f"{model}/{INDEX_NAME}"
    raw = read_verified_side_file(root_fd, INDEX_NAME, computed[INDEX_NAME], limits, model)
    weight_map = parse_index(raw, signed, what)
    held: dict[str, set[str]] = {}
    for tensor, target in weight_map.items():
        if target not in held and target in computed:
            header = computed[target].header
            held[target] = {t.name for t in header.tensors} if header is not None else set()
        if target in held and tensor not in held[target]:
            raise MalformedArtifactError(
                f"{what}: weight_map names `{tensor}`, which {target!r} does not hold"
            )
