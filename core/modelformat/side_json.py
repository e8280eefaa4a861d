"""JSON side files as a loader reads them: strict JSON, and the code they make a loader import.

The one home of the rules every JSON file of a model (config, tokenizer, index, at any depth) is held to,
shared by the verifier (step 5 of `modelsec.verifier.verification`, after the bytes matched the manifest)
and the signer (`sign` refuses before hashing what verification under the default policy will always
refuse, unless told to sign anyway):

* the file is at most `Limits.max_json_side_file_bytes` (larger: refused unread);
* it is strict JSON (`modelsec.strict_json.strict_loads`: no duplicate keys, no NaN/Infinity);
* its code references (`auto_map` at any nesting depth, `custom_pipelines.<task>.impl`) are refused unless
  remote code is allowed, and then only local references to signed modules pass.

Nothing here decides whether code is safe to run; which files are signed is the caller's.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Collection, Sequence

from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.modelformat.model_files import open_beneath
from modelsec.strict_json import strict_loads

__all__ = [
    "CodeReference",
    "check_json_side_file",
    "check_json_side_file_size",
    "check_remote_code",
    "is_json_side_file",
    "read_json_side_file",
    "remote_code_references",
]


def is_json_side_file(name: str) -> bool:
    """Whether the verifier parses `name` as a JSON side file (`*.json` in any case, at any depth).

    The suffix's case is ignored: on a case-insensitive file system (macOS, Windows) a loader asking for
    `config.json` opens `CONFIG.JSON`, so it is held to the same rules.
    """
    return name[-5:].lower() == ".json"


def check_json_side_file_size(name: str, size: int, limits: Limits, model: str) -> None:
    """Refuse, unread, a JSON side file larger than `limits.max_json_side_file_bytes`.

    Raises:
        MalformedArtifactError: Too large.
    """
    if size > limits.max_json_side_file_bytes:
        raise MalformedArtifactError(
            f"{model}/{name}: {size} bytes, larger than the JSON side-file limit of "
            f"{limits.max_json_side_file_bytes} bytes (Limits.max_json_side_file_bytes); refused unread"
        )


def read_json_side_file(root_fd: int, name: str, limits: Limits, model: str) -> bytes:
    """Read a JSON side file beneath `root_fd` (no link followed), bounded by the side-file limit.

    Raises:
        MalformedArtifactError: Too large (`check_json_side_file_size`), or it cannot be opened.
        PolicyViolationError: A symlink or special file (`model_files.open_beneath`).
    """
    fd = open_beneath(root_fd, name, what=model)
    with os.fdopen(fd, "rb") as f:
        check_json_side_file_size(name, os.fstat(f.fileno()).st_size, limits, model)
        data = f.read(limits.max_json_side_file_bytes + 1)
    check_json_side_file_size(name, len(data), limits, model)
    return data


def check_json_side_file(
    name: str, raw: bytes, signed_names: Collection[str], *, allow_remote_code: bool, model: str
) -> object:
    """Parse one JSON side file strictly and refuse the code references in it (`check_remote_code`).

    Args:
        name: The file's relative name in the model (e.g. `text_encoder/config.json`).
        raw: Its bytes (the caller has checked they are the signed ones, where that matters).
        signed_names: The model's signed (or to-be-signed) resource names.
        allow_remote_code: The policy's remote-code rule.
        model: Names the model in errors.

    Returns:
        The decoded document (`strict_loads(raw, bounded_ints=False)`), for a caller that also reads it as
        something else (a weight index).

    Raises:
        MalformedArtifactError: Not strict JSON, or a malformed code reference.
        PolicyViolationError: Code references the rule refuses.
    """
    what = f"{model}/{name}"
    # Every JSON file is parsed (no byte-level pre-filter): `"auto\\u005fmap"` is `auto_map` to a loader.
    doc = strict_loads(raw, what=what, bounded_ints=False)
    references = remote_code_references(doc, what=what)
    check_remote_code(name, references, signed_names, allow_remote_code=allow_remote_code, model=model)
    return doc


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
        # Only containers can hold a code reference below them: scalars (most of a tokenizer's vocabulary)
        # are skipped without building their path.
        if isinstance(value, list):
            nested = [(f"{path}[{i}]", v) for i, v in enumerate(value) if isinstance(v, (list, dict))]
            stack.extend(reversed(nested))
            continue
        if not isinstance(value, dict):
            continue
        for key, item in reversed(list(value.items())):
            if key != "auto_map" and key != "custom_pipelines" and not isinstance(item, (list, dict)):
                continue
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
