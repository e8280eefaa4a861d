"""Typed models of the three configuration files: `ModelPolicy`, `ServerConfig` and the release `GateSpec`.

The models hold the files' shapes, types, ranges and per-field syntax, so that they are also their
published JSON Schemas (`schemas/*.schema.json`, `scripts/gen_schemas.py`). Paths stay strings here: the
loaders (`modelsec.policy`, `modelsec.service.config`, `modelsec.release`) resolve them against the file's
directory, load the keys and apply the checks that involve more than one field while converting a model
into the frozen dataclasses the rest of modelsec uses.

`null` is never a value: a field given as `null` (in YAML also a key with nothing after it, such as an
`attestations.robustness:` whose body was mis-indented) is refused instead of being read as "left out".
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.config import ConfigModel as _Base
from modelsec.limits import SAFETENSORS_MAX_HEADER_SIZE, Limits

__all__ = [
    "API_VERSION",
    "MAX_AGE_SECONDS",
    "AuthorityModel",
    "GateSpecModel",
    "IdentityModel",
    "KeyRefModel",
    "NamespaceRuleModel",
    "PolicyFileModel",
    "PolicyModel",
    "Role",
    "ServerConfigModel",
    "check_listen",
    "json_schema",
]

API_VERSION = "modelsec.dev/v1alpha1"  # equal to modelsec.policy.API_VERSION (a test checks)
MAX_AGE_SECONDS = (
    100 * 365 * 86400
)  # a century: beyond it `maxAge` is a typo (or inf) that disables freshness
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LISTEN = r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_SHA256_HEX = r"^[0-9a-f]{64}$"


class _Model(_Base):
    """A configuration mapping in which no field is `null`."""

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(str(k) for k, v in data.items() if v is None)
            if nulls:
                raise ValueError(f": {', '.join(nulls)} must not be null (leave a field out for its default)")
        return data


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError(f"{value!r} holds a control character")
    return value


def check_listen(value: str) -> str:
    """`value` if it is `HOST:PORT` with a port up to 65535, else ValueError."""
    if not re.fullmatch(_LISTEN[1:-1], value):
        raise ValueError(f"must be HOST:PORT, got {value!r}")
    if int(value.rsplit(":", 1)[1]) > 65535:
        raise ValueError(f"port out of range in {value!r}")
    return value


def _sha256_hex(value: str) -> str:
    if not re.fullmatch(_SHA256_HEX[1:-1], value):
        raise ValueError("must be the token's SHA-256 as 64 lowercase hex digits")
    return value


def _name(value: str) -> str:
    if not re.fullmatch(_NAME[1:-1], value):
        raise ValueError(f"must match {_NAME}")
    return value


def _model_pattern(value: str) -> str:
    """A `match` glob must name a scheme: models are matched as `file://<real path>` or `oci://...` URIs."""
    if "://" not in value and not value.startswith(("*", "?", "[")):
        local = f"file://{value}" if value.startswith("/") else "file://<absolute path>"
        raise ValueError(
            f"{value!r} has no scheme and can never match: a local model is matched as file://<real path>, "
            f"a registry one as oci://REGISTRY/REPOSITORY (write {local!r})"
        )
    return value


def _store(value: str) -> str:
    if not value or _CONTROL.search(value):
        raise ValueError("must be a path or a store URI")
    return value


def _duration(value: object) -> float:
    """`3600s`, `90m`, `12h`, `30d` -> seconds, in (0, 36500d]."""
    m = _DURATION.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError("must be a duration like 3600s, 90m, 12h or 30d")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not 0 < seconds <= MAX_AGE_SECONDS:
        raise ValueError("must be more than 0s and at most 36500d")
    return seconds


def _header_bytes(value: int) -> int:
    if value > SAFETENSORS_MAX_HEADER_SIZE:
        raise ValueError(f"may be at most {SAFETENSORS_MAX_HEADER_SIZE} (safetensors' own MAX_HEADER_SIZE)")
    return value


def _instant(value: object) -> datetime:
    """An RFC 3339 time with its offset (YAML may already have made it a datetime) -> aware UTC datetime."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("must be an RFC 3339 time such as 2025-01-31T00:00:00Z") from None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be an RFC 3339 time with its offset, such as 2025-01-31T00:00:00Z")
    return value.astimezone(UTC)


