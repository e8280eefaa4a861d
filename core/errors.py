"""The one error hierarchy of modelsec.

Errors are grouped by who must act (the python-tuf habit):

* `VerificationError` and its subclasses: the model, signature or attestation must not be trusted.
  Never retry; never "fall back". Every instance names the file, tensor or field at fault.
* `PolicyError`, `KeyMaterialError`, `UnsupportedAlgorithmError`, `GateFailedError`: fix the setup
  (policy file, key, algorithm choice, release threshold, an output path: `BundleExistsError`), not the
  artifact.
* `BackendUnavailableError`: the environment lacks something (e.g. an OpenSSL without SM2); the only
  retryable kind.
* `AuthenticationError`, `PermissionDeniedError`, `NotFoundError`: the gRPC service's caller is unknown, is
  not allowed, or named something (a key version) that does not exist.

Front doors map these uniformly: the CLI exits 1 with `diagnostics()` on stderr, the gRPC interceptor maps
them to status codes, the webhook denies on any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

__all__ = [
    "AttestationError",
    "AuthenticationError",
    "BackendUnavailableError",
    "BundleExistsError",
    "DigestMismatchError",
    "Error",
    "FileSetMismatchError",
    "GateFailedError",
    "InvalidReferenceError",
    "KeyMaterialError",
    "MalformedArtifactError",
    "ModelMovedError",
    "NotFoundError",
    "PermissionDeniedError",
    "PickleContentError",
    "PolicyError",
    "PolicyViolationError",
    "ReceiptError",
    "RegistryUnreachableError",
    "ServerUnreachableError",
    "SignatureError",
    "UnsupportedAlgorithmError",
    "UntrustedSignerError",
    "VerificationError",
]


class Error(Exception):
    """Base class for every error raised by modelsec."""

    retryable: bool = False
    context: str = ""
    # Lines behind the one-line diagnostic (each reason of a list, a third-party error's own text): the CLI
    # prints them under `--verbose`; the message itself stays one line that says what to do next.
    details: tuple[str, ...] = ()

    def diagnostics(self) -> str:
        """Human-readable explanation shown by the CLI, the service and the webhook.

        The context is left out where the message already starts with it (a file's error names the file
        itself; a caller adding the same path as context must not print it twice).
        """
        message = str(self)
        if not self.context or message.startswith(f"{self.context}: "):
            return message
        return f"{self.context}: {message}"

    def with_details(self, *lines: str) -> Error:
        """Add detail lines (a third-party error's own text) behind the one line; returns `self` to raise."""
        self.details = (*self.details, *(line for line in lines if line))
        return self

    def add_context(self, context: str) -> Error:
        """Prefix the diagnostic with where it happened (e.g. a release stage); returns `self` to re-raise."""
        self.context = f"{context}: {self.context}" if self.context else context
        return self


class VerificationError(Error):
    """The model, signature or attestation must not be trusted. Never retry."""


class DigestMismatchError(VerificationError):
    """A file or tensor differs from the signed manifest.

    `compared` names what differs when it is not an `algorithm` digest (`tensor names`,
    `dtype/shape/offsets`).
    """

    def __init__(
        self, path: str, expected: str, actual: str, *, algorithm: str = "sha256", compared: str | None = None
    ) -> None:
        super().__init__(f"{path}: expected {compared or f'{algorithm} digest'} {expected}, got {actual}")
        self.path, self.expected, self.actual, self.algorithm = path, expected, actual, algorithm


class FileSetMismatchError(VerificationError):
    """The model directory holds other files than the signed manifest lists."""

    def __init__(self, model: str, extra: list[str], missing: list[str], *, requested: bool = False) -> None:
        parts = []
        if extra:
            parts.append("extra (unsigned) files: " + ", ".join(extra))
        if missing:
            parts.append("missing signed files: " + ", ".join(missing))
        if requested:  # the caller named files to verify (`--shard`, `files=`) the manifest does not list
            message = f"{model}: not signed files of this model: {', '.join(extra)} (not in the manifest)"
        else:
            message = f"{model}: directory differs from the signed manifest; " + "; ".join(parts)
        super().__init__(message)
        self.model, self.extra, self.missing = model, extra, missing


class SignatureError(VerificationError):
    """No trusted key produced a valid signature, or a required signature is missing."""


def _short_keyid(keyid: str) -> str:
    """A key id's first 16 hex digits, after its scheme prefix if it has one (`ML_DSA_65:`)."""
    prefix, _, digits = keyid.rpartition(":")
    return f"{prefix}:{digits[:16]}" if prefix else digits[:16]


class UntrustedSignerError(SignatureError):
    """A bundle signed by a key not trusted here: it names no trusted key, and none verifies it.

    Not an invalid signature (that is a plain `SignatureError`: the bundle names a trusted key that does not
    verify it), but most often another signer's, e.g. one of two co-signers' bundles met with the other's key.
    The message names the key id the bundle states (unverified: it only says whom to ask for the key), the
    keys tried with their key ids (hex SHA-256 of the canonical public key PEM, first 16 digits), and what to
    do; each key's own reason is in `details`.

    Attributes:
        path: The bundle (a file or an `oci://` referrer).
        keyid: The key id the bundle names (`publicKey.hint` or the DSSE `keyid`); "" when it names none.
        tried: The names of the trusted keys tried (those allowed to sign `role`).
        tried_keyids: Their key ids, in the same order.
        role: What the signing key had to be allowed to sign (`weights`, `watermark`, `gate`); None: any.
        named_key: The name of the configured key the bundle names when that key may not sign `role`.
    """

    _SHOWN: ClassVar[int] = 3
    NEXT_STEP: ClassVar[str] = (
        ": verify with the signer's public key (--trusted-key) or a policy that trusts it"
    )

    def __init__(
        self,
        path: str,
        keyid: str,
        tried: Sequence[tuple[str, str]],
        *,
        role: str | None = "weights",
        reasons: Sequence[str] = (),
        named_key: str | None = None,
    ) -> None:
        names = [f"{name} (key id {_short_keyid(kid)})" for name, kid in tried[: self._SHOWN]]
        if len(tried) > self._SHOWN:
            names.append(f"{len(tried) - self._SHOWN} more")
        stated = f"it names key id {_short_keyid(keyid)}" if keyid else "it names no key id"
        if named_key is not None:  # a configured key, but not one allowed to sign this role
            stated += f": {named_key}, not allowed to sign {role!r}"
        allowed = f"no trusted key allowed to sign {role!r}" if role else "no trusted key"
        keys = "tried " + ", ".join(names) if names else f"no configured key may sign {role!r}"
        super().__init__(
            f"{path}: signed by a key not trusted here: {allowed} verifies its signature ({stated}; {keys})"
            + self.NEXT_STEP
        )
        self.path, self.keyid, self.role, self.named_key = path, keyid, role, named_key
        self.tried = tuple(name for name, _ in tried)
        self.tried_keyids = tuple(kid for _, kid in tried)
        self.details = tuple(reasons)


class AttestationError(VerificationError):
    """An attestation is missing, about another subject, or does not satisfy the policy."""


class ReceiptError(AttestationError):
    """A load receipt does not prove what it claims (`modelsec.verifier.receipts`); `reason` says which check.

    Reasons: `unregistered-key` (no registered node's attestation key signed the quote), `qualifying-data`
    (the quote is over another statement), `pcr` (a PCR differs from the policy's), `stale` (older than the
    policy's `maxAge`, or its TSA time or TPM clock more than the policy's `window` from the receipt's time),
    `timestamp` (the policy asks for an RFC 3161 timestamp of the quote and none is trusted and over it),
    `model-digest` (the receipt is about another model), `node` (the quote's key is not the node the statement
    or the caller names: a receipt replayed from another node).
    """

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path, self.reason, self.detail = path, reason, detail


class MalformedArtifactError(VerificationError):
    """A file, bundle, header or manifest cannot be parsed within the limits (parse failures fail closed)."""


class InvalidReferenceError(MalformedArtifactError):
    """An image or `oci://` reference is not valid under the distribution reference grammar.

    A container runtime refuses it too; `reason` says which rule it breaks (e.g. an upper-case repository).
    """

    def __init__(self, reference: str, reason: str) -> None:
        super().__init__(f"{reference!r} is not a valid image reference: {reason}")
        self.reference, self.reason = reference, reason


class PolicyViolationError(VerificationError):
    """The artifact is well formed but refused by policy (pickle, remote code, missing evidence)."""


class ModelMovedError(PolicyViolationError):
    """A model's path named another directory or file than the one opened (renamed or swapped meanwhile).

    The policy that decides about a local model is chosen from the opened descriptor; this is raised when
    the path that descriptor was reached by, the policy's match and the opened object disagree, e.g. while
    someone who can write the folder above the model exchanges it with a link. Retrying is not advised: the
    folder above the model is being changed.

    Attributes:
        path: The model path as given.
    """

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}; refused (the model path changed while it was opened)")
        self.path = path


