"""The server configuration file (`kind: ServerConfig`), validated strictly like the policy file.

Example:
```yaml
apiVersion: modelsec.dev/v1alpha1
kind: ServerConfig
listen: 127.0.0.1:50051
serverIdentity: signer.example.org   # runBy.server in the gates and watermarks it runs (default: hostname)
metricsListen: 127.0.0.1:9464        # /metrics and /healthz over plain HTTP; omit to disable
dataDir: /var/lib/modelsec           # the embedded attestation store (attestations.sqlite3), one process
# store:                             # or a PostgreSQL database that every replica shares (instead of dataDir)
#   url: postgresql://modelsec@db.example.org:5432/modelsec?sslmode=verify-full&sslrootcert=/etc/modelsec/db/ca.pem
#   passwordFile: /etc/modelsec/db/password   # or passwordEnv: MODELSEC_DB_PASSWORD
#   # urlEnv: MODELSEC_STORE_URL     # the whole URL (password included) from the environment, e.g. a Secret
policy: policy.yaml                  # ModelPolicy file (keys, requirements; see modelsec.policy)
defaultPolicy: internal-models       # for VerifyBundle and PutAttestation (default: the first policy)
tls:
  cert: tls/server.pem
  key: tls/server.key
  clientCA: tls/clients-ca.pem       # mutual TLS: a client certificate signed by this CA is required
tokens:                              # bearer tokens (`authorization: Bearer <token>`), stored as SHA-256
  # printf %s "$TOKEN" | sha256sum   (with tls.clientCA set, a client certificate is needed as well)
  - {identity: ci-team-a, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}
keys:                                # server-held signing keys, KMS style
  - name: ci-p256
    version: "1"
    path: keys/ci-p256.key.pem
    passwordEnv: CI_P256_PASSWORD    # for an encrypted PEM (or a token's PIN)
  - name: hsm                        # a key in a PKCS#11 token (RFC 7512 URI; see modelsec.signer.pkcs11)
    version: "1"
    path: "pkcs11:token=ci;object=release?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=env:PIN"
    roles: [weights, watermark, gate]  # which predicate types the key may sign
    predicateTypes: [https://slsa.dev/provenance/v1]  # and these other types (SignStatement; exact URIs)
    operations: [signStatement, gateResult, watermarkRecord]  # which RPCs may sign with it (see below)
    allow: ["spiffe://example.org/ci/*", ci-team-a]   # identities (globs) that may use it
watermarkKeys:
  - {name: owner, path: keys/owner.wmkey, allow: [ci-team-a]}
access:                              # identities (globs) per operation; default: see ACCESS_DEFAULTS
  putAttestation: [ci-team-a]
  supersedeAttestation: [ci-team-a]  # withdraw stale evidence (DeleteAttestation: deleteAttestation)
readRoots: [/models]                 # paths VerifyModel, watermark and gate RPCs may read
writeRoots: [/models/watermarked]    # where EmbedWatermark may write
architectures: ["lenet5:lenet5"]     # classifier factories RunGate may import
gracePeriod: 30                      # seconds in-flight RPCs get after SIGTERM
maxConcurrentRpcs: 256               # calls served at once (more get RESOURCE_EXHAUSTED)
# allowAnonymous: true               # plaintext development only: unauthenticated callers are `anonymous`
maxConcurrentGates: 1                # RunGate calls running at once (others wait for a slot)
```

Identities: with mutual TLS, the client certificate's first URI SAN (SPIFFE ID), else its first DNS SAN,
else its subject CN; with a bearer token, the token's `identity` (a token wins over a certificate; both
kinds share one namespace, so name tokens so that the client CA cannot issue the same name). A connection
with neither is refused (UNAUTHENTICATED) unless `allowAnonymous: true` (plaintext local development on a
loopback `listen` address only; identity `anonymous`). Bearer tokens without `tls` are accepted only on a
loopback `listen` address (`127.0.0.1`, `[::1]`, `localhost`): on any other address the configuration is
refused, since every token would cross the network in the clear.
Operations: `signStatement` lets SignStatement sign client-made statements of the key's roles;
`gateResult` lets RunGate sign the results of gate runs this server performed, and `watermarkRecord` lets
EmbedWatermark sign the records of embeds it performed (both recording `runBy`: this server's
`serverIdentity` and the requester's identity). SignStatement never signs a gate (watermark) statement with
a key that holds `gateResult` (`watermarkRecord`), nor any gate or watermark statement carrying `runBy`, so
a verifier that trusts such a key knows that the server ran the gate or the embed. Left out, a key's
operations follow its roles: `weights` -> `signStatement`, `gate` -> `gateResult`, `watermark` ->
`watermarkRecord` (a client-made gate or watermark statement is signed only by a key configured with
`operations: [signStatement]` and the role).

The attestation store (attestations, withdrawals, the record ids that make puts idempotent) is SQLite in
`dataDir` for one process (`--workers` share it on one host), or with `store` a PostgreSQL database that
replicas on several hosts share (`modelsec.verifier.stores.postgres`; the `postgres` extra). A password
written in `store.url` is refused (the file is usually a ConfigMap): give it as `passwordFile` or
`passwordEnv`, or the whole URL as `urlEnv`. A database that is not on this host (a host other than a
loopback address or a Unix socket directory) must be reached with `sslmode=verify-ca` or `verify-full`,
since the password and the evidence would otherwise cross the network to whoever answers.

Relative paths are relative to the configuration file's directory. The file is validated strictly
(`ServerConfig`, published as `schemas/server-config.schema.json`) and used as it is by the server.
"""