Text = Annotated[str, Field(min_length=1)]
Instant = Annotated[
    datetime, BeforeValidator(_instant), WithJsonSchema({"type": "string", "format": "date-time"})
]
Role = Literal["weights", "watermark", "gate"]
Operation = Literal["signStatement", "gateResult", "watermarkRecord"]
_PRINTABLE = {"type": "string", "minLength": 1, "pattern": r"^[^\x00-\x1f\x7f-\x9f]+$"}
Pattern = Annotated[str, Field(min_length=1), AfterValidator(_no_control), WithJsonSchema(_PRINTABLE)]
ModelPattern = Annotated[
    str,
    Field(min_length=1),
    AfterValidator(_no_control),
    AfterValidator(_model_pattern),
    WithJsonSchema(_PRINTABLE),
]
Listen = Annotated[str, AfterValidator(check_listen), WithJsonSchema({"type": "string", "pattern": _LISTEN})]
Store = Annotated[str, AfterValidator(_store), WithJsonSchema(_PRINTABLE)]
Name = Annotated[str, AfterValidator(_name), WithJsonSchema({"type": "string", "pattern": _NAME})]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Sha256Hex = Annotated[str, Field(pattern=_SHA256_HEX)]
# As `runBy.server` in the predicates (modelsec.attestations.predicates.run_by).
Identity = Annotated[
    str,
    Field(min_length=1, max_length=1024),
    AfterValidator(_no_control),
    WithJsonSchema({**_PRINTABLE, "maxLength": 1024}),
]
# Enum values come from YAML as strings: these fields are validated in lax mode (value -> member only).
Signature = Annotated[SignatureAlgorithm, Field(strict=False)]
Hash = Annotated[HashAlgorithm, Field(strict=False)]


def _all_roles() -> list[Role]:
    return ["gate", "watermark", "weights"]


def _bound(name: str) -> Any:
    """A limit may be raised to 16 times its default; beyond that it is a typo."""
    return Field(default=None, ge=1, le=getattr(Limits(), name) * 16)


# --- ModelPolicy -------------------------------------------------------------------------------------------


class KeyRefModel(_Model):
    """A trusted public key file (PEM SubjectPublicKeyInfo), relative to the policy file."""

    path: str
    name: str | None = None
    roles: list[Role] = Field(
        default_factory=_all_roles,
        min_length=1,
        description="left out: every role; an empty list is refused (it would read as no role)",
    )
    valid_from: Instant | None = Field(
        default=None, description="signatures must be timestamped (or verified) at or after this time"
    )
    valid_until: Instant | None = Field(
        default=None,
        description="signatures must be timestamped (or, without a trusted timestamp, verified) by then",
    )

    @model_validator(mode="after")
    def _window(self) -> KeyRefModel:
        if (
            self.valid_from is not None
            and self.valid_until is not None
            and self.valid_from >= self.valid_until
        ):
            raise ValueError(": validFrom must be before validUntil")
        return self


def _key_form(value: Any) -> str:
    return "_path" if isinstance(value, str) else "_mapping"


KeyEntry = Annotated[
    Annotated[Text, Tag("_path")] | Annotated[KeyRefModel, Tag("_mapping")],
    Discriminator(_key_form),
]


class RobustnessModel(_Model):
    """What a robustness-gate attestation must show."""

    attack: Literal["pgd-linf"] = "pgd-linf"
    min_eps: float = Field(default=0.0, ge=0.0, le=1e9)
    min_robust_accuracy: Fraction = 0.0
    rule: Literal["point", "strict"] = "point"
    min_samples: int = Field(default=1, ge=1)
    max_age: Annotated[
        float | None,
        BeforeValidator(_duration),
        WithJsonSchema({"type": "string", "pattern": _DURATION.pattern}),
    ] = None
    # How the gate was run: the bounds are those of the gate predicate's own fields.
    min_steps: int = Field(default=1, ge=1, le=10**7)
    min_restarts: int = Field(default=1, ge=1, le=10**5)
    dataset_digests: list[Sha256Hex] | None = Field(default=None, min_length=1, max_length=1024)
    require_server_run: bool = False


