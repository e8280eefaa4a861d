"""The server configuration file (`kind: ServerConfig`), validated strictly like the policy file.

Example:
```yaml
apiVersion: modelsec.dev/v1alpha1
kind: ServerConfig
listen: 127.0.0.1:50051
serverIdentity: signer.example.org   # runBy.server in the gates and watermarks it runs (default: hostname)
metricsListen: 127.0.0.1:9464        # /metrics and /healthz over plain HTTP; omit to disable
dataDir: /var/lib/modelsec           # the attestation store (attestations.sqlite3) lives here
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

Relative paths are relative to the configuration file's directory. The file is validated strictly
(`ServerConfigModel`, published as `schemas/server-config.schema.json`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from modelsec.config import (
    NAME_PATTERN,
    PRINTABLE_SCHEMA,
    SHA256_HEX_PATTERN,
    ConfigModel,
    Listen,
    Name,
    Role,
    Text,
    all_roles,
    no_control,
    read_config,
    validate,
)
from modelsec.errors import PolicyError

__all__ = [
    "ACCESS_DEFAULTS",
    "OPERATIONS",
    "AccessModel",
    "KeyConfig",
    "ServerConfig",
    "ServerConfigModel",
    "ServerKeyModel",
    "TlsConfig",
    "TokenConfig",
    "WatermarkKeyConfig",
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

    cert: Text
    key: Text
    client_ca: Text | None = Field(default=None, alias="clientCA")


class TokenModel(ConfigModel):
    """A bearer token kept as its SHA-256."""

    identity: Text
    sha256: Annotated[
        str, AfterValidator(_sha256_hex), WithJsonSchema({"type": "string", "pattern": SHA256_HEX_PATTERN})
    ]


class ServerKeyModel(ConfigModel):
    """A server-held signing key version."""

    name: Text
    # Read as text whatever its YAML type (`version: 2` means "2").
    version: Annotated[str, BeforeValidator(str), WithJsonSchema({"type": ["string", "integer"]})] = "1"
    path: Text
    password_env: str | None = None
    roles: list[Role] = Field(default_factory=all_roles, min_length=1)
    # Left out: one operation per role (weights -> signStatement, gate -> gateResult, watermark ->
    # watermarkRecord), so a key of an older configuration never signs a client-made gate or watermark
    # statement through SignStatement.
    operations: list[Operation] | None = Field(default=None, min_length=1)
    allow: list[Text] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> ServerKeyModel:
        name = NAME_PATTERN[1:-1]
        if not (re.fullmatch(name, self.name) and re.fullmatch(name, self.version)):
            raise ValueError(f": name and version must match {NAME_PATTERN}")
        for operation, role in (("gateResult", "gate"), ("watermarkRecord", "watermark")):
            if self.operations is not None and operation in self.operations and role not in self.roles:
                raise ValueError(f": operation {operation} needs the role {role}")
        return self


class WatermarkKeyModel(ConfigModel):
    """A server-held watermark key file."""

    name: Name
    path: Text
    allow: list[Text] = Field(default_factory=list)


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


class ServerConfigModel(ConfigModel):
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


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Server TLS: certificate chain and key (PEM); `client_ca` turns on mutual TLS (client cert required)."""

    cert: Path
    key: Path
    client_ca: Path | None = None


@dataclass(frozen=True, slots=True)
class TokenConfig:
    """A bearer token, kept only as its SHA-256 (hex), and the identity it authenticates."""

    identity: str
    sha256: str


@dataclass(frozen=True, slots=True)
class KeyConfig:
    """A server-held signing key version (`<name>/<version>`), its roles, operations and who may use it.

    Attributes:
        operations: The RPCs that may sign with it (`OPERATIONS`; see the module docstring).
    """

    name: str
    version: str
    path: Path | str  # a PEM file, or a key-source URI such as `pkcs11:…` (`modelsec.signer.keys.key_source`)
    password_env: str | None
    roles: frozenset[str]
    allow: tuple[str, ...]
    operations: frozenset[str] = frozenset()

    @property
    def key_version(self) -> str:
        """`<name>/<version>`, the name clients use."""
        return f"{self.name}/{self.version}"