from __future__ import annotations

import fnmatch
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from modelsec.config import (
    NAME_PATTERN,
    PRINTABLE_SCHEMA,
    SHA256_HEX_PATTERN,
    ConfigModel,
    ConfigPath,
    Listen,
    Name,
    ReadAs,
    Role,
    Text,
    all_roles,
    no_control,
    read_config,
    relative_to_file,
    validate,
)
from modelsec.errors import PolicyError

__all__ = [
    "ACCESS_DEFAULTS",
    "OPERATIONS",
    "AccessModel",
    "ServerConfig",
    "ServerKeyModel",
    "StoreModel",
    "TlsModel",
    "TokenModel",
    "WatermarkKeyModel",
    "check_store_url",
    "identity_allowed",
    "is_loopback_listen",
    "load_server_config",
]

# Operation -> identity globs allowed by default. Reads are open to any authenticated caller; anything
# that writes, or runs code paths over server files, must be granted explicitly.
ACCESS_DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "verify": ("*",),
    "readAttestations": ("*",),
    "listKeys": ("*",),
    "putAttestation": (),
    "deleteAttestation": (),
    "supersedeAttestation": (),
    "verifyModel": (),
    "watermark": (),
    "robustness": (),
}

# What a server-held key may be used for (`keys[].operations`), and the default by role.
OPERATIONS = frozenset({"signStatement", "gateResult", "watermarkRecord"})
_OPERATION_FOR_ROLE: Mapping[str, str] = {
    "weights": "signStatement",
    "gate": "gateResult",
    "watermark": "watermarkRecord",
}


# --- The file's models (published as schemas/server-config.schema.json) -----------------------------------

Operation = Literal["signStatement", "gateResult", "watermarkRecord"]
# As `runBy.server` in the predicates (modelsec.attestations.predicates.run_by).
Identity = Annotated[
    str,
    Field(min_length=1, max_length=1024),
    AfterValidator(no_control),
    WithJsonSchema({**PRINTABLE_SCHEMA, "maxLength": 1024}),
]


def _sha256_hex(value: str) -> str:
    if not re.fullmatch(SHA256_HEX_PATTERN[1:-1], value):
        raise ValueError("must be the token's SHA-256 as 64 lowercase hex digits")
    return value


