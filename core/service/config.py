"""The server configuration file (`kind: ServerConfig`), validated strictly like the policy file.

Example:
```yaml
apiVersion: modelsec.dev/v1alpha1
kind: ServerConfig
listen: 127.0.0.1:50051
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
    passwordEnv: CI_P256_PASSWORD    # for an encrypted PEM
    roles: [weights, watermark, gate]  # which predicate types the key may sign
    allow: ["spiffe://example.org/ci/*", ci-team-a]   # identities (globs) that may use it
watermarkKeys:
  - {name: owner, path: keys/owner.wmkey, allow: [ci-team-a]}
access:                              # identities (globs) per operation; default: see ACCESS_DEFAULTS
  putAttestation: [ci-team-a]
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
with neither is refused (UNAUTHENTICATED) unless `allowAnonymous: true` (plaintext local development;
identity `anonymous`). Bearer tokens without `tls` are accepted only on a loopback `listen` address
(`127.0.0.1`, `[::1]`, `localhost`): on any other address the configuration is refused, since every token
would cross the network in the clear.
Relative paths are relative to the configuration file's directory.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelsec.attestations.statement import is_sha256_hex
from modelsec.errors import PolicyError
from modelsec.policy import API_VERSION, ROLES, _load_yaml, _mapping, _string_list

__all__ = [
    "ACCESS_DEFAULTS",
    "KeyConfig",
    "ServerConfig",
    "TlsConfig",
    "TokenConfig",
    "WatermarkKeyConfig",
    "identity_allowed",
    "is_loopback_listen",
    "load_server_config",
]

_MAX_CONFIG_BYTES = 1 << 20
# Operation -> identity globs allowed by default. Reads are open to any authenticated caller; anything
# that writes, or runs code paths over server files, must be granted explicitly.
ACCESS_DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "verify": ("*",),
    "readAttestations": ("*",),
    "listKeys": ("*",),
    "putAttestation": (),
    "verifyModel": (),
    "watermark": (),
    "robustness": (),
}
_TOP = {
    "apiVersion",
    "kind",
    "listen",
    "metricsListen",
    "dataDir",
    "policy",
    "defaultPolicy",
    "tls",
    "tokens",
    "allowAnonymous",
    "keys",
    "watermarkKeys",
    "access",
    "readRoots",
    "writeRoots",
    "architectures",
    "gracePeriod",
    "maxConcurrentRpcs",
    "maxConcurrentGates",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
    """A server-held signing key version (`<name>/<version>`), its roles and who may use it."""

    name: str
    version: str
    path: Path
    password_env: str | None
    roles: frozenset[str]
    allow: tuple[str, ...]

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


def _str(doc: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{where}.{key} must be a non-empty string")
    return value


def _path(value: str, base: Path) -> Path:
    return Path(value) if os.path.isabs(value) else base / value


def _listen(value: object, where: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}", value):
        raise PolicyError(f"{where} must be HOST:PORT, got {value!r}")
    if int(value.rsplit(":", 1)[1]) > 65535:
        raise PolicyError(f"{where}: port out of range in {value!r}")
    return value


def _parse_keys(items: object, where: str, base: Path) -> tuple[KeyConfig, ...]:
    keys: list[KeyConfig] = []
    if not isinstance(items, list):
        raise PolicyError(f"{where} must be a list")
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        doc = _mapping(
            item, at, {"name", "version", "path", "passwordEnv", "roles", "allow"}, required={"name", "path"}
        )
        name, version = _str(doc, "name", at), str(doc.get("version", "1"))
        if not _NAME.match(name) or not _NAME.match(version):
            raise PolicyError(f"{at}: name and version must match {_NAME.pattern}")
        roles = frozenset(_string_list(doc.get("roles", sorted(ROLES)), f"{at}.roles"))
        if roles - ROLES:
            raise PolicyError(f"{at}.roles: unknown role(s) {sorted(roles - ROLES)}; use {sorted(ROLES)}")
        password_env = doc.get("passwordEnv")
        if password_env is not None and not isinstance(password_env, str):
            raise PolicyError(f"{at}.passwordEnv must be a string")
        keys.append(
            KeyConfig(
                name,
                version,
                _path(_str(doc, "path", at), base),
                password_env,
                roles,
                tuple(_string_list(doc.get("allow", []), f"{at}.allow")),
            )
        )
    names = [k.key_version for k in keys]
    if len(set(names)) != len(names):
        raise PolicyError(f"{where}: a key version is listed twice")
    return tuple(keys)


def _parse_watermark_keys(items: object, where: str, base: Path) -> tuple[WatermarkKeyConfig, ...]:
    if not isinstance(items, list):
        raise PolicyError(f"{where} must be a list")
    result = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        doc = _mapping(item, at, {"name", "path", "allow"}, required={"name", "path"})
        name = _str(doc, "name", at)
        if not _NAME.match(name):
            raise PolicyError(f"{at}.name must match {_NAME.pattern}")
        result.append(
            WatermarkKeyConfig(
                name,
                _path(_str(doc, "path", at), base),
                tuple(_string_list(doc.get("allow", []), f"{at}.allow")),
            )
        )
    if len({k.name for k in result}) != len(result):
        raise PolicyError(f"{where}: a watermark key name is listed twice")
    return tuple(result)


def _parse_tokens(items: object, where: str) -> tuple[TokenConfig, ...]:
    if not isinstance(items, list):
        raise PolicyError(f"{where} must be a list")
    tokens = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        doc = _mapping(item, at, {"identity", "sha256"}, required={"identity", "sha256"})
        digest = _str(doc, "sha256", at)
        if not is_sha256_hex(digest):
            raise PolicyError(f"{at}.sha256 must be the token's SHA-256 as 64 lowercase hex digits")
        tokens.append(TokenConfig(_str(doc, "identity", at), digest))
    return tuple(tokens)


def load_server_config(path: Path) -> ServerConfig:
    """Load and validate a server configuration file (YAML or JSON).

    Raises:
        PolicyError: Unreadable, not YAML/JSON, or invalid (the message names the field).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the server configuration: {e.strerror}") from e
    if len(raw) > _MAX_CONFIG_BYTES:
        raise PolicyError(f"{path}: server configuration larger than {_MAX_CONFIG_BYTES} bytes")
    return server_config_from_mapping(_load_yaml(raw, str(path)), base_dir=path.parent, source=str(path))