class PickleContentError(PolicyViolationError):
    """A file's bytes are, or may hold, a pickle, and the policy refuses pickles (`refusePickle`).

    Attributes:
        path: The file (model directory / relative name).
        finding: What its bytes are (`modelsec.modelformat.content.pickle_finding`), e.g.
            "a gzip-compressed pickle (protocol 4)".
    """

    def __init__(self, path: str, finding: str) -> None:
        remedy = (
            "sign the unpacked files instead (each is then verified)"
            if "may hold pickles" in finding
            else "convert the weights to safetensors"
        )
        super().__init__(
            f"{path}: pickle content not allowed: the file is {finding}, whatever its name (unpickling runs "
            f"code even when signed); {remedy}, or verify under a policy with refusePickle: false"
        )
        self.path, self.finding = path, finding


class PolicyError(Error):
    """The policy file (or the options that stand for it) is invalid."""


class BundleExistsError(PolicyError):
    """Signing would replace, or leave beside its new bundle, a signature bundle that exists already.

    Nothing was written. `path` is the bundle in the way; `reason` says why (it would be replaced, or it is
    a default-named bundle that signs another model than the one just signed); `option` names what replaces
    it (`sign --force`, `sign_model(force=True)`).
    """

    def __init__(self, path: str, reason: str, *, option: str = "--force") -> None:
        super().__init__(f"{path}: {reason}; nothing was written (pass {option} to replace it)")
        self.path, self.reason, self.option = path, reason, option