@dataclass(frozen=True, slots=True)
class WatermarkKeyConfig:
    """A server-held watermark key file and who may use it."""

    name: str
    path: Path
    allow: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A validated server configuration (see the module docstring for the file format)."""

    listen: str
    data_dir: Path
    policy: Path
    server_identity: str = "modelsec"
    default_policy: str | None = None
    metrics_listen: str | None = None
    tls: TlsConfig | None = None
    tokens: tuple[TokenConfig, ...] = ()
    allow_anonymous: bool = False
    keys: tuple[KeyConfig, ...] = ()
    watermark_keys: tuple[WatermarkKeyConfig, ...] = ()
    access: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(ACCESS_DEFAULTS))
    read_roots: tuple[Path, ...] = ()
    write_roots: tuple[Path, ...] = ()
    architectures: tuple[str, ...] = ()
    grace_period: float = 30.0
    max_concurrent_rpcs: int = 256
    max_concurrent_gates: int = 1
    source: str = "<config>"

    def __post_init__(self) -> None:
        client_certificates = self.tls is not None and self.tls.client_ca is not None
        if not client_certificates and not self.tokens and not self.allow_anonymous:
            raise PolicyError(
                f"{self.source}: no way to authenticate clients: configure tls.clientCA (mutual TLS), "
                "tokens, or allowAnonymous: true (plaintext development only)"
            )
        # A bearer token sent in plaintext is a credential handed to anyone on the path; on loopback the
        # path is this host, which development setups rely on.
        if self.tokens and self.tls is None and not is_loopback_listen(self.listen):
            raise PolicyError(
                f"{self.source}: bearer tokens over plaintext on {self.listen}: every token would cross the "
                "network readable by anyone on the path; configure tls (cert, key), or listen on a loopback "
                "address (127.0.0.1, [::1], localhost) for development"
            )
        # Anonymous callers get whatever `access` grants `*`: acceptable only where every caller is local.
        if self.allow_anonymous and not is_loopback_listen(self.listen):
            raise PolicyError(
                f"{self.source}: allowAnonymous on {self.listen}: any host that reaches the address would be "
                "served as `anonymous`; it is for local development only: listen on a loopback address "
                "(127.0.0.1, [::1], localhost), or authenticate clients (tls.clientCA or tokens)"
            )

    def may(self, operation: str, identity: str) -> bool:
        """Whether `identity` may perform `operation` (a key of `ACCESS_DEFAULTS`)."""
        return identity_allowed(identity, self.access[operation])


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


def _path(value: str, base: Path) -> Path:
    return Path(value) if os.path.isabs(value) else base / value


def _key_ref(value: str, base: Path, where: str) -> Path | str:
    """A signing key's `path`: a key-source URI (`pkcs11:…`) as written, else a path like `_path`.

    Raises:
        PolicyError: A malformed URI (the message starts with `where`).
    """
    from modelsec.errors import KeyMaterialError
    from modelsec.signer.keys import PemFileKeySource, key_source

    try:
        pem = isinstance(key_source(value), PemFileKeySource)
    except KeyMaterialError as e:
        raise PolicyError(f"{where}: {e}") from None
    return _path(value, base) if pem else value


def load_server_config(path: Path) -> ServerConfig:
    """Load and validate a server configuration file (YAML or JSON).

    Raises:
        PolicyError: Unreadable, larger than 1 MiB, not YAML/JSON, or invalid (the message names the file
            and the field path).
    """
    _, doc = read_config(path, "server configuration")
    return server_config_from_mapping(doc, base_dir=path.parent, source=str(path))


def server_config_from_mapping(doc: object, *, base_dir: Path, source: str) -> ServerConfig:
    """Validate a parsed server configuration document (relative paths resolved against `base_dir`).

    Raises:
        PolicyError: Invalid document (the message names the field path), e.g. a malformed `pkcs11:` key URI.
    """
    top = validate(ServerConfigModel, doc, source)
    tls = None
    if top.tls is not None:
        ca = top.tls.client_ca
        tls = TlsConfig(
            _path(top.tls.cert, base_dir),
            _path(top.tls.key, base_dir),
            _path(ca, base_dir) if ca is not None else None,
        )
    if top.allow_anonymous and tls is not None:
        raise PolicyError(f"{source}: allowAnonymous is for plaintext development only; remove it or tls")
    access = dict(ACCESS_DEFAULTS)
    for name, info in AccessModel.model_fields.items():
        patterns = getattr(top.access, name)
        if patterns is not None:
            access[info.alias or name] = tuple(patterns)
    keys = tuple(
        KeyConfig(
            k.name,
            k.version,
            _key_ref(k.path, base_dir, f"{source}: keys[{i}].path"),
            k.password_env,
            frozenset(k.roles),
            tuple(k.allow),
            frozenset(
                k.operations if k.operations is not None else (_OPERATION_FOR_ROLE[r] for r in k.roles)
            ),
        )
        for i, k in enumerate(top.keys)
    )
    if len({k.key_version for k in keys}) != len(keys):
        raise PolicyError(f"{source}: keys: a key version is listed twice")
    watermark_keys = tuple(
        WatermarkKeyConfig(k.name, _path(k.path, base_dir), tuple(k.allow)) for k in top.watermark_keys
    )
    if len({k.name for k in watermark_keys}) != len(watermark_keys):
        raise PolicyError(f"{source}: watermarkKeys: a watermark key name is listed twice")
    return ServerConfig(
        listen=top.listen,
        server_identity=top.server_identity or socket.gethostname() or "modelsec",
        metrics_listen=top.metrics_listen,
        data_dir=_path(top.data_dir, base_dir),
        policy=_path(top.policy, base_dir),
        default_policy=top.default_policy,
        tls=tls,
        tokens=tuple(TokenConfig(t.identity, t.sha256) for t in top.tokens),
        allow_anonymous=top.allow_anonymous,
        keys=keys,
        watermark_keys=watermark_keys,
        access=access,
        read_roots=tuple(_path(p, base_dir) for p in top.read_roots),
        write_roots=tuple(_path(p, base_dir) for p in top.write_roots),
        architectures=tuple(top.architectures),
        grace_period=top.grace_period,
        max_concurrent_rpcs=top.max_concurrent_rpcs,
        max_concurrent_gates=top.max_concurrent_gates,
        source=source,
    )
