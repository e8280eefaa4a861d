"""Reading the operator's configuration files: bounded read, strict YAML, then a typed pydantic model.

Every configuration file (`kind: ModelPolicy`, `kind: ServerConfig`, the release gate spec) goes through
the same three steps, each failing closed with a `PolicyError` that names the file and the field path
(`policies[0].keys[1].path`):

1. `read_config` reads at most `MAX_CONFIG_BYTES` of a regular file (`modelsec.safe_io.read_regular_file`);
2. `load_yaml` parses YAML (a superset of JSON) with a SafeLoader that refuses duplicate and non-string keys;
3. `validate` checks the parsed document against a `ConfigModel`: unknown fields are refused, values are
   checked strictly (no string-to-number or number-to-bool coercion, no inf/NaN), and pydantic's
   `ValidationError` is turned into one `PolicyError` (it never escapes).

Each file has one model, beside its reader: `modelsec.service.config.ServerConfig` and
`modelsec.release.gate_spec.GateSpec` are the frozen values the code uses (paths resolved against the
file's directory by `ConfigPath`, through `validate(..., base_dir=)`; checks across fields in model
validators); `modelsec.policy.models` holds the policy file's shape, which `modelsec.policy` turns into
`Policy` values (loaded keys, compiled patterns). This module holds what the models share: the base model,
the field types and validators used by more than one file (`ReadAs` for a field whose value differs from
its shape in the file), and `json_schema(model, id)`, the JSON Schema published under `schemas/` for
editors (`scripts/gen_schemas.py`; the models' docstrings are the schemas' descriptions).

`null` is never a value: a field given as `null` (in YAML also a key with nothing after it, such as an
`attestations.robustness:` whose body was mis-indented) is refused instead of being read as "left out".
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from modelsec.errors import PolicyError
from modelsec.safe_io import read_regular_file

__all__ = [
    "API_VERSION",
    "CONTROL_CHARACTERS",
    "MAX_CONFIG_BYTES",
    "NAME_PATTERN",
    "PRINTABLE_SCHEMA",
    "SHA256_HEX_PATTERN",
    "ConfigModel",
    "ConfigPath",
    "Fraction",
    "Listen",
    "Name",
    "ReadAs",
    "Role",
    "Text",
    "all_roles",
    "check_listen",
    "json_schema",
    "load_yaml",
    "no_control",
    "read_config",
    "relative_to_file",
    "validate",
]

MAX_CONFIG_BYTES = 1 << 20
_MAX_SHOWN = 80  # characters of an offending value quoted in a message
API_VERSION = "modelsec.dev/v1alpha1"  # equal to modelsec.policy.API_VERSION (a test checks)
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LISTEN = r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SHA256_HEX_PATTERN = r"^[0-9a-f]{64}$"

M = TypeVar("M", bound="ConfigModel")


class ConfigModel(BaseModel):
    """Base of the configuration file models: camelCase names, unknown fields and inf/NaN refused.

    Validation is strict (a YAML string is never read as a number or a boolean); fields holding enum
    values opt into lax mode one by one, since YAML gives their values as strings.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=False,
        hide_input_in_errors=False,
        defer_build=True,  # a process builds only the validators of the files it reads
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(str(k) for k, v in data.items() if v is None)
            if nulls:
                raise ValueError(f": {', '.join(nulls)} must not be null (leave a field out for its default)")
        return data


# --- Field types and validators shared by the configuration files ------------------------------------------


def no_control(value: str) -> str:
    """`value` if it holds no control character, else ValueError."""
    if CONTROL_CHARACTERS.search(value):
        raise ValueError(f"{value!r} holds a control character")
    return value


def check_listen(value: str) -> str:
    """`value` if it is `HOST:PORT` with a port up to 65535, else ValueError."""
    if not re.fullmatch(_LISTEN[1:-1], value):
        raise ValueError(f"must be HOST:PORT, got {value!r}")
    if int(value.rsplit(":", 1)[1]) > 65535:
        raise ValueError(f"port out of range in {value!r}")
    return value


def _name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN[1:-1], value):
        raise ValueError(f"must match {NAME_PATTERN}")
    return value


