"""Typed models of the policy file (`kind: ModelPolicy`), published as `schemas/model-policy.schema.json`.

The models hold the file's shapes, types, ranges and per-field syntax (`modelsec.config` reads and
validates a file against `PolicyFileModel`). Paths stay strings here: `PolicySet.from_mapping`
(`modelsec.policy.policies`) resolves them against the file's directory, loads the keys, compiles the
patterns and applies the checks that involve more than one field while building `Policy` values.
pydantic is imported only when a policy file is parsed, not by every `import modelsec.policy`.
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

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.config import (
    CONTROL_CHARACTERS,
    PRINTABLE_SCHEMA,
    SHA256_HEX_PATTERN,
    ConfigModel,
    Fraction,
    Name,
    Role,
    Text,
    all_roles,
    no_control,
)
from modelsec.errors import PolicyError
from modelsec.limits import SAFETENSORS_MAX_HEADER_SIZE, Limits
from modelsec.registry.reference import normalize_pattern

__all__ = [
    "MAX_AGE_SECONDS",
    "AttestationsModel",
    "AuthorityModel",
    "ConditionModel",
    "IdentityModel",
    "KeyRefModel",
    "LimitsModel",
    "LineageModel",
    "LoadReceiptModel",
    "NamespaceRuleModel",
    "NodeModel",
    "PolicyFileModel",
    "PolicyModel",
    "RobustnessModel",
    "SigstoreIdentityModel",
    "SigstoreModel",
    "TimestampAuthorityModel",
    "WatermarkModel",
    "X509IdentityModel",
    "X509Model",
]

MAX_AGE_SECONDS = (
    100 * 365 * 86400
)  # a century: beyond it `maxAge` is a typo (or inf) that disables freshness
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _model_pattern(value: str) -> str:
    """A `match` glob must name a scheme: models are matched as `file://<real path>` or `oci://...` URIs.

    An `oci://` glob is returned normalised (`modelsec.registry.reference.normalize_pattern`).
    """
    if "://" not in value and not value.startswith(("*", "?", "[")):
        local = f"file://{value}" if value.startswith("/") else "file://<absolute path>"
        raise ValueError(
            f"{value!r} has no scheme and can never match: a local model is matched as file://<real path>, "
            f"a registry one as oci://REGISTRY/REPOSITORY (write {local!r})"
        )
    try:
        # References are compared normalised (modelsec.registry.reference): so are the patterns.
        return normalize_pattern(value)
    except PolicyError as e:
        raise ValueError(str(e)) from None


def _store(value: str) -> str:
    if not value or CONTROL_CHARACTERS.search(value):
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


Instant = Annotated[
    datetime, BeforeValidator(_instant), WithJsonSchema({"type": "string", "format": "date-time"})
]
Pattern = Annotated[str, Field(min_length=1), AfterValidator(no_control), WithJsonSchema(PRINTABLE_SCHEMA)]
ModelPattern = Annotated[
    str,
    Field(min_length=1),
    AfterValidator(no_control),
    AfterValidator(_model_pattern),
    WithJsonSchema(PRINTABLE_SCHEMA),
]
Store = Annotated[str, AfterValidator(_store), WithJsonSchema(PRINTABLE_SCHEMA)]
Sha256Hex = Annotated[str, Field(pattern=SHA256_HEX_PATTERN)]


def _absolute_path(value: str) -> str:
    if not value.startswith("/") or "," in value:
        raise ValueError("must be an absolute path in the serving containers, e.g. /etc/modelsec/policy.yaml")
    return value


GuardPolicyPath = Annotated[
    str,
    Field(min_length=2, max_length=4096),
    AfterValidator(no_control),
    AfterValidator(_absolute_path),
    WithJsonSchema(
        {"type": "string", "minLength": 2, "maxLength": 4096, "pattern": r"^/[^\x00-\x1f\x7f-\x9f,]*$"}
    ),
]
# Enum values come from YAML as strings: these fields are validated in lax mode (value -> member only).
Signature = Annotated[SignatureAlgorithm, Field(strict=False)]
Hash = Annotated[HashAlgorithm, Field(strict=False)]


def _bound(name: str) -> Any:
    """A limit may be raised to 16 times its default; beyond that it is a typo."""
    return Field(default=None, ge=1, le=getattr(Limits(), name) * 16)


class KeyRefModel(ConfigModel):
    """A trusted public key file (PEM SubjectPublicKeyInfo), relative to the policy file."""

    path: str
    name: str | None = None
    roles: list[Role] = Field(
        default_factory=all_roles,
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


class RobustnessModel(ConfigModel):
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


class WatermarkModel(ConfigModel):
    """What a watermark attestation must show (`required: false` disables the requirement)."""

    model_config = ConfigDict(json_schema_extra={"dependentRequired": {"message": ["keyFile"]}})
    required: bool = True
    min_confidence: Fraction = 0.92
    max_false_positive: Fraction = 1e-9
    key_file: Text | None = None
    max_fidelity_loss: Fraction | None = None  # issue 18: the attested fidelity loss must be at most this
    fidelity_metric: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="the metric the attested fidelity loss must be measured in, exactly as the attestation "
        "records it (`fidelity.metric`, e.g. `gated-greedy-changed-upper-bound`): maxFidelityLoss is a "
        "number in that metric, and an attestation measured in another one, or in none, is refused",
    )
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


_ROOT_DIGEST = r"^sha256:[0-9a-f]{64}$"


class LineageModel(ConfigModel):
    """Base-model lineage: signed SLSA provenance leads from the model to one of `from` within `maxDepth`."""

    from_: list[Annotated[str, Field(pattern=_ROOT_DIGEST)]] = Field(
        alias="from",
        min_length=1,
        max_length=1024,
        description="approved base-model root digests, as sha256:<64 hex>",
    )
    max_depth: int = Field(
        default=3,
        ge=1,
        le=32,
        description="most provenance links followed from the model to an approved root",
    )


class ConditionModel(ConfigModel):
    """A statement of `predicateType`, signed by one of `signers`, for which the CEL `condition` is true."""

    name: Name
    predicate_type: Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(no_control)]
    signers: list[Text] = Field(
        default_factory=list,
        description="names of the policy's keys or authorities that may sign it (empty: any of them)",
    )
    condition: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="CEL over `statement`, `predicate`, `predicateType` and `subject`; must be true",
    )
    lineage: LineageModel | None = None


class AttestationsModel(ConfigModel):
    """Attestations required besides the weights signatures."""

    robustness: RobustnessModel | None = None
    watermark: WatermarkModel | None = None
    conditions: list[ConditionModel] = Field(
        default_factory=list,
        max_length=64,
        description="statements of any predicate type that must be present, signed, and satisfy a CEL "
        "condition",
    )


class LimitsModel(ConfigModel):
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


class IdentityModel(ConfigModel):
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


class X509Model(ConfigModel):
    """Certificate trust: PEM root files (relative to the policy file) and the identities they vouch for."""

    roots: list[Text] = Field(min_length=1)
    identities: list[X509IdentityModel] = Field(min_length=1)
    allow_ca_leaf: bool = Field(
        default=False,
        description="accept a signing certificate that asserts CA:TRUE (as model_signing's test certificates "
        "do) if its keyUsage has digitalSignature and its extendedKeyUsage codeSigning; default: refused",
    )


class SigstoreModel(ConfigModel):
    """Keyless trust: a Sigstore trusted root (`production`, `staging` or a `trusted_root.json` file)."""

    trusted_root: Text = "production"
    identities: list[SigstoreIdentityModel] = Field(min_length=1)


class AuthorityModel(ConfigModel):
    """A certificate or Sigstore authority (one of `x509` and `sigstore`) and the roles it may sign."""

    name: Name
    roles: list[Role] = Field(
        default_factory=all_roles,
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


class TimestampAuthorityModel(ConfigModel):
    """An RFC 3161 timestamp authority: PEM files of its chain (self-issued ones are the trusted roots)."""

    name: Name
    cert_chain: list[Text] = Field(min_length=1)


class NodeModel(ConfigModel):
    """A registered node: its name and the PEM file of its TPM attestation key's public key."""

    name: Name
    key: Text