class KeyMaterialError(Error):
    """A key file cannot be read, decrypted or parsed, or has the wrong type."""


class UnsupportedAlgorithmError(Error):
    """The requested algorithm, curve or hash is not supported by modelsec."""


class GateFailedError(Error):
    """A release gate (watermark detection, PGD robustness) was not met at release time."""


class BackendUnavailableError(Error):
    """A cryptographic or storage backend is missing or unreachable. The only retryable error."""

    retryable = True


class RegistryUnreachableError(BackendUnavailableError):
    """An OCI registry could not be spoken to: nothing listens, no answer in time, or TLS failed.

    `problem` says which, and the message what to do next: `plain-http-server` (the registry speaks plain
    HTTP: `--plain-http` / `MODELSEC_OCI_PLAIN_HTTP=1` for a development registry), `untrusted-certificate`
    (its CA: `--registry-ca` / `MODELSEC_OCI_CA`), `tls-server` (plain HTTP was sent to a TLS registry),
    `tls` (another TLS failure), `timeout`, `connection`. The third-party error's own text is in `details`;
    `what` names the request's object (a blob, a manifest) when one was being transferred.
    """

    _NEXT: ClassVar[dict[str, str]] = {
        "plain-http-server": "it answered in plain HTTP, not TLS: for a development registry give "
        "--plain-http (or set MODELSEC_OCI_PLAIN_HTTP=1)",
        "untrusted-certificate": "its TLS certificate is not trusted: give its CA bundle with --registry-ca "
        "(or set MODELSEC_OCI_CA)",
        "tls-server": "it speaks TLS, not plain HTTP: leave out --plain-http "
        "(and unset MODELSEC_OCI_PLAIN_HTTP)",
        "tls": "the TLS handshake failed: check the address and --registry-ca / --plain-http",
        "timeout": "no answer in time: check the address and the network, then retry",
        "connection": "cannot connect: check the address and that the registry is running, then retry",
    }

    def __init__(self, registry: str, problem: str, detail: str = "", *, what: str = "") -> None:
        where = f"registry {registry}: {what}" if what else f"registry {registry}"
        super().__init__(f"{where}: {self._NEXT[problem]}")
        self.registry, self.problem, self.what = registry, problem, what
        self.details = (detail,) if detail else ()


class ServerUnreachableError(BackendUnavailableError):
    """The modelsec gRPC service could not be spoken to: TLS against plaintext, plaintext against TLS.

    `problem` says which, and the message what to do next: `plaintext-server` (TLS was spoken to a plaintext
    server: `--plaintext`, a `grpc://` store), `tls-server` (plaintext was spoken and the server closed the
    connection, as a TLS server does: leave out `--plaintext`, give `--tls-ca`), `untrusted-certificate`
    (its CA: `--tls-ca`), `tls` (another TLS failure). gRPC's own text is in `details`.
    """

    _NEXT: ClassVar[dict[str, str]] = {
        "plaintext-server": "it answered in plaintext, not TLS: for a development server give --plaintext "
        "(a grpc:// store)",
        "tls-server": "it closed a plaintext connection, as a TLS server does: leave out --plaintext and "
        "give its CA with --tls-ca (a grpcs:// store)",
        "untrusted-certificate": "its TLS certificate is not trusted: give its CA bundle with --tls-ca",
        "tls": "the TLS handshake failed: check the address, --tls-ca and --tls-cert/--tls-key",
    }

    def __init__(self, server: str, problem: str, detail: str = "") -> None:
        super().__init__(f"server {server}: {self._NEXT[problem]}")
        self.server, self.problem = server, problem
        self.details = (detail,) if detail else ()


class AuthenticationError(Error):
    """The caller presented no credentials, or unknown ones (no client certificate, unknown bearer token)."""


class PermissionDeniedError(Error):
    """An authenticated caller may not perform this operation, use this key, or read this path."""


class NotFoundError(Error):
    """A named resource (a key version, a watermark key) does not exist."""
