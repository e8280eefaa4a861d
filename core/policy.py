"""Verification policy: which keys are trusted, which algorithms must have signed, what is refused.

Two levels:

* `Policy` is what one verification applies (keys, required algorithms, refusals, limits). Its defaults are
  the safe ones of DESIGN.md decision 6 and apply from the first `modelsec verify`, before any policy file
  exists: pickle formats and remote code are refused even when signed.
* `PolicySet` is the policy *file* (YAML or JSON, `apiVersion: modelsec.dev/v1alpha1`, `kind: ModelPolicy`):
  named policies, each matching model references by glob (`oci://registry/models/**`,
  `file:///models/**`; a local directory is matched as `file://<real path>`), and `noMatch: deny`. It is
  validated strictly: unknown fields, duplicate keys, wrong types and unreadable keys are `PolicyError`s
  naming the field. Loaded from a path or from `$MODELSEC_POLICY`.

Example:
```yaml
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: internal-models
    match: ["file:///models/**"]
    keys:
      - {path: trust/ci-p256.pub.pem, name: ci-ecdsa, roles: [weights]}
      - trust/ci-sm2.pub.pem               # shorthand: all roles
    requireAlgorithms: [ecdsa-p256, sm2]
    checkHashes: [sha256]                  # file digests the loader recomputes (default: every signed one)
    allowRemoteCode: false
    limits: {maxFiles: 4096}
    attestations:
      robustness: {attack: pgd-linf, minEps: 0.03, minRobustAccuracy: 0.85, rule: strict, minSamples: 500,
                   maxAge: 30d}
      watermark: {required: true, minConfidence: 0.92, maxFalsePositive: 1e-9}
    attestationStore: /var/lib/modelsec/attestations  # besides model.watermark.sig / model.gate.sig; a
                                                      # path or file:// | sqlite:// | grpc(s):// URI
                                                      # (`attestationDir`: the older name, a path)
noMatch: deny
```
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import Error, PolicyError, PolicyViolationError
from modelsec.limits import SAFETENSORS_MAX_HEADER_SIZE, Limits
from modelsec.signer.keys import TrustedKey, load_trusted_key_file

__all__ = [
    "API_VERSION",
    "POLICY_ENV",
    "Policy",
    "PolicySet",
    "RobustnessRequirement",
    "WatermarkRequirement",
    "model_uri",
]

API_VERSION = "modelsec.dev/v1alpha1"
POLICY_ENV = "MODELSEC_POLICY"
ROLES = frozenset({"weights", "watermark", "gate"})
_MAX_POLICY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RobustnessRequirement:
    """What a robustness-gate attestation must show (predicate `https://modelsec.dev/robustness-gate/v1`).

    Attributes:
        attack: The attack name the gate must have run (`pgd-linf`).
        min_eps: Smallest accepted perturbation budget ε (input units, L∞).
        min_robust_accuracy: Threshold on robust accuracy (fraction in [0, 1]).
        rule: `point` (the measured accuracy) or `strict` (the lower end of its 95% Wilson interval).
        min_samples: Fewest evaluated examples accepted.
        max_age_seconds: Oldest accepted `finishedAt`, or None for no freshness rule.
    """

    attack: str = "pgd-linf"
    min_eps: float = 0.0
    min_robust_accuracy: float = 0.0
    rule: str = "point"
    min_samples: int = 1
    max_age_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class WatermarkRequirement:
    """What a watermark attestation must show (predicate `https://modelsec.dev/watermark/v1`).

    Attributes:
        min_confidence: Lowest accepted detection confidence recorded at embed time (default 0.92).
        max_false_positive: Highest accepted false-positive probability at embed time (default 1e-9).
        key_file: The owner's watermark key, for nodes that hold it: the mark is then re-detected in the
            verified weights (None: the signed embed-time detection is trusted).
    """

    min_confidence: float = 0.92
    max_false_positive: float = 1e-9
    key_file: Path | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """What a verifier trusts and requires.

    Attributes:
        keys: Trusted public keys; keys are never taken from an artifact.
        require_algorithms: Every one of these must have produced a valid signature.
        allow_remote_code: Accept `*.py` files and `auto_map` in config files (default: refuse).
        refuse_pickle: Refuse pickle formats (`.bin`, `.pt`, ...) in a model (default: refuse). Even when
            False, modelsec never unpickles anything: the files are only verified as opaque bytes.
        check_hashes: File digest algorithms the verifier/loader recomputes; empty means every hash type
            of every verified bundle.
        limits: Parsing and size limits.
        name: The policy's name in diagnostics.
        robustness: A robustness-gate attestation required, or None.
        watermark: A watermark attestation required, or None.
        attestation_store: The attestation store searched besides the reserved names in the model
            directory: a directory path or a store URI (`modelsec.verifier.stores.open_store`), relative
            paths already resolved against the policy file's directory.
        require_digest: References (admission) must pin the model root digest.
    """

    keys: tuple[TrustedKey, ...]
    require_algorithms: frozenset[SignatureAlgorithm] = frozenset()
    allow_remote_code: bool = False
    refuse_pickle: bool = True
    check_hashes: frozenset[HashAlgorithm] = frozenset()
    limits: Limits = field(default_factory=Limits)
    name: str = "command line"
    robustness: RobustnessRequirement | None = None
    watermark: WatermarkRequirement | None = None
    attestation_store: str | None = None
    require_digest: bool = True

    @property
    def requires_attestations(self) -> bool:
        """Whether any attestation beyond the weights signatures is required."""
        return self.robustness is not None or self.watermark is not None

    def __post_init__(self) -> None:
        if not self.keys:
            raise PolicyError(f"policy {self.name!r} trusts no key: give at least one public key")

    @classmethod
    def from_key_files(
        cls,
        paths: Iterable[Path],
        *,
        require: Iterable[SignatureAlgorithm] = (),
        allow_remote_code: bool = False,
        limits: Limits | None = None,
    ) -> Policy:
        """A policy trusting the public keys in `paths` (PEM SubjectPublicKeyInfo), defaults otherwise.

        Raises:
            PolicyError: No key given.
            KeyMaterialError: A key file cannot be read or parsed.
            UnsupportedAlgorithmError: A key of an unsupported type.
        """
        return cls(
            keys=tuple(load_trusted_key_file(p) for p in paths),
            require_algorithms=frozenset(require),
            allow_remote_code=allow_remote_code,
            limits=limits or Limits(),
        )


def model_uri(path: Path) -> str:
    """The reference a local model directory or file is matched as: `file://<real path>`."""
    return "file://" + os.path.realpath(path)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """`**` matches anything (including `/`), `*` anything but `/`, `?` one character but `/`.

    "Anything" includes a line feed and every other character, for `*` and `**` alike (the regex is compiled
    with DOTALL): a directory name holding a line feed is matched like any other. Patterns themselves may
    not hold control characters (`_parse_policy` refuses them).
    """
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Entry:
    regexes: tuple[re.Pattern[str], ...]
    policy: Policy


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A validated policy file: named policies matched by model reference; no match means deny.

    Attributes:
        entries: The policies in file order (the first match wins).
        source: Where the policy came from (path or `$MODELSEC_POLICY`), for diagnostics.
        digest: Hex SHA-256 of the file bytes that were parsed ("" when built from a mapping): identifies
            this policy version (e.g. in the webhook's cache keys).
    """

    entries: tuple[_Entry, ...]
    source: str
    digest: str = ""

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The policies in file order."""
        return tuple(e.policy for e in self.entries)

    def for_uri(self, uri: str) -> Policy:
        """The first policy whose `match` globs cover `uri`.

        Raises:
            PolicyViolationError: No policy matches (`noMatch: deny`).
        """
        for entry in self.entries:
            if any(r.match(uri) for r in entry.regexes):
                return entry.policy
        raise PolicyViolationError(f"{uri}: no policy in {self.source} matches this model (noMatch: deny)")

    def for_model(self, path: Path) -> Policy:
        """The policy for a local model directory or file, matched as `file://<real path>`."""
        return self.for_uri(model_uri(path))

    @classmethod
    def from_file(cls, path: Path) -> PolicySet:
        """Load and validate a YAML or JSON policy file; key paths are relative to its directory.

        Raises:
            PolicyError: Unreadable, not YAML/JSON, or invalid (the message names the field).
            KeyMaterialError: A listed key cannot be read or parsed.
        """
        try:
            with open(path, "rb") as f:
                raw = f.read(_MAX_POLICY_BYTES + 1)
        except OSError as e:
            raise PolicyError(f"{path}: cannot read the policy file: {e.strerror}") from e
        if len(raw) > _MAX_POLICY_BYTES:
            raise PolicyError(f"{path}: policy file larger than {_MAX_POLICY_BYTES} bytes")
        parsed = cls.from_mapping(_load_yaml(raw, str(path)), base_dir=path.parent, source=str(path))
        return dataclasses.replace(parsed, digest=hashlib.sha256(raw).hexdigest())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PolicySet:
        """Load the policy file named by `$MODELSEC_POLICY`.

        Raises:
            PolicyError: The variable is unset or the file is invalid.
        """
        env = os.environ if environ is None else environ
        value = env.get(POLICY_ENV)
        if not value:
            raise PolicyError(f"${POLICY_ENV} is not set: point it at a policy file")
        return cls.from_file(Path(value))

    @classmethod
    def from_mapping(cls, doc: object, *, base_dir: Path, source: str) -> PolicySet:
        """Validate a parsed policy document.

        Raises:
            PolicyError: Invalid document (the message names the field).
            KeyMaterialError: A listed key cannot be read or parsed.
        """
        top = _mapping(
            doc, source, {"apiVersion", "kind", "policies", "noMatch"}, required={"apiVersion", "kind"}
        )
        if top["apiVersion"] != API_VERSION:
            raise PolicyError(f"{source}: apiVersion must be {API_VERSION!r}, got {top['apiVersion']!r}")
        if top["kind"] != "ModelPolicy":
            raise PolicyError(f"{source}: kind must be 'ModelPolicy', got {top['kind']!r}")
        if top.get("noMatch", "deny") != "deny":
            raise PolicyError(f"{source}: noMatch must be 'deny' (an unmatched model is never trusted)")
        raw_policies = top.get("policies", [])
        if not isinstance(raw_policies, list) or not raw_policies:
            raise PolicyError(f"{source}: policies must be a non-empty list")
        entries = []
        names: set[str] = set()
        for i, item in enumerate(raw_policies):
            entry = _parse_policy(item, f"{source}: policies[{i}]", base_dir)
            if entry.policy.name in names:
                raise PolicyError(f"{source}: policies[{i}].name {entry.policy.name!r} is used twice")
            names.add(entry.policy.name)
            entries.append(entry)
        return cls(tuple(entries), source)


_POLICY_FIELDS = {
    "name",
    "match",
    "keys",
    "requireAlgorithms",
    "requireDigest",
    "checkHashes",
    "allowRemoteCode",
    "refusePickle",
    "limits",
    "attestations",
    "attestationDir",
    "attestationStore",
}
_ROBUSTNESS_FIELDS = {"attack", "minEps", "minRobustAccuracy", "rule", "minSamples", "maxAge"}
_WATERMARK_FIELDS = {"required", "minConfidence", "maxFalsePositive", "keyFile"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_MAX_AGE_SECONDS = (
    100 * 365 * 86400
)  # a century: beyond it `maxAge` is a typo (or inf) that disables freshness
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LIMIT_FIELDS = {
    "maxFiles": "max_files",
    "maxDepth": "max_depth",
    "maxSafetensorsHeaderBytes": "max_safetensors_header_bytes",
    "maxTensorsPerFile": "max_tensors_per_file",
    "maxBundleBytes": "max_bundle_bytes",
    "maxJsonSideFileBytes": "max_json_side_file_bytes",
    "maxPathBytes": "max_path_bytes",
    "hashChunkBytes": "hash_chunk_bytes",
}


def _parse_store(doc: Mapping[str, Any], where: str, base_dir: Path) -> str | None:
    """`attestationStore` (a path or store URI) or its older name `attestationDir` (a path).

    A relative path (plain, or after `file://` / `sqlite://`) is resolved against the policy file's
    directory; the scheme itself is checked when the store is opened (`modelsec.verifier.stores`).
    """
    if "attestationStore" in doc and "attestationDir" in doc:
        raise PolicyError(f"{where}: give attestationStore or attestationDir (its older name), not both")
    name = "attestationStore" if "attestationStore" in doc else "attestationDir"
    store = doc.get(name)
    if store is None:
        return None
    if not isinstance(store, str) or not store or _CONTROL.search(store):
        raise PolicyError(f"{where}.{name} must be a path or a store URI")
    scheme, sep, target = store.partition("://")
    if not sep:
        return str(base_dir / store)
    if name == "attestationDir":
        raise PolicyError(f"{where}.attestationDir must be a path (use attestationStore for a store URI)")
    if not target:
        raise PolicyError(f"{where}.attestationStore {store!r} names no directory, file or server")
    if scheme in ("file", "sqlite"):  # the schemes whose target is a local path
        return f"{scheme}://{base_dir / target}"
    return store


def _parse_policy(item: object, where: str, base_dir: Path) -> _Entry:
    doc = _mapping(item, where, _POLICY_FIELDS, required={"name", "match", "keys"})
    name = doc["name"]
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{where}.name must be a non-empty string")
    match = _string_list(doc["match"], f"{where}.match")
    for j, pattern in enumerate(match):
        if _CONTROL.search(pattern):
            raise PolicyError(f"{where}.match[{j}] {pattern!r} holds a control character")
    keys = tuple(
        _parse_key(k, f"{where}.keys[{j}]", base_dir)
        for j, k in enumerate(_list(doc["keys"], f"{where}.keys"))
    )
    if not keys:
        raise PolicyError(f"{where}.keys must list at least one key")
    require = _enum_list(doc.get("requireAlgorithms", []), SignatureAlgorithm, f"{where}.requireAlgorithms")
    hashes = _enum_list(doc.get("checkHashes", []), HashAlgorithm, f"{where}.checkHashes")
    for field_name in ("allowRemoteCode", "refusePickle", "requireDigest"):
        if field_name in doc and not isinstance(doc[field_name], bool):
            raise PolicyError(f"{where}.{field_name} must be true or false")
    limits = _parse_limits(doc.get("limits", {}), f"{where}.limits")
    robustness, watermark = _parse_attestations(
        doc.get("attestations", {}), f"{where}.attestations", base_dir
    )
    store = _parse_store(doc, where, base_dir)
    policy = Policy(
        keys=keys,
        require_algorithms=frozenset(require),
        allow_remote_code=doc.get("allowRemoteCode", False),
        refuse_pickle=doc.get("refusePickle", True),
        check_hashes=frozenset(hashes),
        limits=limits,
        name=name,
        robustness=robustness,
        watermark=watermark,
        attestation_store=store,
        require_digest=doc.get("requireDigest", True),
    )
    return _Entry(tuple(_glob_regex(p) for p in match), policy)


def _number(doc: Mapping[str, Any], key: str, where: str, default: float, low: float, high: float) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise PolicyError(f"{where}.{key} must be a number in [{low}, {high}]")
    return float(value)


def _parse_attestations(
    item: object, where: str, base_dir: Path
) -> tuple[RobustnessRequirement | None, WatermarkRequirement | None]:
    doc = _mapping(item, where, {"robustness", "watermark"})
    robustness = None
    if "robustness" in doc:
        w = f"{where}.robustness"
        r = _mapping(doc["robustness"], w, _ROBUSTNESS_FIELDS)
        attack = r.get("attack", "pgd-linf")
        if attack != "pgd-linf":
            raise PolicyError(f"{w}.attack: only 'pgd-linf' is supported, got {attack!r}")
        rule = r.get("rule", "point")
        if rule not in ("point", "strict"):
            raise PolicyError(f"{w}.rule must be 'point' or 'strict'")
        min_samples = r.get("minSamples", 1)
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
            raise PolicyError(f"{w}.minSamples must be a positive integer")
        max_age = None
        if "maxAge" in r:
            m = _DURATION.match(str(r["maxAge"]))
            if not m:
                raise PolicyError(f"{w}.maxAge must be a duration like 3600s, 90m, 12h or 30d")
            max_age = float(m.group(1)) * _UNITS[m.group(2)]
            if not 0 < max_age <= _MAX_AGE_SECONDS:
                raise PolicyError(f"{w}.maxAge must be more than 0s and at most 36500d")
        robustness = RobustnessRequirement(
            attack=attack,
            min_eps=_number(r, "minEps", w, 0.0, 0.0, 1e9),
            min_robust_accuracy=_number(r, "minRobustAccuracy", w, 0.0, 0.0, 1.0),
            rule=rule,
            min_samples=min_samples,
            max_age_seconds=max_age,
        )
    watermark = None
    if "watermark" in doc:
        w = f"{where}.watermark"
        m_doc = _mapping(doc["watermark"], w, _WATERMARK_FIELDS)
        required = m_doc.get("required", True)
        if not isinstance(required, bool):
            raise PolicyError(f"{w}.required must be true or false")
        key_file = m_doc.get("keyFile")
        if key_file is not None and (not isinstance(key_file, str) or not key_file):
            raise PolicyError(f"{w}.keyFile must be a path")
        if required:
            watermark = WatermarkRequirement(
                min_confidence=_number(m_doc, "minConfidence", w, 0.92, 0.0, 1.0),
                max_false_positive=_number(m_doc, "maxFalsePositive", w, 1e-9, 0.0, 1.0),
                key_file=(base_dir / key_file) if key_file else None,
            )
    return robustness, watermark


def _parse_key(item: object, where: str, base_dir: Path) -> TrustedKey:
    if isinstance(item, str):
        path, name, roles = item, None, frozenset[str]()
    else:
        doc = _mapping(item, where, {"path", "name", "roles"}, required={"path"})
        path, name = doc["path"], doc.get("name")
        if not isinstance(path, str) or (name is not None and not isinstance(name, str)):
            raise PolicyError(f"{where}: path and name must be strings")
        roles = frozenset(_string_list(doc.get("roles", sorted(ROLES)), f"{where}.roles"))
        unknown = roles - ROLES
        if unknown:
            raise PolicyError(f"{where}.roles: unknown role(s) {sorted(unknown)}; use {sorted(ROLES)}")
    full = Path(path) if os.path.isabs(path) else base_dir / path
    try:
        return load_trusted_key_file(full, name=name or Path(path).name, roles=roles)
    except Error as e:
        raise type(e)(f"{where}: {e.diagnostics()}") from e


def _parse_limits(item: object, where: str) -> Limits:
    doc = _mapping(item, where, set(_LIMIT_FIELDS))
    values: dict[str, int] = {}
    for key, value in doc.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PolicyError(f"{where}.{key} must be a positive integer")
        values[_LIMIT_FIELDS[key]] = value
    defaults = Limits()
    for f in fields(Limits):
        if f.name == "max_safetensors_header_bytes":
            continue
        if f.name in values and values[f.name] > getattr(defaults, f.name) * 16:
            raise PolicyError(f"{where}: {f.name} is unreasonably large")
    if values.get("max_safetensors_header_bytes", 0) > SAFETENSORS_MAX_HEADER_SIZE:
        raise PolicyError(
            f"{where}.maxSafetensorsHeaderBytes may be at most {SAFETENSORS_MAX_HEADER_SIZE} "
            "(safetensors' own MAX_HEADER_SIZE)"
        )
    return Limits(**values)


def _mapping(item: object, where: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    if not isinstance(item, dict):
        raise PolicyError(f"{where} must be a mapping")
    unknown = set(item) - allowed
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {sorted(map(str, unknown))}")
    missing = required - set(item)
    if missing:
        raise PolicyError(f"{where}: missing field(s) {sorted(missing)}")
    return item


def _list(item: object, where: str) -> list[Any]:
    if not isinstance(item, list):
        raise PolicyError(f"{where} must be a list")
    return item


def _string_list(item: object, where: str) -> list[str]:
    items = _list(item, where)
    if not all(isinstance(x, str) and x for x in items):
        raise PolicyError(f"{where} must be a list of non-empty strings")
    return items


def _enum_list(item: object, enum: type[SignatureAlgorithm] | type[HashAlgorithm], where: str) -> list[Any]:
    result = []
    for value in _string_list(item, where):
        try:
            result.append(enum(value))
        except ValueError:
            choices = ", ".join(e.value for e in enum)
            raise PolicyError(f"{where}: {value!r} is not one of {choices}") from None
    return result


def _load_yaml(raw: bytes, source: str) -> object:
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
            # Every key of a policy or server document is a field name: a list or mapping as a key
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
        raise PolicyError(f"{source}: not valid YAML/JSON: {e}") from e
    except RecursionError:  # PyYAML composes and constructs recursively: `[[[[...` exhausts the stack
        raise PolicyError(f"{source}: not valid YAML/JSON: nested too deeply") from None