class WatermarkModel(_Model):
    """What a watermark attestation must show (`required: false` disables the requirement)."""

    model_config = ConfigDict(json_schema_extra={"dependentRequired": {"message": ["keyFile"]}})
    required: bool = True
    min_confidence: Fraction = 0.92
    max_false_positive: Fraction = 1e-9
    key_file: Text | None = None
    max_fidelity_loss: Fraction | None = None  # issue 18: the attested fidelity loss must be at most this
    require_server_run: bool = False
    message: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="the message the mark must carry, as `modelsec watermark embed -m` takes it (UTF-8 text, "
        "or hex:/0x digits); needs keyFile, since an attestation commits to its message under the key",
    )

    @model_validator(mode="after")
    def _message_needs_key(self) -> WatermarkModel:
        if self.message is not None and self.key_file is None:
            raise ValueError(
                ": message needs keyFile (an attestation's messageCommitment is keyed by the watermark key)"
            )
        return self


class AttestationsModel(_Model):
    """Attestations required besides the weights signatures."""

    robustness: RobustnessModel | None = None
    watermark: WatermarkModel | None = None


class LimitsModel(_Model):
    """Parsing and size limits (`modelsec.limits.Limits`); each at least 1."""

    max_files: int | None = _bound("max_files")
    max_depth: int | None = _bound("max_depth")
    max_safetensors_header_bytes: Annotated[
        int | None,
        Field(ge=1),
        AfterValidator(_header_bytes),
        WithJsonSchema({"type": "integer", "minimum": 1, "maximum": SAFETENSORS_MAX_HEADER_SIZE}),
    ] = None
    max_tensors_per_file: int | None = _bound("max_tensors_per_file")
    max_bundle_bytes: int | None = _bound("max_bundle_bytes")
    max_json_side_file_bytes: int | None = _bound("max_json_side_file_bytes")
    max_path_bytes: int | None = _bound("max_path_bytes")
    hash_chunk_bytes: int | None = _bound("hash_chunk_bytes")


class IdentityModel(_Model):
    """An identity a certificate must name (exact or regular expression, matched in full) and its issuer."""

    issuer: Pattern | None = None
    issuer_regexp: Pattern | None = None

    @model_validator(mode="after")
    def _one_issuer(self) -> IdentityModel:
        if self.issuer is not None and self.issuer_regexp is not None:
            raise ValueError(": give issuer or issuerRegexp, not both")
        return self


class X509IdentityModel(IdentityModel):
    """A leaf certificate's SAN (URI, email or Sigstore otherName), with an optional OIDC issuer."""

    san: Pattern | None = None
    san_regexp: Pattern | None = None

    @model_validator(mode="after")
    def _one_san(self) -> X509IdentityModel:
        if (self.san is None) == (self.san_regexp is None):
            raise ValueError(": give exactly one of san and sanRegexp")
        return self


class SigstoreIdentityModel(IdentityModel):
    """A Fulcio certificate's identity (like cosign's `--certificate-identity[-regexp]`) and its issuer."""

    identity: Pattern | None = None
    identity_regexp: Pattern | None = None

    @model_validator(mode="after")
    def _both(self) -> SigstoreIdentityModel:
        if (self.identity is None) == (self.identity_regexp is None):
            raise ValueError(": give exactly one of identity and identityRegexp")
        if self.issuer is None and self.issuer_regexp is None:
            raise ValueError(": a keyless identity needs issuer or issuerRegexp")
        return self


class X509Model(_Model):
    """Certificate trust: PEM root files (relative to the policy file) and the identities they vouch for."""

    roots: list[Text] = Field(min_length=1)
    identities: list[X509IdentityModel] = Field(min_length=1)