class LoadReceiptModel(ConfigModel):
    """Load receipts (docs/load-receipts.md): the node's TPM quotes a statement of each verified load."""

    required: bool = Field(
        default=False, description="a load whose receipt cannot be emitted (TPM unreachable) fails closed"
    )
    attestation_key_handle: Annotated[str, Field(pattern=r"^0x81[0-9a-fA-F]{6}$")] = Field(
        default="0x81010002", description="persistent handle of the node's attestation key"
    )
    pcrs: dict[Annotated[str, Field(pattern=r"^([0-9]|1[0-9]|2[0-3])$")], Sha256Hex] = Field(
        min_length=1, max_length=24, description="PCR index -> expected SHA-256 bank value (hex)"
    )
    nodes: list[NodeModel] = Field(
        default_factory=list, max_length=100_000, description="registered nodes (receipts verify)"
    )
    max_age: Annotated[
        float,
        BeforeValidator(_duration),
        WithJsonSchema({"type": "string", "pattern": _DURATION.pattern}),
    ] = Field(default=600.0, description="the oldest receipt accepted (default 10m)")
    store: Text | None = Field(
        default=None,
        description="where the node writes receipts: a directory, or oci://REGISTRY/REPOSITORY (referrers of "
        "the model)",
    )
    timestamp_url: Text | None = Field(
        default=None,
        description="RFC 3161 TSA the node timestamps each quote at (http:// or https://); when set, a "
        "receipt without a timestamp of a timestampAuthorities TSA is refused",
    )
    window: Annotated[
        float,
        BeforeValidator(_duration),
        WithJsonSchema({"type": "string", "pattern": _DURATION.pattern}),
    ] = Field(
        default=120.0,
        description="how far the TSA time, or the time the TPM clock implies, may lie from loadedAt "
        "(default 2m)",
    )


class PolicyModel(ConfigModel):
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
    load_receipt: LoadReceiptModel | None = Field(
        default=None, description="TPM-quoted receipts of verified loads (off unless given)"
    )
    guard_policy: GuardPolicyPath | None = Field(
        default=None,
        description="admission: the policy file the runtime guard loads in the serving containers (an "
        "absolute path there), injected as MODELSEC_POLICY by the mutating webhook",
    )


class NamespaceRuleModel(ConfigModel):
    """Admission rules for the namespaces whose names match one of `namespaces` (globs)."""

    namespaces: list[Pattern] = Field(min_length=1)
    no_match: Literal["deny", "warn", "allow"] = "deny"
    require_model: bool = False


class PolicyFileModel(ConfigModel):
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