class TlsModel(ConfigModel):
    """Server certificate chain and key (PEM); `clientCA` turns on mutual TLS."""

    cert: ConfigPath
    key: ConfigPath
    client_ca: ConfigPath | None = Field(default=None, alias="clientCA")


class TokenModel(ConfigModel):
    """A bearer token kept as its SHA-256."""

    identity: Text
    sha256: Annotated[
        str, AfterValidator(_sha256_hex), WithJsonSchema({"type": "string", "pattern": SHA256_HEX_PATTERN})
    ]


def _key_ref(value: str, info: ValidationInfo) -> Path | str:
    """A signing key's `path`: a key-source URI (`pkcs11:…`) as written, else a path relative to the file."""
    from modelsec.errors import KeyMaterialError
    from modelsec.signer.keys import PemFileKeySource, key_source

    try:
        pem = isinstance(key_source(value), PemFileKeySource)
    except KeyMaterialError as e:
        raise ValueError(f": {e}") from None  # `keys[0].path: <why>`
    return relative_to_file(value, info) if pem else value


def _predicate_type_uri(value: str) -> str:
    from modelsec.attestations.predicates import PREDICATE_KINDS
    from modelsec.attestations.predicates.generic import check_predicate_type
    from modelsec.errors import MalformedArtifactError

    try:
        check_predicate_type(value, what="predicateTypes")
    except MalformedArtifactError as e:
        raise ValueError(f": {e}") from None
    if value in PREDICATE_KINDS:
        raise ValueError(f": {value!r} is a registered predicate type: give its role in roles instead")
    return value


def _all_operations() -> frozenset[Operation]:
    return frozenset(("signStatement", "gateResult", "watermarkRecord"))