class SigstoreModel(_Model):
    """Keyless trust: a Sigstore trusted root (`production`, `staging` or a `trusted_root.json` file)."""

    trusted_root: Text = "production"
    identities: list[SigstoreIdentityModel] = Field(min_length=1)


class AuthorityModel(_Model):
    """A certificate or Sigstore authority (one of `x509` and `sigstore`) and the roles it may sign."""

    name: Name
    roles: list[Role] = Field(
        default_factory=_all_roles,
        min_length=1,
        description="left out: every role; an empty list is refused (it would read as no role)",
    )
    x509: X509Model | None = None
    sigstore: SigstoreModel | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> AuthorityModel:
        if (self.x509 is None) == (self.sigstore is None):
            raise ValueError(": give exactly one of x509 and sigstore")
        return self


class TimestampAuthorityModel(_Model):
    """An RFC 3161 timestamp authority: PEM files of its chain (self-issued ones are the trusted roots)."""

    name: Name
    cert_chain: list[Text] = Field(min_length=1)


class PolicyModel(_Model):
    """One named policy: the model references it covers and what it requires."""

    name: Text
    match: list[ModelPattern] = Field(min_length=1)
    keys: list[KeyEntry] = Field(
        default_factory=list, description="pinned keys; at least one key or authority"
    )
    authorities: list[AuthorityModel] = Field(default_factory=list)
    timestamp_authorities: list[TimestampAuthorityModel] = Field(
        default_factory=list, description="RFC 3161 TSAs whose timestamps place signatures in time"
    )
    require_timestamp: bool = Field(
        default=False, description="every weights signature needs a timestamp of a timestampAuthorities TSA"
    )
    require_algorithms: list[Signature] = Field(default_factory=list)
    require_digest: bool = True
    check_hashes: list[Hash] = Field(
        default_factory=list,
        description="file digests recomputed; empty: every hash type of every verified bundle",
    )
    allow_remote_code: bool = False
    refuse_pickle: bool = True
    limits: LimitsModel = Field(default_factory=LimitsModel)
    attestations: AttestationsModel = Field(default_factory=AttestationsModel)
    attestation_dir: Store | None = None
    attestation_store: Store | None = None
    mode: Literal["enforce", "warn"] = Field(
        default="enforce", description="admission: deny (enforce) or allow with a warning (warn) on failure"
    )
    namespaces: list[Pattern] = Field(
        default_factory=list, description="admission: namespace globs the policy applies in (empty: all)"
    )


class NamespaceRuleModel(_Model):
    """Admission rules for the namespaces whose names match one of `namespaces` (globs)."""

    namespaces: list[Pattern] = Field(min_length=1)
    no_match: Literal["deny", "warn", "allow"] = "deny"
    require_model: bool = False


class PolicyFileModel(_Model):
    """A policy file: `apiVersion: modelsec.dev/v1alpha1`, `kind: ModelPolicy`."""

    model_config = ConfigDict(title="ModelPolicy")

    api_version: Literal["modelsec.dev/v1alpha1"]
    kind: Literal["ModelPolicy"]
    policies: list[PolicyModel] = Field(min_length=1)
    no_match: Literal["deny"] = "deny"
    namespace_rules: list[NamespaceRuleModel] = Field(
        default_factory=list,
        description="admission: per-namespace noMatch and requireModel; the first match wins",
    )


# --- ServerConfig ------------------------------------------------------------------------------------------


class TlsModel(_Model):
    """Server certificate chain and key (PEM); `clientCA` turns on mutual TLS."""

    cert: Text
    key: Text
    client_ca: Text | None = Field(default=None, alias="clientCA")


class TokenModel(_Model):
    """A bearer token kept as its SHA-256."""

    identity: Text
    sha256: Annotated[
        str, AfterValidator(_sha256_hex), WithJsonSchema({"type": "string", "pattern": _SHA256_HEX})
    ]


