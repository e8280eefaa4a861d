"""What the servicers share: the configuration, the policies, the loaded keys, the store, and access checks.

Loaded once at start-up and read-only afterwards (the store serialises its own writes), so servicers need
no locks. Every check here fails closed with a `modelsec.errors` error that the interceptor maps to a
status code.
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass
from pathlib import Path

from modelsec.attestations.bundle import key_hint
from modelsec.errors import (
    AuthenticationError,
    Error,
    KeyMaterialError,
    MalformedArtifactError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
)
from modelsec.policy import Policy, PolicySet
from modelsec.service.config import KeyConfig, ServerConfig, WatermarkKeyConfig, identity_allowed
from modelsec.signer.keys import KeyBackend, key_source
from modelsec.verifier.stores.sqlite import SqliteAttestationStore

__all__ = ["LoadedKey", "ServiceState", "current_identity"]

_MAX_NAME_CHARS = 256  # key versions, policy and watermark key names in requests
_MAX_PATH_BYTES = 4096  # PATH_MAX

# The authenticated identity of the RPC being served; set by the interceptor before a servicer runs.
current_identity: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "modelsec_identity", default=None
)


@dataclass(frozen=True, slots=True)
class LoadedKey:
    """A signing key version held in server memory."""

    config: KeyConfig
    backend: KeyBackend
    keyid: str
    public_key_pem: bytes


class ServiceState:
    """Start-up state of a server: read-only after construction.

    Raises (constructor):
        PolicyError: The policy file is invalid or `defaultPolicy` names no policy in it.
        KeyMaterialError: A signing key cannot be read or decrypted.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.policies = PolicySet.from_file(config.policy)
        by_name = {p.name: p for p in self.policies.policies}
        name = config.default_policy or self.policies.policies[0].name
        if name not in by_name:
            raise PolicyError(f"{config.source}: defaultPolicy {name!r} is not a policy in {config.policy}")
        self.default_policy: Policy = by_name[name]
        self._policies = by_name
        self.keys: dict[str, LoadedKey] = {}
        for i, k in enumerate(config.keys):
            where = f"{config.source}: keys[{i}] ({k.key_version})"
            password = None
            if k.password_env:
                value = os.environ.get(k.password_env)
                if not value:
                    raise KeyMaterialError(f"{where}: passwordEnv ${k.password_env} is unset or empty")
                password = value.encode("utf-8")
            try:
                backend = key_source(k.path).open(password=password)
            except Error as e:
                raise e.add_context(where) from None
            pem = backend.public_key_pem()
            self.keys[k.key_version] = LoadedKey(k, backend, key_hint(pem), pem)
        self.watermark_keys: dict[str, WatermarkKeyConfig] = {k.name: k for k in config.watermark_keys}
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = SqliteAttestationStore(config.data_dir / "attestations.sqlite3")

    def close(self) -> None:
        """Release the store."""
        self.store.close()

    # -- identity and access ------------------------------------------------------------------------------

    @staticmethod
    def identity() -> str:
        """The authenticated caller of the current RPC.

        Raises:
            AuthenticationError: Called outside an authenticated RPC (never trusted by default).
        """
        identity = current_identity.get()
        if identity is None:
            raise AuthenticationError("no authenticated identity for this call")
        return identity

    def require(self, operation: str) -> str:
        """Return the caller's identity if it may perform `operation`, else raise.

        Raises:
            PermissionDeniedError: The identity is not granted the operation in `access`.
        """
        identity = self.identity()
        if not self.config.may(operation, identity):
            raise PermissionDeniedError(f"{identity!r} may not call {operation}")
        return identity

    def policy(self, name: str = "") -> Policy:
        """The named policy, or the default one for an empty name.

        Raises:
            NotFoundError: No policy has that name.
        """
        if not name:
            return self.default_policy
        _check_name(name, "policy")
        try:
            return self._policies[name]
        except KeyError:
            raise NotFoundError(f"policy {name!r} is not defined in {self.config.policy}") from None

    def signing_key(self, key_version: str) -> LoadedKey:
        """The key version the caller may use.

        Raises:
            NotFoundError: No such key version.
            PermissionDeniedError: The caller is not in the key's `allow` list.
        """
        identity = self.identity()
        _check_name(key_version, "key_version")
        key = self.keys.get(key_version)
        if key is None:
            raise NotFoundError(f"key version {key_version!r} does not exist")
        if not identity_allowed(identity, key.config.allow):
            raise PermissionDeniedError(f"{identity!r} may not use key version {key_version!r}")
        return key

    def signing_key_for(self, key_version: str, predicate_type: str) -> LoadedKey:
        """The key version the caller may use, if it holds the role for statements of `predicate_type`.

        Raises:
            NotFoundError: No such key version.
            PermissionDeniedError: The caller may not use it, or it may not sign this predicate type (an
                unknown predicate type is never signed).
        """
        from modelsec.verifier.attestations import role_for_predicate

        key = self.signing_key(key_version)
        role = role_for_predicate(predicate_type)
        if role is None or role not in key.config.roles:
            raise PermissionDeniedError(
                f"key version {key_version!r} may not sign predicateType {predicate_type!r} "
                f"(its roles: {', '.join(sorted(key.config.roles)) or 'none'})"
            )
        return key

    def visible_keys(self) -> list[LoadedKey]:
        """The key versions the caller may use, by name."""
        identity = self.identity()
        return [k for _, k in sorted(self.keys.items()) if identity_allowed(identity, k.config.allow)]

    def watermark_key(self, name: str) -> WatermarkKeyConfig:
        """A watermark key the caller may use.

        Raises:
            NotFoundError: No such key.
            PermissionDeniedError: The caller is not in its `allow` list.
        """
        identity = self.identity()
        _check_name(name, "watermark_key")
        key = self.watermark_keys.get(name)
        if key is None:
            raise NotFoundError(f"watermark key {name!r} does not exist")
        if not identity_allowed(identity, key.allow):
            raise PermissionDeniedError(f"{identity!r} may not use watermark key {name!r}")
        return key

    # -- server-side paths --------------------------------------------------------------------------------

    def readable_path(self, raw: str, what: str) -> Path:
        """Resolve a client-supplied path that must lie under a read root (symlinks resolved first).

        Raises:
            PermissionDeniedError: Not absolute, or outside every read root.
        """
        return _under(raw, self.config.read_roots, what, "read")

    def writable_path(self, raw: str, what: str) -> Path:
        """Resolve a client-supplied output path that must lie under a write root.

        Raises:
            PermissionDeniedError: Not absolute, or outside every write root.
        """
        return _under(raw, self.config.write_roots, what, "write")


def _check_name(value: str, what: str) -> None:
    if len(value) > _MAX_NAME_CHARS:
        raise MalformedArtifactError(f"{what} is longer than {_MAX_NAME_CHARS} characters")


def _under(raw: str, roots: tuple[Path, ...], what: str, verb: str) -> Path:
    if len(raw.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        raise MalformedArtifactError(f"{what} is longer than {_MAX_PATH_BYTES} bytes")
    if not raw or not os.path.isabs(raw) or "\x00" in raw:
        raise PermissionDeniedError(f"{what} must be an absolute path on the server, got {raw!r}")
    real = Path(os.path.realpath(raw))
    for root in roots:
        root_real = Path(os.path.realpath(root))
        if real == root_real or root_real in real.parents:
            return real
    raise PermissionDeniedError(f"{what} {raw!r} is outside the server's {verb} roots")