PRINTABLE_SCHEMA = {"type": "string", "minLength": 1, "pattern": r"^[^\x00-\x1f\x7f-\x9f]+$"}
Text = Annotated[str, Field(min_length=1)]
Role = Literal["weights", "watermark", "gate"]
Listen = Annotated[str, AfterValidator(check_listen), WithJsonSchema({"type": "string", "pattern": _LISTEN})]
Name = Annotated[str, AfterValidator(_name), WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class ReadAs:
    """Field metadata: validate a value as `shape` (its JSON Schema and messages), then convert it.

    For a field whose value in the code differs from its shape in the file, such as a list of roles used
    as a frozenset: `Annotated[frozenset[Role], ReadAs(list[Role], frozenset)]`. With `with_info`,
    `convert` also gets pydantic's `ValidationInfo` (whose `context` holds `base_dir` and `source`).
    A Python caller may pass a `Path` where the file has a string.
    """

    def __init__(self, shape: Any, convert: Callable[..., Any], *, with_info: bool = False) -> None:
        self.shape, self.convert, self.with_info = shape, convert, with_info

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        inner = handler.generate_schema(self.shape)
        if self.with_info:
            converted = core_schema.with_info_after_validator_function(self.convert, inner)
        else:
            converted = core_schema.no_info_after_validator_function(self.convert, inner)
        return core_schema.no_info_before_validator_function(_path_text, converted)


def _path_text(value: object) -> object:
    return str(value) if isinstance(value, PurePath) else value


def relative_to_file(value: str, info: core_schema.ValidationInfo) -> Path:
    """`value` as a path; a relative one is relative to the file's directory (`validate(..., base_dir=)`)."""
    base = (info.context or {}).get("base_dir")
    return Path(value) if base is None or os.path.isabs(value) else Path(base) / value


# A path in a file: a non-empty string, relative to the file's directory; in Python also a `Path`.
ConfigPath = Annotated[Path, ReadAs(Text, relative_to_file, with_info=True)]


def all_roles() -> list[Role]:
    """Every role, the default of a key's or an authority's `roles`."""
    return ["gate", "watermark", "weights"]


class _NoNullSchema(GenerateJsonSchema):
    """Optional fields are "may be left out", never "may be null" (see the module docstring)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])


def json_schema(model: type[ConfigModel], schema_id: str) -> dict[str, Any]:
    """The published JSON Schema of a configuration file model (draft 2020-12, aliases as field names)."""
    schema = model.model_json_schema(by_alias=True, schema_generator=_NoNullSchema)
    _tidy(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": schema_id, **schema}


def _tidy(node: object) -> None:
    """Drop the generated per-field titles (`Minrobustaccuracy`) and optional fields' `null` defaults."""
    if isinstance(node, dict):
        for prop in (node.get("properties") or {}).values():
            prop.pop("title", None)
            if "default" in prop and prop["default"] is None:
                del prop["default"]
        for value in node.values():
            _tidy(value)
    elif isinstance(node, list):
        for value in node:
            _tidy(value)


# --- Reading and validating --------------------------------------------------------------------------------


def read_config(path: Path, what: str, *, max_bytes: int = MAX_CONFIG_BYTES) -> tuple[bytes, object]:
    """Read and parse a YAML/JSON configuration file of at most `max_bytes` bytes.

    Args:
        path: The file.
        what: What the file is, for messages (`policy file`, `server configuration`).
        max_bytes: Largest accepted size.

    Returns:
        The bytes read and the parsed document (not yet validated).

    Raises:
        PolicyError: Unreadable, not a regular file (a FIFO or device is refused without blocking), too
            large, or not YAML/JSON (see `load_yaml`).
    """
    raw = read_regular_file(path, what, max_bytes=max_bytes, error=PolicyError)
    return raw, load_yaml(raw, str(path))


def load_yaml(raw: bytes, source: str) -> object:
    """YAML (a superset of JSON) with string keys only, no duplicates and no arbitrary tags (SafeLoader).

    Raises:
        PolicyError: Not YAML, a duplicate or non-string mapping key (with its line and column), or nesting
            deeper than the interpreter's recursion limit.
    """
    import yaml

    class _StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(
        loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False
    ) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            at = f"line {key_node.start_mark.line + 1}, column {key_node.start_mark.column + 1}"
            # Every key of a configuration document is a field name: a list or mapping as a key
            # (`{[a]: 1}`, `? [a, b]`) is unhashable in Python, and a number or boolean key is a typo.
            key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                shown = type(key).__name__ if isinstance(key_node, yaml.ScalarNode) else key_node.id
                raise PolicyError(f"{source}: {at}: a mapping key must be a string, not {shown}")
            if key in seen:
                raise PolicyError(f"{source}: duplicate key {key!r} ({at})")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    _StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    try:
        return yaml.load(raw, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise PolicyError(f"{source}: {_yaml_problem(e)}") from e
    except RecursionError:  # PyYAML composes and constructs recursively: `[[[[...` exhausts the stack
        raise PolicyError(f"{source}: not valid YAML/JSON: nested too deeply") from None


def _yaml_problem(error: Exception) -> str:
    """One line: `line L, column C: not valid YAML/JSON: <problem> (<context> at line L, column C)`."""
    import yaml

    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    def one_line(text: object) -> str:
        return " ".join(str(text).split())

    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return f"not valid YAML/JSON: {one_line(error)}"
    text = f"{at(error.problem_mark)}: not valid YAML/JSON: {one_line(error.problem)}"
    if error.context:
        started = f" started at {at(error.context_mark)}" if error.context_mark is not None else ""
        text += f" ({one_line(error.context)}{started})"
    return text


def validate(model: type[M], doc: object, source: str, *, base_dir: Path | None = None) -> M:
    """Validate a parsed document against `model`.

    Args:
        model: The file's model.
        doc: What `load_yaml` returned.
        source: The file (or other origin), first in every message.
        base_dir: The directory relative `ConfigPath` fields are resolved against (the file's).

    Returns:
        The validated model. Nothing outside the document (paths, keys) has been checked.

    Raises:
        PolicyError: The document does not fit the model; the message names every offending field path.
    """
    try:
        return model.model_validate(doc, context={"base_dir": base_dir, "source": source})
    except ValidationError as e:
        raise PolicyError(f"{source}: " + "; ".join(_messages(e))) from None
    except RecursionError:  # a document nested deeper than any model, e.g. inside a free-form field
        raise PolicyError(f"{source}: nested too deeply") from None


def field_path(loc: tuple[int | str, ...]) -> str:
    """`('policies', 0, 'keys', 1, 'path')` -> `policies[0].keys[1].path` (union tags left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith("_"):
            out += f".{part}" if out else part
    return out


def _messages(error: ValidationError) -> list[str]:
    """One message per offending field; unknown and missing fields grouped per mapping."""
    entries: dict[tuple[str, str], list[str]] = {}  # insertion order is the order of the messages
    for err in error.errors(include_url=False):
        loc = tuple(err["loc"])
        if err["type"] in ("extra_forbidden", "missing") and loc:
            what = "unknown field(s)" if err["type"] == "extra_forbidden" else "missing field(s)"
            entries.setdefault((field_path(loc[:-1]), what), []).append(str(loc[-1]))
            continue
        where, text = field_path(loc), _describe(err)
        if text.startswith(":"):  # a check about a whole mapping
            entries.setdefault((f"{where}{text}" if where else text[1:].lstrip(), ""), [])
        else:
            entries.setdefault((f"{where} {text}" if where else text, ""), [])
    return [
        f"{where + ': ' if where else ''}{what} {sorted(names)}" if what else where
        for (where, what), names in entries.items()
    ]


def _describe(err: Any) -> str:
    """The part of a message after the field path, in the project's wording."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind in ("value_error", "assertion_error"):
        # Custom checks raise ValueError("must ...") for a field, or ValueError(": ...") for a mapping.
        return str(ctx.get("error", err["msg"]))
    if kind == "bool_type":
        return "must be true or false"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "must be a mapping"
    if kind == "list_type":
        return "must be a list"
    if kind == "string_too_short":
        return "must be a non-empty string"
    if kind == "too_short":
        return "must not be empty"
    if kind == "float_type" and isinstance(value, str) and _looks_numeric(value):
        # PyYAML follows YAML 1.1, where an exponent needs a dot in the mantissa: `1e-9` is text.
        return f"must be a number, not the text {value!r} (YAML reads 1e-9 as text: write 1.0e-9)"
    if kind == "finite_number":
        return f"must be a finite number, got {_shown(value)}"
    text = re.sub(r"^\w+ should ", "must ", err["msg"])  # "Input should be", "String should match", ...
    if kind.endswith("_type"):
        return f"{text}, not {type(value).__name__}"
    return f"{text}, got {_shown(value)}"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