class ServerKeyModel(_Model):
    """A server-held signing key version."""

    name: Text
    # Read as text whatever its YAML type (`version: 2` means "2").
    version: Annotated[str, BeforeValidator(str), WithJsonSchema({"type": ["string", "integer"]})] = "1"
    path: Text
    password_env: str | None = None
    roles: list[Role] = Field(default_factory=_all_roles, min_length=1)
    # Left out: one operation per role (weights -> signStatement, gate -> gateResult, watermark ->
    # watermarkRecord), so a key of an older configuration never signs a client-made gate or watermark
    # statement through SignStatement.
    operations: list[Operation] | None = Field(default=None, min_length=1)
    allow: list[Text] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> ServerKeyModel:
        if not (re.fullmatch(_NAME[1:-1], self.name) and re.fullmatch(_NAME[1:-1], self.version)):
            raise ValueError(f": name and version must match {_NAME}")
        for operation, role in (("gateResult", "gate"), ("watermarkRecord", "watermark")):
            if self.operations is not None and operation in self.operations and role not in self.roles:
                raise ValueError(f": operation {operation} needs the role {role}")
        return self


class WatermarkKeyModel(_Model):
    """A server-held watermark key file."""

    name: Name
    path: Text
    allow: list[Text] = Field(default_factory=list)


class AccessModel(_Model):
    """Identity globs per operation; an operation left out keeps its default (`ACCESS_DEFAULTS`)."""

    verify: list[Text] | None = None
    read_attestations: list[Text] | None = None
    list_keys: list[Text] | None = None
    put_attestation: list[Text] | None = None
    delete_attestation: list[Text] | None = None
    supersede_attestation: list[Text] | None = None
    verify_model: list[Text] | None = None
    watermark: list[Text] | None = None
    robustness: list[Text] | None = None


class ServerConfigModel(_Model):
    """A server configuration: `apiVersion: modelsec.dev/v1alpha1`, `kind: ServerConfig`."""

    model_config = ConfigDict(title="ServerConfig")

    api_version: Literal["modelsec.dev/v1alpha1"]
    kind: Literal["ServerConfig"]
    listen: Listen
    metrics_listen: Listen | None = None
    server_identity: Identity | None = None
    data_dir: Text
    policy: Text
    default_policy: Text | None = None
    tls: TlsModel | None = None
    tokens: list[TokenModel] = Field(default_factory=list)
    allow_anonymous: bool = False
    keys: list[ServerKeyModel] = Field(default_factory=list)
    watermark_keys: list[WatermarkKeyModel] = Field(default_factory=list)
    access: AccessModel = Field(default_factory=AccessModel)
    read_roots: list[Text] = Field(default_factory=list)
    write_roots: list[Text] = Field(default_factory=list)
    architectures: list[Text] = Field(default_factory=list)
    grace_period: float = Field(default=30.0, ge=0, le=3600)
    max_concurrent_rpcs: int = Field(default=256, ge=1, le=100_000)
    max_concurrent_gates: int = Field(default=1, ge=1, le=64)


# --- GateSpec ----------------------------------------------------------------------------------------------


class GateSpecModel(_Model):
    """The release pipeline's PGD gate (`modelsec release --gate-config`).

    `apiVersion` and `kind` may be left out (gate files written before they existed); when given they must
    be `modelsec.dev/v1alpha1` and `GateSpec`.
    """

    model_config = ConfigDict(title="GateSpec")

    api_version: Literal["modelsec.dev/v1alpha1"] | None = None
    kind: Literal["GateSpec"] | None = None
    architecture: Text
    data: Text
    eps: float = Field(ge=0.0)
    step_size: float = Field(gt=0.0)
    steps: int = Field(ge=1)
    restarts: int = Field(default=1, ge=1)
    min_robust_accuracy: Fraction
    rule: Literal["point", "strict"] = "point"
    min_samples: int = Field(default=100, ge=1)
    seed: int = 0
    batch_size: int = Field(default=256, ge=1)
    device: Annotated[str, Field(pattern=r"^(cpu|cuda|cuda:\d+)$")] = "cpu"


class _NoNullSchema(GenerateJsonSchema):
    """Optional fields are "may be left out", never "may be null" (see the module docstring)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])


def json_schema(model: type[_Base], schema_id: str) -> dict[str, Any]:
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