def server_config_from_mapping(doc: object, *, base_dir: Path, source: str) -> ServerConfig:
    """Validate a parsed server configuration document (relative paths resolved against `base_dir`).

    Raises:
        PolicyError: Invalid document (the message names the field).
    """
    top = _mapping(doc, source, _TOP, required={"apiVersion", "kind", "listen", "dataDir", "policy"})
    if top["apiVersion"] != API_VERSION:
        raise PolicyError(f"{source}: apiVersion must be {API_VERSION!r}, got {top['apiVersion']!r}")
    if top["kind"] != "ServerConfig":
        raise PolicyError(f"{source}: kind must be 'ServerConfig', got {top['kind']!r}")
    tls = None
    if "tls" in top:
        t = _mapping(top["tls"], f"{source}: tls", {"cert", "key", "clientCA"}, required={"cert", "key"})
        tls = TlsConfig(
            _path(_str(t, "cert", f"{source}: tls"), base_dir),
            _path(_str(t, "key", f"{source}: tls"), base_dir),
            _path(_str(t, "clientCA", f"{source}: tls"), base_dir) if "clientCA" in t else None,
        )
    access = dict(ACCESS_DEFAULTS)
    for op, patterns in _mapping(top.get("access", {}), f"{source}: access", set(ACCESS_DEFAULTS)).items():
        access[op] = tuple(_string_list(patterns, f"{source}: access.{op}"))
    anonymous = top.get("allowAnonymous", False)
    if not isinstance(anonymous, bool):
        raise PolicyError(f"{source}: allowAnonymous must be true or false")
    if anonymous and tls is not None:
        raise PolicyError(f"{source}: allowAnonymous is for plaintext development only; remove it or tls")
    grace = top.get("gracePeriod", 30)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 3600:
        raise PolicyError(f"{source}: gracePeriod must be a number of seconds in [0, 3600]")
    concurrent = top.get("maxConcurrentRpcs", 256)
    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or not 1 <= concurrent <= 100_000:
        raise PolicyError(f"{source}: maxConcurrentRpcs must be an integer in [1, 100000]")
    gates = top.get("maxConcurrentGates", 1)
    if isinstance(gates, bool) or not isinstance(gates, int) or not 1 <= gates <= 64:
        raise PolicyError(f"{source}: maxConcurrentGates must be an integer in [1, 64]")
    default_policy = top.get("defaultPolicy")
    if default_policy is not None and (not isinstance(default_policy, str) or not default_policy):
        raise PolicyError(f"{source}: defaultPolicy must be a non-empty string")
    return ServerConfig(
        listen=_listen(top["listen"], f"{source}: listen"),
        metrics_listen=_listen(top["metricsListen"], f"{source}: metricsListen")
        if "metricsListen" in top
        else None,
        data_dir=_path(_str(top, "dataDir", source), base_dir),
        policy=_path(_str(top, "policy", source), base_dir),
        default_policy=default_policy,
        tls=tls,
        tokens=_parse_tokens(top.get("tokens", []), f"{source}: tokens"),
        allow_anonymous=anonymous,
        keys=_parse_keys(top.get("keys", []), f"{source}: keys", base_dir),
        watermark_keys=_parse_watermark_keys(
            top.get("watermarkKeys", []), f"{source}: watermarkKeys", base_dir
        ),
        access=access,
        read_roots=tuple(
            _path(p, base_dir) for p in _string_list(top.get("readRoots", []), f"{source}: readRoots")
        ),
        write_roots=tuple(
            _path(p, base_dir) for p in _string_list(top.get("writeRoots", []), f"{source}: writeRoots")
        ),
        architectures=tuple(_string_list(top.get("architectures", []), f"{source}: architectures")),
        grace_period=float(grace),
        max_concurrent_rpcs=concurrent,
        max_concurrent_gates=gates,
        source=source,
    )