class ServerKeyModel(ConfigModel):
    """A server-held signing key version."""

    # The code uses this model as it is (`ServiceState.keys`): roles and operations are frozensets, and a
    # `path` is a PEM file resolved against the configuration's directory or a key-source URI as written
    # (`modelsec.signer.keys.key_source`).
    name: Text
    # Read as text whatever its YAML type (`version: 2` means "2").
    version: Annotated[str, BeforeValidator(str), WithJsonSchema({"type": ["string", "integer"]})] = "1"
    path: Annotated[Path | str, ReadAs(Text, _key_ref, with_info=True)]
    password_env: str | None = None
    roles: Annotated[frozenset[Role], ReadAs(Annotated[list[Role], Field(min_length=1)], frozenset)] = Field(
        default_factory=lambda: frozenset(all_roles())
    )
    # Left out: one operation per role (weights -> signStatement, gate -> gateResult, watermark ->
    # watermarkRecord), so a key of an older configuration never signs a client-made gate or watermark
    # statement through SignStatement (`_operations_follow_roles`).
    operations: Annotated[
        frozenset[Operation], ReadAs(Annotated[list[Operation], Field(min_length=1)], frozenset)
    ] = Field(default_factory=_all_operations)
    allow: list[Text] = Field(default_factory=list)
    # Predicate types beyond the registered ones (`roles`) that SignStatement may sign with this key, each
    # an absolute http(s) URI compared exactly (e.g. https://slsa.dev/provenance/v1); needs signStatement.
    predicate_types: list[Annotated[str, AfterValidator(_predicate_type_uri)]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _operations_follow_roles(cls, data: Any) -> Any:
        if isinstance(data, dict) and "operations" not in data:
            roles = data.get("roles", all_roles())
            # Invalid roles are reported as such; the operations then stay at their unused default.
            if isinstance(roles, list) and all(
                isinstance(r, str) and r in _OPERATION_FOR_ROLE for r in roles
            ):
                return {**data, "operations": sorted({_OPERATION_FOR_ROLE[r] for r in roles})}
        return data

    @model_validator(mode="after")
    def _names(self) -> ServerKeyModel:
        name = NAME_PATTERN[1:-1]
        if not (re.fullmatch(name, self.name) and re.fullmatch(name, self.version)):
            raise ValueError(f": name and version must match {NAME_PATTERN}")
        if self.predicate_types and "signStatement" not in self.operations:
            raise ValueError(": predicateTypes are signed by SignStatement: add the operation signStatement")
        for operation, role in (("gateResult", "gate"), ("watermarkRecord", "watermark")):
            if operation in self.operations and role not in self.roles:
                raise ValueError(f": operation {operation} needs the role {role}")
        return self

    @property
    def key_version(self) -> str:
        """`<name>/<version>`, the name clients use."""
        return f"{self.name}/{self.version}"


class WatermarkKeyModel(ConfigModel):
    """A server-held watermark key file."""

    name: Name
    path: ConfigPath
    allow: list[Text] = Field(default_factory=list)


_VERIFYING_SSLMODES = frozenset({"verify-ca", "verify-full"})


def check_store_url(url: str, *, allow_password: bool = False) -> str:
    """`url` if it is a PostgreSQL URI that `store` may use, else ValueError(": <why>").

    Refused: another scheme; no database host; a remote host (not loopback, not a Unix socket directory)
    without `sslmode=verify-ca` or `verify-full`; and, unless `allow_password` (a URL from `urlEnv`, i.e. a
    Secret), a password in the URI.
    """
    import ipaddress

    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ValueError(f": store URL must start with postgresql:// (got {parts.scheme or 'no'} scheme)")
    query = parse_qs(parts.query, keep_blank_values=True)
    if not allow_password and (parts.password is not None or "password" in query):
        raise ValueError(
            ": store.url holds a password, which would sit in the configuration file; give it as "
            "passwordFile or passwordEnv, or the whole URL as urlEnv"
        )
    # libpq takes comma-separated host lists in the authority and in `host=`; a socket directory may be
    # percent-encoded in the authority.
    named = [unquote(parts.hostname or ""), *query.get("host", [])]
    hosts = [h.strip() for spec in named for h in spec.split(",") if h.strip()]
    if not hosts:
        raise ValueError(": store URL names no host (postgresql://USER@HOST:PORT/DATABASE)")
    sslmode = (query.get("sslmode") or [""])[-1]

    def local(host: str) -> bool:
        if host.startswith("/") or host == "localhost":  # a Unix socket directory, or this host
            return True
        try:
            return ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return False

    remote = [h for h in hosts if not local(h)]
    if remote and sslmode not in _VERIFYING_SSLMODES:
        raise ValueError(
            f": store URL reaches {remote[0]} with sslmode={sslmode or 'prefer (libpq default)'}: the "
            "password and the evidence would go to whoever answers; set sslmode=verify-full (and "
            "sslrootcert=CA file)"
        )
    return url


def _store_url(url: str) -> str:
    return check_store_url(url)


class StoreModel(ConfigModel):
    """A PostgreSQL database shared by every replica (instead of the SQLite file in `dataDir`)."""

    url: Annotated[str, AfterValidator(no_control), AfterValidator(_store_url)] | None = None
    url_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    password_file: ConfigPath | None = None
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> StoreModel:
        if (self.url is None) == (self.url_env is None):
            raise ValueError(": give exactly one of url and urlEnv")
        if self.password_file is not None and self.password_env is not None:
            raise ValueError(": give at most one of passwordFile and passwordEnv")
        return self


class AccessModel(ConfigModel):
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


def _access(model: AccessModel) -> Mapping[str, tuple[str, ...]]:
    """`access` with `ACCESS_DEFAULTS` for each operation left out, keyed by the file's operation names."""
    access = dict(ACCESS_DEFAULTS)
    for name, info in AccessModel.model_fields.items():
        patterns = getattr(model, name)
        if patterns is not None:
            access[info.alias or name] = tuple(patterns)
    return access


class ServerConfig(ConfigModel):
    """A server configuration: `apiVersion: modelsec.dev/v1alpha1`, `kind: ServerConfig`."""

    # The docstring above is the schema's description. The code uses this model as it is: paths are
    # resolved against the file's directory (`load_server_config`), `access` holds every operation (its
    # defaults filled in), `serverIdentity` defaults to this host's name, and the checks that involve
    # several fields run once every field is valid (`_consistent`).
    model_config = ConfigDict(title="ServerConfig")

    api_version: Literal["modelsec.dev/v1alpha1"]
    kind: Literal["ServerConfig"]
    listen: Listen
    metrics_listen: Listen | None = None
    server_identity: Identity = Field(default=None, validate_default=True)
    data_dir: ConfigPath | None = None
    store: StoreModel | None = None
    policy: ConfigPath
    default_policy: Text | None = None
    tls: TlsModel | None = None
    tokens: list[TokenModel] = Field(default_factory=list)
    allow_anonymous: bool = False
    keys: list[ServerKeyModel] = Field(default_factory=list)
    watermark_keys: list[WatermarkKeyModel] = Field(default_factory=list)
    access: Annotated[Mapping[str, tuple[str, ...]], ReadAs(AccessModel, _access)] = Field(
        default_factory=lambda: dict(ACCESS_DEFAULTS)
    )
    read_roots: list[ConfigPath] = Field(default_factory=list)
    write_roots: list[ConfigPath] = Field(default_factory=list)
    architectures: list[Text] = Field(default_factory=list)
    grace_period: float = Field(default=30.0, ge=0, le=3600)
    max_concurrent_rpcs: int = Field(default=256, ge=1, le=100_000)
    max_concurrent_gates: int = Field(default=1, ge=1, le=64)
    _source: str = PrivateAttr(default="<config>")

    @field_validator("server_identity", mode="before")
    @classmethod
    def _this_host(cls, value: Any) -> Any:
        # Only a left-out field reaches here as None: a `null` in the file is refused before.
        return (socket.gethostname() or "modelsec") if value is None else value

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ServerConfig:
        self._source = (info.context or {}).get("source") or "<config>"
        self._check_consistent()
        return self

    def _check_consistent(self) -> None:
        """The checks that involve several fields; ValueError(": <why>") on the first one failed."""
        client_certificates = self.tls is not None and self.tls.client_ca is not None
        if (self.data_dir is None) == (self.store is None):
            raise ValueError(
                ": set one attestation store: dataDir (SQLite, one host) or store (PostgreSQL, replicas)"
            )
        if self.allow_anonymous and self.tls is not None:
            raise ValueError(": allowAnonymous is for plaintext development only; remove it or tls")
        if len({k.key_version for k in self.keys}) != len(self.keys):
            raise ValueError(": keys: a key version is listed twice")
        if len({k.name for k in self.watermark_keys}) != len(self.watermark_keys):
            raise ValueError(": watermarkKeys: a watermark key name is listed twice")
        if not client_certificates and not self.tokens and not self.allow_anonymous:
            raise ValueError(
                ": no way to authenticate clients: configure tls.clientCA (mutual TLS), "
                "tokens, or allowAnonymous: true (plaintext development only)"
            )
        # A bearer token sent in plaintext is a credential handed to anyone on the path; on loopback the
        # path is this host, which development setups rely on.
        if self.tokens and self.tls is None and not is_loopback_listen(self.listen):
            raise ValueError(
                f": bearer tokens over plaintext on {self.listen}: every token would cross the "
                "network readable by anyone on the path; configure tls (cert, key), or listen on a loopback "
                "address (127.0.0.1, [::1], localhost) for development"
            )
        # Anonymous callers get whatever `access` grants `*`: acceptable only where every caller is local.
        if self.allow_anonymous and not is_loopback_listen(self.listen):
            raise ValueError(
                f": allowAnonymous on {self.listen}: any host that reaches the address would be "
                "served as `anonymous`; it is for local development only: listen on a loopback address "
                "(127.0.0.1, [::1], localhost), or authenticate clients (tls.clientCA or tokens)"
            )

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with `changes` (field names), whose checks across fields run again (`serve --listen`).

        As with `dataclasses.replace`, the new values themselves are not validated again.

        Raises:
            PolicyError: The copy fails a check across fields (the message names the file).
        """
        copy = self.model_copy(update=changes)
        try:
            copy._check_consistent()
        except ValueError as e:
            raise PolicyError(f"{self.source}: {str(e).removeprefix(':').lstrip()}") from None
        return copy

    @property
    def source(self) -> str:
        """The file the configuration was read from, first in messages about it."""
        return self._source

    def may(self, operation: str, identity: str) -> bool:
        """Whether `identity` may perform `operation` (a key of `ACCESS_DEFAULTS`)."""
        return identity_allowed(identity, self.access[operation])

    def grant_hint(self, operation: str) -> str:
        """Where `operation` is granted, for a refusal: `access.putAttestation in FILE (now: nobody)`."""
        now = ", ".join(self.access[operation]) or "nobody"
        return f"access.{operation} in {self.source} (now: {now})"

    def key_setting(self, key: ServerKeyModel | WatermarkKeyModel, field: str) -> str:
        """The setting of one configured key, for a message: `keys[0].allow in FILE`."""
        if isinstance(key, ServerKeyModel):
            return f"keys[{self.keys.index(key)}].{field} in {self.source}"
        return f"watermarkKeys[{self.watermark_keys.index(key)}].{field} in {self.source}"

    def refusing_settings(self) -> list[str]:
        """What this configuration grants to nobody although it configures it, each naming the setting.

        A first configuration often lists keys without `allow`, or read roots and architectures without
        the operations that use them: every such call is refused. `start_server` logs each of these as a
        warning; the refusals themselves name the same settings.
        """
        found = []
        for key in self.keys:
            if not key.allow:
                found.append(
                    f"key version {key.key_version} allows no identity, so every signature with it is "
                    f"refused: list the identities that may use it in {self.key_setting(key, 'allow')}"
                )
        for wkey in self.watermark_keys:
            if not wkey.allow:
                found.append(
                    f"watermark key {wkey.name} allows no identity, so every call with it is refused: "
                    f"list the identities that may use it in {self.key_setting(wkey, 'allow')}"
                )
        uses = (
            ("watermarkKeys", bool(self.watermark_keys), ("watermark",)),
            ("architectures", bool(self.architectures), ("robustness",)),
            ("readRoots", bool(self.read_roots), ("verifyModel", "watermark", "robustness")),
            ("writeRoots", bool(self.write_roots), ("watermark",)),
        )
        for setting, configured, operations in uses:
            if configured and not any(self.access[o] for o in operations):
                grants = " or ".join(f"access.{o}" for o in operations)
                found.append(
                    f"{setting} is set but no identity may call {', '.join(operations)}: grant identities "
                    f"in {grants} in {self.source}"
                )
        return found


def is_loopback_listen(listen: str) -> bool:
    """Whether a `HOST:PORT` listen address only accepts connections from this host.

    True for `localhost`, 127.0.0.0/8 and `[::1]`; False for wildcard addresses (`0.0.0.0`, `[::]`), any
    other address, and any other host name (it may resolve to a routable address).
    """
    import ipaddress

    host = listen.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def identity_allowed(identity: str, patterns: Sequence[str]) -> bool:
    """Whether `identity` matches one of the glob `patterns` (`*` matches any characters, `/` included)."""
    return any(fnmatch.fnmatchcase(identity, p) for p in patterns)


def load_server_config(path: Path) -> ServerConfig:
    """Load and validate a server configuration file (YAML or JSON).

    Relative paths are resolved against the file's directory.

    Raises:
        PolicyError: Unreadable, larger than 1 MiB, not YAML/JSON, or invalid (the message names the file
            and the field path), e.g. a malformed `pkcs11:` key URI.
    """
    _, doc = read_config(path, "server configuration")
    return validate(ServerConfig, doc, str(path), base_dir=path.parent)
