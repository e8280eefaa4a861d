"""What the servicers share: the configuration, the policies, the loaded keys, the store, and access checks.

Loaded once at start-up and read-only afterwards (the store serialises its own writes), so servicers need
no locks. Every check here fails closed with a `modelsec.errors` error that the interceptor maps to a
status code.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from modelsec.attestations.bundle import key_hint
from modelsec.attestations.predicates import PREDICATE_KINDS
from modelsec.attestations.predicates.run_by import RunBy
from modelsec.attestations.statement import Statement
from modelsec.errors import (
    AuthenticationError,
    Error,
    KeyMaterialError,
    MalformedArtifactError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
)
from modelsec.modelformat.model_files import open_dir_beneath
from modelsec.policy import Policy, PolicySet
from modelsec.safe_io import read_regular_file
from modelsec.service.config import (
    ServerConfig,
    ServerKeyModel,
    WatermarkKeyModel,
    check_store_url,
    identity_allowed,
)
from modelsec.signer.keys import KeyBackend, key_source
from modelsec.verifier.stores.records import RecordStore, open_record_store
from modelsec.verifier.stores.sqlite import SqliteAttestationStore

__all__ = ["SIGNING_AUDIT_LOGGER", "LoadedKey", "ServerPath", "ServiceState", "current_identity"]

# One audit record per signature made with a server-held key (`ServiceState.record_signature`).
SIGNING_AUDIT_LOGGER = "modelsec.service.audit"
_signing_audit = logging.getLogger(SIGNING_AUDIT_LOGGER)

_MAX_NAME_CHARS = 256  # key versions, policy and watermark key names in requests
_MAX_PATH_BYTES = 4096  # PATH_MAX
# The operation under which a server signs its own runs' results, by the role of their predicate type.
_SERVER_RUN_OPERATION = {"gate": "gateResult", "watermark": "watermarkRecord"}

# The authenticated identity of the RPC being served; set by the interceptor before a servicer runs.
current_identity: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "modelsec_identity", default=None
)


@dataclass(frozen=True, slots=True)
class ServerPath:
    """A client-supplied path placed under one of the server's roots by its spelling; nothing opened yet.

    The path is never resolved by name again: `open_parent` opens the directory holding it beneath the
    root's descriptor (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or an `O_NOFOLLOW` walk),
    and every later access goes through that descriptor, so renaming or exchanging a directory under the
    root (for a link out of it) between the check and the use cannot redirect the request.

    Attributes:
        path: The root's real path joined with `rel` (the model's identity for policy matching).
        root: The root's real path.
        rel: The relative POSIX path below the root; `""` for the root itself.
    """

    path: Path
    root: Path
    rel: str

    def open_parent(self) -> int:
        """A descriptor of the directory holding `path` (`path.name` is looked up in it by the caller).

        Raises:
            PolicyViolationError: A component below the root is a symlink.
            MalformedArtifactError: A component is missing or not a directory.
        """
        if path_hook is not None:
            path_hook(self)
        if not self.rel:
            # The root itself: its parent is the operator's configuration, like the root.
            return _open_dir(self.root.parent)
        root_fd = _open_dir(self.root)
        try:
            return open_dir_beneath(root_fd, os.path.dirname(self.rel), what=str(self.root))
        finally:
            os.close(root_fd)

    @contextlib.contextmanager
    def opened(self) -> Iterator[Path]:
        """The path, anchored at a descriptor of its directory for as long as the context lasts.

        Yields `/proc/self/fd/<n>/<name>`: the kernel starts from the open directory, so later renames
        above it cannot redirect the library call that receives the path, and the library opens `<name>`
        itself without following a link. Where `/proc/self/fd` is missing, the descriptor is only the
        check (no link below the root) and the real path is yielded.

        Raises:
            PolicyViolationError: A component below the root is a symlink.
            MalformedArtifactError: A component is missing or not a directory.
        """
        fd = self.open_parent()
        try:
            anchor = Path(f"/proc/self/fd/{fd}")
            yield (anchor if anchor.is_dir() else self.path.parent) / self.path.name
        finally:
            os.close(fd)


path_hook: Callable[[ServerPath], None] | None = None
"""Tests only: called between the check of a client path and its opening (where a race would strike)."""


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise MalformedArtifactError(f"{path}: cannot open the server root: {e.strerror}") from e


@dataclass(frozen=True, slots=True)
class LoadedKey:
    """A signing key version held in server memory."""

    config: ServerKeyModel
    backend: KeyBackend
    keyid: str
    public_key_pem: bytes


class ServiceState:
    """Start-up state of a server: read-only after construction.

    Raises (constructor):
        PolicyError: The policy file is invalid or `defaultPolicy` names no policy in it; `store.urlEnv`
            or `store.passwordEnv` is unset, `store.passwordFile` unreadable, or the URL from the
            environment is refused (`check_store_url`).
        KeyMaterialError: A signing key cannot be read or decrypted.
        BackendUnavailableError: The attestation store cannot be opened (PostgreSQL: unreachable,
            authentication, TLS).
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
        self.watermark_keys: dict[str, WatermarkKeyModel] = {k.name: k for k in config.watermark_keys}
        self.store: RecordStore = _open_store(config)
        # The server's metrics record each verdict here (modelsec.service.server sets it; None: not recorded).
        self.decision_observer: Callable[[str, str, str, str, float], None] | None = None

    def observe_decision(self, method: str, policy: str, outcome: str, reason: str, seconds: float) -> None:
        """Record a verification verdict in the server's metrics, if it has any (never raises)."""
        if self.decision_observer is not None:
            self.decision_observer(method, policy, outcome, reason, seconds)

    def close(self) -> None:
        """Release the store."""
        self.store.close()

    def record_signed_bundle(self, key: LoadedKey, bundle: bytes, method: str, caller: str | None) -> None:
        """`record_signature` for a bundle this server just signed (its statement read from the payload)."""
        from modelsec.attestations.bundle import parse_bundle
        from modelsec.attestations.statement import parse_statement

        statement = parse_statement(parse_bundle(bundle, source=method).envelope.payload, what=method)
        self.record_signature(key, statement, method, caller)

    def record_signature(
        self, key: LoadedKey, statement: Statement, method: str, caller: str | None = None
    ) -> None:
        """Write the audit record of one signature made with a server-held key (`SIGNING_AUDIT_LOGGER`).

        One JSON object at INFO: `event` (`signature`), `method` (the RPC), `caller` (the authenticated
        identity: `caller`, else that of the current RPC), `keyVersion`, `keyid`, `algorithm`,
        `predicateType`, `subjects` (name and digests of each subject), `time` (RFC 3339, UTC). No secret
        and no predicate body is recorded.
        """
        _signing_audit.info(
            json.dumps(
                {
                    "event": "signature",
                    "method": method,
                    "caller": caller if caller is not None else current_identity.get(),
                    "keyVersion": key.config.key_version,
                    "keyid": key.keyid,
                    "algorithm": key.backend.algorithm.value,
                    "predicateType": statement.predicate_type,
                    "subjects": [{"name": s.name, "digest": dict(s.digest)} for s in statement.subjects],
                    "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                },
                sort_keys=True,
                separators=(",", ":"),
            )
        )

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
            raise PermissionDeniedError(
                f"{identity!r} may not call {operation}: grant it in {self.config.grant_hint(operation)}"
            )
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
            raise PermissionDeniedError(
                f"{identity!r} may not use key version {key_version!r}: list it in "
                f"{self.config.key_setting(key.config, 'allow')}"
            )
        return key

    def signing_key_for(self, key_version: str, predicate_type: str, operation: str) -> LoadedKey:
        """The key version the caller may use for `operation`, if it holds the role for `predicate_type`.

        `operation` is `signStatement` (a statement the client made), `gateResult` (the result of a gate
        run this server performed) or `watermarkRecord` (the record of an embed it performed). A key that
        signs server-run gate (watermark) results never signs a client-made gate (watermark) statement, so
        its signature on one means the server ran it (`modelsec.service.config`).

        Raises:
            NotFoundError: No such key version.
            PermissionDeniedError: The caller may not use it, it may not sign this predicate type (a
                type that is not registered is signed only when the key's `predicateTypes` names it,
                and only for `signStatement`), it is not configured for `operation`, or
                `operation` is `signStatement` and it signs this server's own results of this type.
        """
        key = self.signing_key(key_version)
        kind = PREDICATE_KINDS.get(predicate_type)
        if kind is None and predicate_type in key.config.predicate_types:
            if operation != "signStatement" or operation not in key.config.operations:
                raise PermissionDeniedError(
                    f"key version {key_version!r} signs predicateType {predicate_type!r} only for "
                    "signStatement"
                )
            return key
        role = None if kind is None else kind.role
        if role is None or role not in key.config.roles:
            raise PermissionDeniedError(
                f"key version {key_version!r} may not sign predicateType {predicate_type!r} "
                f"(its roles: {', '.join(sorted(key.config.roles)) or 'none'}; its predicateTypes: "
                f"{', '.join(key.config.predicate_types) or 'none'}; set in "
                f"{self.config.key_setting(key.config, 'roles')} and .predicateTypes)"
            )
        if operation not in key.config.operations:
            raise PermissionDeniedError(
                f"key version {key_version!r} may not be used for {operation} "
                f"(its operations: {', '.join(sorted(key.config.operations)) or 'none'}; set in "
                f"{self.config.key_setting(key.config, 'operations')})"
            )
        server_run = _SERVER_RUN_OPERATION.get(role)
        if operation == "signStatement" and server_run in key.config.operations:
            raise PermissionDeniedError(
                f"key version {key_version!r} signs the {role} results this server produces itself "
                f"({server_run}); SignStatement does not sign {role} statements with it"
            )
        return key

    def run_by(self) -> RunBy:
        """Who runs the current RPC's gate or embed: this server's identity and the caller's.

        Raises:
            AuthenticationError: Called outside an authenticated RPC.
        """
        return RunBy(server=self.config.server_identity, requester=self.identity())

    def visible_keys(self) -> list[LoadedKey]:
        """The key versions the caller may use, by name."""
        identity = self.identity()
        return [k for _, k in sorted(self.keys.items()) if identity_allowed(identity, k.config.allow)]

    def watermark_key(self, name: str) -> WatermarkKeyModel:
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
            raise PermissionDeniedError(
                f"{identity!r} may not use watermark key {name!r}: list it in "
                f"{self.config.key_setting(key, 'allow')}"
            )
        return key

    # -- server-side paths --------------------------------------------------------------------------------

    def readable_path(self, raw: str, what: str) -> ServerPath:
        """Place a client-supplied path under a read root, by its spelling (no link is followed later).

        Raises:
            PermissionDeniedError: Not absolute, or outside every read root.
            MalformedArtifactError: Longer than PATH_MAX.
        """
        return _under(raw, self.config.read_roots, what, "read", f"readRoots in {self.config.source}")

    def writable_path(self, raw: str, what: str) -> ServerPath:
        """Place a client-supplied output path under a write root, by its spelling.

        Raises:
            PermissionDeniedError: Not absolute, or outside every write root.
            MalformedArtifactError: Longer than PATH_MAX.
        """
        return _under(raw, self.config.write_roots, what, "write", f"writeRoots in {self.config.source}")


_MAX_PASSWORD_FILE_BYTES = 4096


def _open_store(config: ServerConfig) -> RecordStore:
    """The configured record store: SQLite in `dataDir`, or the shared PostgreSQL database of `store`."""
    if config.store is None:
        if config.data_dir is None:  # refused when the configuration is read; kept for a model built in code
            raise PolicyError(f"{config.source}: no attestation store: set dataDir or store")
        config.data_dir.mkdir(parents=True, exist_ok=True)
        return SqliteAttestationStore(config.data_dir / "attestations.sqlite3")
    store, where = config.store, f"{config.source}: store"
    url = store.url
    if url is None:
        url = os.environ.get(store.url_env or "", "")
        if not url:
            raise PolicyError(f"{where}.urlEnv ${store.url_env} is unset or empty")
        try:
            check_store_url(url, allow_password=True)
        except ValueError as e:
            raise PolicyError(f"{where}.urlEnv ${store.url_env}{e}") from None
    password = None
    if store.password_env is not None:
        password = os.environ.get(store.password_env)
        if not password:
            raise PolicyError(f"{where}.passwordEnv ${store.password_env} is unset or empty")
    elif store.password_file is not None:
        raw = read_regular_file(
            store.password_file, "store password file", max_bytes=_MAX_PASSWORD_FILE_BYTES, error=PolicyError
        )
        # A Secret written with `echo` ends in a newline that is not part of the password.
        password = raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
        if not password:
            raise PolicyError(f"{where}.passwordFile {store.password_file} is empty")
    return open_record_store(url, password=password)


def _check_name(value: str, what: str) -> None:
    if len(value) > _MAX_NAME_CHARS:
        raise MalformedArtifactError(f"{what} is longer than {_MAX_NAME_CHARS} characters")


def _under(raw: str, roots: Sequence[Path], what: str, verb: str, setting: str) -> ServerPath:
    # Placed by spelling only: `..` is folded lexically, which is what the kernel does too once no link
    # below the root is followed (links are refused when the path is opened). The roots themselves are
    # operator configuration, matched as written and as their real paths.
    if len(raw.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        raise MalformedArtifactError(f"{what} is longer than {_MAX_PATH_BYTES} bytes")
    if not raw or not os.path.isabs(raw) or "\x00" in raw:
        raise PermissionDeniedError(f"{what} must be an absolute path on the server, got {raw!r}")
    spelled = Path(os.path.normpath(raw))
    for root in roots:
        root_real = Path(os.path.realpath(root))
        for base in dict.fromkeys((Path(os.path.normpath(os.path.abspath(root))), root_real)):
            if spelled == base or base in spelled.parents:
                rel = spelled.relative_to(base).as_posix()
                rel = "" if rel == "." else rel
                return ServerPath(root_real / rel if rel else root_real, root_real, rel)
    configured = ", ".join(str(r) for r in roots) or "none"
    raise PermissionDeniedError(
        f"{what} {raw!r} is outside the server's {verb} roots ({setting}; now: {configured})"
    )
