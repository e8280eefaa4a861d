"""A client of the OCI distribution API: manifests, blobs and referrers (OCI 1.1, tag-schema fallback).

The transport under `modelsec push` / `pull` and the `oci://` attestation store (DESIGN.md decisions 14-15).
It trusts nothing it reads: every manifest and blob fetched by digest is hashed and compared before it is
returned, every body is read against a byte budget, and every request has a timeout. Nothing here decides
whether a model or bundle is trustworthy; callers verify signatures.

Referrers are listed with `GET /v2/<repo>/referrers/<digest>` (OCI distribution 1.1); a registry that lacks
the API (404, e.g. CNCF distribution 2.8) is read through the fallback tag `sha256-<hex>`, an image index of
the referrers that pushers maintain. Writing a referrer updates that index unless the registry answers the
manifest PUT with `OCI-Subject` (it indexes referrers itself). The fallback index is read-modify-write, as
the specification describes it: two pushers racing can drop one descriptor (push again to restore it).

Credentials: `RegistryOptions.username` / `password` (from `$MODELSEC_OCI_USERNAME` /
`$MODELSEC_OCI_PASSWORD`), else the `auths` entry for the registry in `$DOCKER_CONFIG/config.json` or
`~/.docker/config.json` (a Kubernetes `dockerconfigjson` Secret mounted there). Basic and Bearer-token
challenges are answered. Credentials and tokens are sent to the client's own registry only (an absolute URL
elsewhere, such as an upload `Location` on another host, gets no `Authorization`); a Bearer token is kept per
repository until its `expires_in` (60 s when the token server does not say, as the Docker token
specification defines).

Retries: only what may be sent twice is. A GET or HEAD that met a refused, reset or dropped connection, or an
HTTP 429/502/503/504, is sent again up to `RegistryOptions.retries` (3) times after an exponential back-off
with jitter (0.05-0.1 s, then doubling, at most 2 s); a timeout is not retried (the caller's deadline holds).
A blob upload is retried as a whole: it resumes at the offset the registry reports for the upload, or starts
again with a new upload. POST, PATCH, PUT and DELETE requests are never sent twice on their own. The error
that ends the retries is the last one, naming the registry and the blob.

Transfers (OCI distribution spec 1.1, "Pushing blobs"): a blob up to `RegistryOptions.chunk_bytes` (64 MiB)
goes in one POST + PUT; a larger one in PATCHes of that size with `Content-Range`, then a PUT with its
digest. A pushed file is read once: with its expected digest (the verified manifest's) the registry's own
check of the digest at the commit refuses a file that changed; without one it is hashed as it is sent. A
pulled blob is hashed as it is written; the caller writes into a staging file and uses it only after
`stream_blob` returns. `run_bounded` moves several layers at once (`RegistryOptions.transfers`, 4).

Connections: a client keeps its TLS connections open (HTTP keep-alive, up to `_POOL_CONNECTIONS` per
registry) and every body it does not want is read to its end (a small one) so the connection goes back to
the pool. A long-lived process (the webhook) shares one client per registry and credentials through
`shared_client` (a bounded, thread-safe `ClientPool`), so a decision pays neither a TLS handshake nor an
authentication challenge. What a client fetched *by digest* and is small (referrer manifests, bundles,
configs: at most 64 KiB each, 8 MiB in all) is kept and served again without a request: its bytes were
checked against the digest, so they cannot change; tags and listings, which can move, are always read.

Why not oras-py: its request wrapper retries any connection error with sleeps of up to 83 s (a webhook
must fail closed within its deadline), sets no timeouts, re-serialises manifests it uploads (the digest
is then not the caller's), does not compare pulled blobs with their digests, and lists no referrers.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import json
import os
import random
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from modelsec.errors import (
    BackendUnavailableError,
    DigestMismatchError,
    Error,
    KeyMaterialError,
    MalformedArtifactError,
    NotFoundError,
    RegistryUnreachableError,
)
from modelsec.registry.reference import DOCKER_HUB, DOCKER_HUB_ENDPOINT, OciReference, parse_reference

__all__ = [
    "BINDING_ARTIFACT_TYPE",
    "BUNDLE_ARTIFACT_TYPE",
    "EMPTY_CONFIG",
    "INDEX_MEDIA_TYPE",
    "MANIFEST_MEDIA_TYPE",
    "BlobSink",
    "ClientPool",
    "OciReference",
    "RegistryClient",
    "RegistryOptions",
    "descriptor",
    "parse_reference",
    "root_tag",
    "run_bounded",
    "shared_client",
]

T = TypeVar("T")

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
BUNDLE_ARTIFACT_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
# The `artifactType` bindings were attached under before they became sigstore-bundle referrers like every
# other bundle (`modelsec.registry.referrers`): read, never written.
BINDING_ARTIFACT_TYPE = "application/vnd.modelsec.oci-binding.v1+json"
EMPTY_CONFIG = {
    "mediaType": "application/vnd.oci.empty.v1+json",
    "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    "size": 2,
}
_MAX_MANIFEST_BYTES = 4 * 2**20  # containerd's and distribution's limit on a manifest
_CHUNK = 2**20
_POOL_CONNECTIONS = 16  # kept-alive connections per registry (a webhook decides on a few threads)
_DRAIN_BYTES = 64 * 2**10  # an unwanted body up to this size is read to keep its connection
_CONTENT_ITEM_BYTES = 64 * 2**10  # what is fetched by digest and kept, per item (manifests, bundles)
_CONTENT_TOTAL_BYTES = 8 * 2**20  # ... and in all, per client
_TOKEN_LIFETIME = 60.0  # seconds a Bearer token lives when the token server omits `expires_in`
_TOKEN_MARGIN = 5.0  # a token is dropped this long before it expires (a request must not race it)
_MAX_TOKENS = 1024  # repositories whose Bearer token (or referrers capability) is kept
_NO_API_SECONDS = 60.0  # a registry without the referrers API is asked again after this long

_TRANSFERS = 4  # layers pushed or pulled at once (`RegistryOptions.transfers`)
_CHUNK_BYTES = 64 * 2**20  # upload PATCH size (each held in memory once); a blob up to it goes in one PUT
# (measured: the registry spends about 23 % more CPU than on one PUT with 16 MiB PATCHes, 12 % with 64 MiB)
_RETRIES = 3  # sends after the first, of an idempotent request or a whole blob upload
_BACKOFF_SECONDS = 0.1  # the first back-off's ceiling; it doubles per retry ...
_BACKOFF_MAX_SECONDS = 2.0  # ... up to this
_RETRY_STATUS = frozenset({429, 502, 503, 504})  # answers that say "try again" (RFC 9110 15.6.4, RFC 6585 4)

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class BlobSink(Protocol):
    """Where `RegistryClient.stream_blob` writes a blob: a binary file, or a wrapper that sees every byte."""

    def write(self, data: bytes, /) -> int:
        """Write the next bytes."""
        ...

    def seekable(self) -> bool:
        """Whether `seek(0)` and `truncate()` start the blob again (a download the registry cannot resume)."""
        ...

    def seek(self, offset: int, /) -> int:
        """Go back to `offset` (only 0 is asked for)."""
        ...

    def truncate(self) -> int:
        """Drop everything after the current position."""
        ...


def _transient(cause: BaseException | None) -> bool:
    """Whether a transport failure may pass when the request is sent again.

    A refused, reset or dropped connection (also one dropped during the TLS handshake) is; a timeout is not
    (each attempt may take the whole timeout), nor a certificate or protocol failure.
    """
    import requests

    if isinstance(cause, requests.exceptions.Timeout):
        return False
    if isinstance(cause, requests.exceptions.SSLError):
        text = str(cause)
        return "EOF" in text or "ECONNRESET" in text or "Connection reset" in text
    return isinstance(cause, requests.exceptions.ConnectionError | requests.exceptions.ChunkedEncodingError)


def _backoff(attempt: int) -> None:
    """Sleep before retry `attempt` (0-based): exponential with "equal jitter" (half fixed, half random).

    The jitter spreads the retries of many clients that failed together (AWS Architecture Blog, "Exponential
    Backoff And Jitter", 2015).
    """
    ceiling = min(_BACKOFF_MAX_SECONDS, _BACKOFF_SECONDS * 2**attempt)
    time.sleep(ceiling / 2 + random.uniform(0, ceiling / 2))  # noqa: S311 - timing jitter, not a secret


@functools.cache
def _err_clear_error() -> Callable[[], None]:
    """OpenSSL's `ERR_clear_error` of the libcrypto that Python's `ssl` uses (a no-op where not found)."""
    try:
        import _ssl
        import ctypes

        function: Callable[[], None] = ctypes.CDLL(_ssl.__file__).ERR_clear_error
        function.restype = None  # type: ignore[attr-defined]
    except (ImportError, OSError, AttributeError):
        return lambda: None
    return function


def _clear_tls_errors() -> None:
    """Empty this thread's OpenSSL error queue before a request.

    OpenSSL tells "would block" from a failure by reading the queue (`SSL_get_error`), so an error that
    another library left in this thread turns the next TLS read or write into a spurious `SSLError` (SoftHSM2,
    loaded in-process for a PKCS#11 key, leaves ENGINE "no such engine" from `C_Initialize`). CPython empties
    the queue only when it opens a TLS connection; a thread that reuses a kept-alive connection another
    thread opened (the layers move on worker threads) would otherwise meet it.
    """
    _err_clear_error()()


def _with_digest(location: str, digest: str) -> str:
    return f"{location}{'&' if '?' in location else '?'}digest={digest}"


class _BodyLostError(RegistryUnreachableError):
    """The connection was lost while a body was read (the request itself was answered)."""


class _DigestRefusedError(Exception):
    """The registry refused an upload's commit: the bytes it received hash otherwise than the digest."""


class _TransientUploadError(Exception):
    """A step of a blob upload failed in a way another attempt may pass; `error` is what to raise if not."""

    def __init__(self, error: Error) -> None:
        super().__init__(str(error))
        self.error = error


def run_bounded(jobs: Sequence[Callable[[], T]], limit: int) -> list[T]:
    """Run `jobs` with at most `limit` at once (threads); their results in order.

    The first job to raise (or an interrupt of the caller) stops the jobs not yet started; those running
    finish, then its error is raised (the others' errors are dropped).

    Raises:
        Whatever the first failing job raised.
    """
    if limit <= 1 or len(jobs) <= 1:
        return [job() for job in jobs]
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(max_workers=min(limit, len(jobs)), thread_name_prefix="modelsec-oci") as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:
            # An interrupt (Ctrl-C): start nothing more; the pool's exit waits for the jobs running, so the
            # caller's clean-up (a staging directory removed) runs after their last write.
            for future in futures:
                future.cancel()
            raise
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            wait(futures)
            raise failed.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


def root_tag(root_digest: str) -> str:
    """The tag `modelsec push` gives a model's manifest: `oms-sha256-<model root digest>`.

    The `oci://` store finds a model's referrers from its root digest through it.
    """
    return f"oms-sha256-{root_digest}"


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    """An OCI content descriptor of `data` (extra fields: `artifactType`, `annotations`)."""
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
        **extra,
    }


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """The bytes modelsec pushes for a manifest or index (its digest is the digest of these bytes)."""
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True, slots=True)
class RegistryOptions:
    """How to reach a registry.

    Attributes:
        ca_file: CA bundle for the registry's TLS certificate (None: the system roots).
        plain_http: Speak HTTP instead of HTTPS (development registries only).
        username: Basic credentials (also sent to a Bearer token realm).
        password: The password or token for `username`.
        timeout: Seconds per connect and per read.
        docker_config: A Docker `config.json` to read credentials from when no username is given.
        transfers: Layers pushed or pulled at once (threads, each with its own kept-alive connection).
        chunk_bytes: A blob larger than this is uploaded in PATCHes of this size, a smaller one in one PUT;
            each is held in memory once (`transfers` x `chunk_bytes` at most).
        retries: How many times an idempotent request (GET, HEAD) or a whole blob upload is sent again
            after a transient failure (see `RegistryClient.request`); 0: never.
    """

    ca_file: Path | None = None
    plain_http: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = 10.0
    docker_config: Path | None = None
    transfers: int = _TRANSFERS
    chunk_bytes: int = _CHUNK_BYTES
    retries: int = _RETRIES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RegistryOptions:
        """Options from the environment (`overrides` that are not None win).

        Variables: `$MODELSEC_OCI_USERNAME`, `_PASSWORD`, `_CA`, `_PLAIN_HTTP` (`1`), `_TIMEOUT` (seconds),
        `_TRANSFERS` (layers at once, 1-64), `$DOCKER_CONFIG` (a directory holding `config.json`).

        Raises:
            MalformedArtifactError: `$MODELSEC_OCI_TIMEOUT` is not a number, or `_TRANSFERS` not 1-64.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "username": env.get("MODELSEC_OCI_USERNAME") or None,
            "password": env.get("MODELSEC_OCI_PASSWORD") or None,
            "ca_file": Path(env["MODELSEC_OCI_CA"]) if env.get("MODELSEC_OCI_CA") else None,
            "plain_http": env.get("MODELSEC_OCI_PLAIN_HTTP", "") in ("1", "true"),
            "docker_config": Path(env["DOCKER_CONFIG"]) / "config.json" if env.get("DOCKER_CONFIG") else None,
        }
        if env.get("MODELSEC_OCI_TIMEOUT"):
            try:
                values["timeout"] = float(env["MODELSEC_OCI_TIMEOUT"])
            except ValueError:
                raise MalformedArtifactError("$MODELSEC_OCI_TIMEOUT is not a number of seconds") from None
        if env.get("MODELSEC_OCI_TRANSFERS"):
            text = env["MODELSEC_OCI_TRANSFERS"]
            if not text.isdigit() or not 1 <= int(text) <= 64:
                raise MalformedArtifactError(f"$MODELSEC_OCI_TRANSFERS {text!r} is not a number from 1 to 64")
            values["transfers"] = int(text)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _docker_credentials(path: Path | None, registry: str) -> str | None:
    """The base64 `user:password` for `registry` in a Docker config file, or None.

    None when the file does not exist, is not JSON, or has no `auths.<registry>.auth` string (anonymous
    access, as the Docker CLI without a login).

    Raises:
        KeyMaterialError: The file exists but is not a regular file (a FIFO is refused, never waited on), is
            unreadable, or is larger than 1 MiB.
    """
    from modelsec.safe_io import read_regular_file

    path = path or Path.home() / ".docker" / "config.json"
    if not os.path.lexists(path):
        return None
    data = read_regular_file(path, "Docker config file", max_bytes=2**20, error=KeyMaterialError)
    # The Docker CLI files Docker Hub's credentials under its legacy index URL.
    keys = (registry, "https://index.docker.io/v1/") if registry == DOCKER_HUB else (registry,)
    auth = None
    for key in keys:
        try:
            auth = json.loads(data)["auths"][key]["auth"]
        except (ValueError, KeyError, TypeError):
            continue
        break
    else:
        return None
    return auth if isinstance(auth, str) and auth else None


_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def _credentials(options: RegistryOptions, registry: str) -> str | None:
    """The base64 `user:password` to answer `registry`'s challenges with (None: anonymous).

    Raises:
        KeyMaterialError: See `_docker_credentials`.
    """
    if options.username:
        return base64.b64encode(f"{options.username}:{options.password or ''}".encode()).decode()
    return _docker_credentials(options.docker_config, registry)


def _discard(response: Any) -> None:
    """Give `response`'s connection back to the pool: read a small unwanted body to its end, else close.

    Closing a streamed response before its end closes its connection (urllib3), so the next request
    would pay a new TCP and TLS handshake.
    """
    try:
        read = 0
        for chunk in response.iter_content(16 * 2**10):
            read += len(chunk)
            if read > _DRAIN_BYTES:
                break
    except Exception:  # noqa: BLE001,S110 - the body is unwanted: a failure only costs the connection
        pass
    response.close()


def _repository_of(path: str) -> str:
    """The repository a `/v2/<repository>/(manifests|blobs|referrers|tags)/…` path names ("" for `/v2/`)."""
    match = _REPOSITORY_PATH.search(path)
    return match.group(1) if match else ""


_REPOSITORY_PATH = re.compile(r"/v2/(.+?)/(?:manifests|blobs|referrers|tags)/")


class _ContentCache:
    """Small content fetched by digest (verified), by (repository, digest): least recently used first out."""

    def __init__(self, max_item_bytes: int, max_total_bytes: int) -> None:
        self._items: OrderedDict[tuple[str, str], tuple[bytes, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._max_item, self._max_total = max_item_bytes, max_total_bytes

    def get(self, repository: str, digest: str) -> tuple[bytes, str] | None:
        with self._lock:
            item = self._items.get((repository, digest))
            if item is not None:
                self._items.move_to_end((repository, digest))
            return item

    def put(self, repository: str, digest: str, data: bytes, media_type: str = "") -> None:
        if len(data) > self._max_item:
            return
        with self._lock:
            key = (repository, digest)
            if key in self._items:
                return
            self._items[key] = (data, media_type)
            self._bytes += len(data)
            while self._bytes > self._max_total:
                _, (old, _) = self._items.popitem(last=False)
                self._bytes -= len(old)


class RegistryClient:
    """One registry, reached over the distribution API (see the module docstring).

    Thread-safe: threads may share a client (`shared_client`); each request takes a kept-alive connection
    of its own from the client's pool.
    """

    def __init__(
        self,
        registry: str,
        options: RegistryOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create a client (no request is made yet).

        Args:
            registry: `host[:port]` as references normalise it (`docker.io` for Docker Hub).
            options: TLS, credentials and timeout; default `RegistryOptions()`.
            clock: Monotonic seconds, for token lifetimes (tests inject one).

        Raises:
            BackendUnavailableError: The oci extra (requests) is not installed.
            KeyMaterialError: The Docker config file cannot be read (see `_docker_credentials`).
        """
        try:
            import requests
            import requests.adapters
        except ModuleNotFoundError as e:
            raise BackendUnavailableError(
                "OCI registries need the oci extra: pip install 'modelsec[oci]'"
            ) from e
        self.registry = registry
        self.options = options or RegistryOptions()
        self._requests = requests
        self._session = requests.Session()
        self._session.trust_env = False  # no proxies or netrc credentials from the environment
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=1, pool_maxsize=_POOL_CONNECTIONS, max_retries=0
        )
        for prefix in ("http://", "https://"):
            self._session.mount(prefix, adapter)
        self._verify: bool | str = str(self.options.ca_file) if self.options.ca_file else True
        # Docker Hub is named `docker.io` (what references normalise to) and served at its API host.
        endpoint = DOCKER_HUB_ENDPOINT if registry == DOCKER_HUB else registry
        self._origin = ("http" if self.options.plain_http else "https") + f"://{endpoint}"
        self._base = self._origin + "/v2/"
        self._basic = _credentials(self.options, registry)
        self._clock = clock
        self._lock = threading.Lock()
        # What answered the last challenges: Basic for the whole registry, a Bearer token per repository.
        self._basic_accepted = False
        # repository -> (bearer token, expiry on self._clock, the actions it was granted for: pull, push...)
        self._tokens: dict[str, tuple[str, float, frozenset[str]]] = {}
        self._no_referrers_api: dict[str, float] = {}  # repository -> until when the fallback tag is read
        self._content = _ContentCache(_CONTENT_ITEM_BYTES, _CONTENT_TOTAL_BYTES)

    def close(self) -> None:
        """Close the HTTP session (a pooled client from `shared_client` is closed by its pool, never here)."""
        self._session.close()

    # -- transport ---------------------------------------------------------------------------------------

    def _own(self, url: str) -> bool:
        """Whether `url` is on this client's registry (only there are its credentials sent)."""
        return url == self._origin or url.startswith(self._origin + "/")

    def _authorization(self, url: str) -> str | None:
        """The `Authorization` to send with a request to `url` (None: none, e.g. another host)."""
        if not self._own(url):
            return None
        repository = _repository_of(url[len(self._origin) :])
        with self._lock:
            token = self._tokens.get(repository)
            if token is not None:
                if self._clock() < token[1]:
                    return f"Bearer {token[0]}"
                del self._tokens[repository]  # expired: the next challenge gets a fresh one
        return f"Basic {self._basic}" if self._basic_accepted and self._basic else None

    def _send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        data: Any,
        stream: bool,
        auth: str | None,
        what: str = "",
    ) -> Any:
        if auth:
            headers = {**headers, "Authorization": auth}
        _clear_tls_errors()
        try:
            return self._session.request(
                method,
                url,
                headers=headers,
                data=data,
                stream=stream,
                verify=self._verify,
                timeout=self.options.timeout,
                allow_redirects=True,
            )
        except self._requests.RequestException as e:
            raise RegistryUnreachableError(
                self.registry, self._problem(e), f"{method} {url}: {e}", what=what
            ) from e

    def _problem(self, e: Exception) -> str:
        """Which `RegistryUnreachableError.problem` a requests exception is (see that class)."""
        text = str(e)
        if isinstance(e, self._requests.exceptions.SSLError):
            # OpenSSL's words for a TLS client that got an HTTP answer (1.1: wrong version number; 3.x: record
            # layer failure / packet length too long).
            if any(
                w in text
                for w in (
                    "WRONG_VERSION_NUMBER",
                    "wrong version number",
                    "record layer failure",
                    "packet length too long",
                    "http request",
                )
            ):
                return "plain-http-server"
            if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
                return "untrusted-certificate"
            return "tls"
        if isinstance(e, self._requests.exceptions.Timeout):
            return "timeout"
        return "connection"

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        data: Any = None,
        stream: bool = False,
        what: str = "",
    ) -> Any:
        """One request under `/v2/` (or an absolute upload URL), answering one authentication challenge.

        GET and HEAD, which are idempotent, are sent again after a transient failure (a refused, reset or
        dropped connection, or HTTP 429, 502, 503 or 504), at most `RegistryOptions.retries` times, after an
        exponential back-off with jitter (`_backoff`). A timeout is not retried (each attempt may take
        `timeout`; a webhook must fail closed within its deadline), and no other method is sent twice (a
        blob upload restarts as a whole, see `put_blob`).

        Args:
            method: The HTTP method.
            path: Relative to `/v2/`, or an absolute URL (an upload `Location`).
            headers: Extra request headers.
            data: The body (bytes or a file object).
            stream: Leave the body unread (the caller reads or discards it).
            what: The object transferred (a blob digest), named in the error.

        Raises:
            RegistryUnreachableError: Unreachable or TLS failure (after the retries, for GET and HEAD).
            BackendUnavailableError: A 5xx answer (after the retries, for GET and HEAD), or credentials
                refused.
        """
        idempotent = method in ("GET", "HEAD")
        attempt = 0
        while True:
            try:
                response = self._request_once(method, path, headers, data, stream, what)
            except RegistryUnreachableError as e:
                if not idempotent or attempt >= self.options.retries or not _transient(e.__cause__):
                    raise
            else:
                if not (
                    idempotent and response.status_code in _RETRY_STATUS and attempt < self.options.retries
                ):
                    return self._checked(method, path, response, what)
                _discard(response)
            _backoff(attempt)
            attempt += 1

    def _request_once(
        self, method: str, path: str, headers: dict[str, str] | None, data: Any, stream: bool, what: str
    ) -> Any:
        url = path if path.startswith(("http://", "https://")) else self._base + path
        headers = dict(headers or {})
        sent = self._authorization(url)
        response = self._send(method, url, headers, data, stream, sent, what)
        # A 401 is answered at most twice: with credentials another thread stored meanwhile, and then (their
        # token may be for a narrower scope: `pull` where this request needs `pull,push`) with this
        # request's own challenge answered here.
        for _ in range(2):
            if response.status_code != 401 or (
                self._authorization(url) == sent and not self._answer(response, url, sent)
            ):
                break
            _discard(response)
            if hasattr(data, "seek"):
                data.seek(0)
            sent = self._authorization(url)
            response = self._send(method, url, headers, data, stream, sent, what)
        if (
            self.options.plain_http
            and response.status_code == 400
            and b"HTTPS server" in response.content[:200]
        ):
            # Go's net/http (the CNCF registry, Harbor, Zot) answers plain HTTP on a TLS port with this 400.
            raise RegistryUnreachableError(
                self.registry, "tls-server", f"{method} {url}: HTTP 400", what=what
            )
        return response

    def _checked(self, method: str, path: str, response: Any, what: str) -> Any:
        """`response`, unless it is a refusal of the credentials or a server error (raised)."""
        about = f"{what}: " if what else ""
        if response.status_code in (401, 403):
            _discard(response)
            raise BackendUnavailableError(f"registry {self.registry}: {about}{method} {path}: access denied")
        if response.status_code >= 500:
            _discard(response)
            raise BackendUnavailableError(
                f"registry {self.registry}: {about}{method} {path}: HTTP {response.status_code}"
            )
        return response

    def _answer(self, response: Any, url: str, sent: str | None) -> bool:
        """Answer a 401 challenge to a request to `url`; False when there is nothing new to send."""
        if not self._own(url):
            return False  # another host: its challenge is never answered with this registry's credentials
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic":
            if not self._basic or sent == f"Basic {self._basic}":
                return False
            self._basic_accepted = True
            return True
        if scheme != "bearer":
            return False
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            return False
        repository = _repository_of(url[len(self._origin) :])
        # One token per repository serves every request to it, so it is asked for every action granted so
        # far as well as this challenge's: a `pull` token answered on another thread never replaces one for
        # `pull,push` (a push moves layers on several threads at once).
        scope_type, _, rest = params.get("scope", "").partition(":")
        name, _, actions = rest.rpartition(":")
        wanted = frozenset(a for a in actions.split(",") if a)
        if scope_type == "repository" and name and wanted:
            with self._lock:
                held = self._tokens.get(repository)
                if held is not None and self._clock() < held[1]:
                    wanted |= held[2]
            params["scope"] = f"repository:{name}:{','.join(sorted(wanted))}"
        headers = {"Authorization": f"Basic {self._basic}"} if self._basic else {}
        try:
            got = self._session.get(
                realm, params=params, headers=headers, verify=self._verify, timeout=self.options.timeout
            )
            body = got.json() if got.status_code == 200 else {}
        except (self._requests.RequestException, ValueError) as e:
            raise BackendUnavailableError(f"registry {self.registry}: token request failed") from e
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token or sent == f"Bearer {token}":
            return False
        lifetime = body.get("expires_in")
        if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
            lifetime = _TOKEN_LIFETIME
        with self._lock:
            if len(self._tokens) >= _MAX_TOKENS:
                self._tokens.clear()
            now, held = self._clock(), self._tokens.get(repository)
            if held is not None and now < held[1] and held[2] >= wanted and sent != f"Bearer {held[0]}":
                return True  # another thread stored a token for these actions meanwhile: use that one
            self._tokens[repository] = (token, now + max(0.0, float(lifetime) - _TOKEN_MARGIN), wanted)
        return True

    def _retrying(self, fetch: Callable[[], T]) -> T:
        """`fetch()` (a GET and the read of its body), called again after a connection lost mid-body.

        As `request` retries the GET itself: at most `RegistryOptions.retries` times, after `_backoff`.
        """
        attempt = 0
        while True:
            try:
                return fetch()
            except _BodyLostError as e:
                if attempt >= self.options.retries or not _transient(e.__cause__):
                    raise
            _backoff(attempt)
            attempt += 1

    def _read(self, response: Any, max_bytes: int, what: str) -> bytes:
        out = bytearray()
        try:
            for chunk in response.iter_content(_CHUNK):
                out += chunk
                if len(out) > max_bytes:
                    response.close()
                    raise MalformedArtifactError(f"{what}: larger than {max_bytes} bytes")
        except self._requests.RequestException as e:
            response.close()
            raise _BodyLostError(self.registry, self._problem(e), f"{what}: {e}", what=what) from e
        return bytes(out)

    def check(self) -> None:
        """`GET /v2/`: raise unless the registry answers and accepts the credentials.

        Raises:
            BackendUnavailableError: Unreachable, or not an OCI registry.
        """
        response = self.request("GET", "")
        if response.status_code != 200:
            raise BackendUnavailableError(
                f"registry {self.registry}: /v2/ answered HTTP {response.status_code}"
            )

    # -- manifests ---------------------------------------------------------------------------------------

    def get_manifest(self, repository: str, ref: str) -> tuple[bytes, str, str]:
        """A manifest or index by tag or digest: `(bytes, media type, sha256 digest of the bytes)`.

        A small manifest read by digest before is answered from the client's content cache (its bytes were
        checked against the digest); a tag is always resolved by the registry.

        Raises:
            NotFoundError: No such manifest.
            DigestMismatchError: `ref` is a digest and the bytes hash otherwise.
            MalformedArtifactError: Larger than 4 MiB.
            BackendUnavailableError: See `request`.
        """
        what = (
            f"oci://{self.registry}/{repository}@{ref}"
            if ref.startswith("sha256:")
            else f"oci://{self.registry}/{repository}:{ref}"
        )
        cached = self._content.get(repository, "manifest:" + ref) if _DIGEST.fullmatch(ref) else None
        if cached is not None:
            return cached[0], cached[1], ref

        def fetch() -> tuple[Any, bytes]:
            response = self.request(
                "GET",
                f"{repository}/manifests/{ref}",
                headers={"Accept": f"{MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}"},
                stream=True,
            )
            if response.status_code != 200:
                _discard(response)
                if response.status_code == 404:
                    raise NotFoundError(f"{what}: no such manifest")
                raise BackendUnavailableError(f"{what}: HTTP {response.status_code}")
            return response, self._read(response, _MAX_MANIFEST_BYTES, what)

        response, data = self._retrying(fetch)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if ref.startswith("sha256:") and not hmac.compare_digest(digest, ref):
            raise DigestMismatchError(what, ref, digest)
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        self._content.put(repository, "manifest:" + digest, data, media_type)
        return data, media_type, digest

    def known_manifest(self, repository: str, digest: str) -> bool:
        """Whether this client has read `digest` (`sha256:<hex>`) as a manifest of `repository` (no request).

        A digest read as a manifest is a manifest digest: callers can tell it from a model root digest.
        """
        return self._content.get(repository, "manifest:" + digest) is not None

    def put_manifest(self, repository: str, ref: str, data: bytes, media_type: str) -> Any:
        """PUT manifest bytes under a tag or their digest; returns the response (for `OCI-Subject`).

        Raises:
            BackendUnavailableError: Refused (the registry's message is quoted) or unreachable.
        """
        response = self.request(
            "PUT", f"{repository}/manifests/{ref}", headers={"Content-Type": media_type}, data=data
        )
        if response.status_code not in (200, 201):
            raise BackendUnavailableError(
                f"oci://{self.registry}/{repository}: manifest {ref} refused: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )
        return response

    # -- blobs -------------------------------------------------------------------------------------------

    def blob_exists(self, repository: str, digest: str) -> bool:
        """Whether the repository holds the blob (HEAD, retried as `request` says).

        Raises:
            BackendUnavailableError: See `request`.
        """
        response = self.request("HEAD", f"{repository}/blobs/{digest}", what=f"blob {digest}")
        return bool(response.status_code == 200)

    def put_blob(self, repository: str, digest: str, size: int, data: bytes | IO[bytes]) -> None:
        """Upload a blob of known digest unless the repository already holds it.

        `size` bytes are read from `data` (bytes, or a seekable file from its current position) once; a
        blob of at most `RegistryOptions.chunk_bytes` goes in one PUT, a larger one in PATCHes of that size
        (OCI distribution 1.1, "Pushing a blob in chunks"). The registry compares the bytes with `digest`.
        After a transient failure the upload resumes at the offset the registry reports, or starts again
        from the start, at most `RegistryOptions.retries` times.

        Raises:
            DigestMismatchError: The bytes read hash otherwise (nothing is committed).
            RegistryUnreachableError, BackendUnavailableError: The registry refused it (e.g. its digest
                differs) or is unreachable; the message names the registry and the blob.
        """
        if self.blob_exists(repository, digest):
            return
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data)
            self._upload(repository, lambda offset, n: view[offset : offset + n], size, digest, digest)
        else:
            start = data.tell()

            def read(offset: int, n: int) -> bytes:
                data.seek(start + offset)
                return data.read(n)

            self._upload(repository, read, size, digest, digest)

    def push_file(self, repository: str, path: Path, size: int, *, digest: str | None = None) -> str:
        """Upload a file as a blob, reading it once; returns its sha256 digest.

        With `digest` (e.g. from a verified manifest), a blob the repository holds already is not sent, and
        bytes that hash otherwise (the file changed since it was hashed) are refused at the commit by the
        registry (then the file is hashed again to name its digest now). Without it, the file is hashed as
        it is sent. Uploads as `put_blob` does (monolithic or chunked, resumed or restarted).

        Args:
            repository: The repository to push to.
            path: A regular file of `size` bytes.
            size: Its size in bytes (a file that is shorter now is refused).
            digest: Its expected `sha256:<hex>`, or None.

        Raises:
            DigestMismatchError: The bytes hash otherwise than `digest` (nothing is committed).
            MalformedArtifactError: The file cannot be read, or is shorter than `size`.
            RegistryUnreachableError, BackendUnavailableError: As for `put_blob`.
        """
        if digest is not None and self.blob_exists(repository, digest):
            return digest
        try:
            f = open(path, "rb")
        except OSError as e:
            raise MalformedArtifactError(f"{path}: cannot be read: {e.strerror}") from e

        def read(offset: int, n: int) -> bytes:
            try:
                data = os.pread(f.fileno(), n, offset)
            except OSError as e:
                raise MalformedArtifactError(f"{path}: cannot be read: {e.strerror}") from e
            if len(data) != n:
                raise MalformedArtifactError(f"{path}: shorter than its {size} bytes")
            return data

        with f:
            return self._upload(repository, read, size, digest, str(path))

    def _upload(
        self,
        repository: str,
        read: Callable[[int, int], bytes | memoryview],
        size: int,
        expected: str | None,
        what: str,
    ) -> str:
        """Send `size` bytes from `read(offset, n)` as one blob; its digest (see `put_blob`).

        Without `expected`, the bytes are hashed as they are sent and the digest is given at the end. With
        it, they are not hashed here: the registry hashes what it received and refuses a commit whose digest
        differs (OCI distribution 1.1, `DIGEST_INVALID`); only then is the source hashed again, to name
        the digest it has now.
        """
        chunk = max(1, self.options.chunk_bytes)
        about = f"blob {expected}" if expected else f"blob of {what}"
        attempt, location, offset = 0, "", 0
        hasher = hashlib.sha256() if expected is None else None
        try:
            while True:
                try:
                    if not location:
                        location, offset = self._start_upload(repository, about), 0
                        hasher = hashlib.sha256() if expected is None else None
                    if size <= chunk:
                        # Small enough for one request: the digest is known before the one PUT (monolithic).
                        body = read(0, size)
                        digest = expected or "sha256:" + hashlib.sha256(body).hexdigest()
                        self._upload_step("PUT", _with_digest(location, digest), body, {}, (201,), about)
                        return digest
                    while offset < size:
                        n = min(chunk, size - offset)
                        body = read(offset, n)
                        acknowledged = hasher.copy() if hasher is not None else None
                        if hasher is not None:
                            hasher.update(body)
                        try:
                            location = self._patch(location, offset, body, about)
                        except _TransientUploadError:
                            hasher = acknowledged
                            raise
                        offset += n
                    digest = expected or "sha256:" + hasher.hexdigest()  # type: ignore[union-attr]
                    self._upload_step("PUT", _with_digest(location, digest), b"", {}, (201,), about)
                    return digest
                except _TransientUploadError as e:
                    if attempt >= self.options.retries:
                        raise e.error from e.__cause__
                    _backoff(attempt)
                    attempt += 1
                    if not location or size <= chunk or self._upload_offset(location, about) != offset:
                        location = ""  # the registry holds other than what was acknowledged: from the start
        except _DigestRefusedError:
            with contextlib.suppress(Error):
                _discard(self.request("DELETE", location, what=about))  # cancel: nothing is committed
            again = hashlib.sha256()
            for start in range(0, size, chunk):
                again.update(read(start, min(chunk, size - start)))
            raise DigestMismatchError(what, str(expected), "sha256:" + again.hexdigest()) from None

    def _start_upload(self, repository: str, about: str) -> str:
        response = self._upload_step("POST", f"{repository}/blobs/uploads/", None, {}, (202,), about)
        return self._location(response, about)

    def _patch(self, location: str, offset: int, body: bytes | memoryview, about: str) -> str:
        headers = {"Content-Range": f"{offset}-{offset + len(body) - 1}"}
        return self._location(self._upload_step("PATCH", location, body, headers, (202,), about), about)

    def _upload_offset(self, location: str, about: str) -> int:
        """Bytes the registry holds of an upload (GET its location: 204, `Range: 0-<last>`); -1: unknown."""
        try:
            response = self.request("GET", location, what=about)
        except Error:
            return -1
        _discard(response)
        match = re.fullmatch(r"0-(\d+)", response.headers.get("Range", ""))
        return int(match.group(1)) + 1 if response.status_code == 204 and match else -1

    def _location(self, response: Any, about: str) -> str:
        location = str(response.headers.get("Location", ""))
        if not location:
            raise BackendUnavailableError(f"registry {self.registry}: {about}: upload without a Location")
        return self._origin + location if location.startswith("/") else location

    def _upload_step(
        self,
        method: str,
        url: str,
        body: bytes | memoryview | None,
        headers: dict[str, str],
        ok: tuple[int, ...],
        about: str,
    ) -> Any:
        """One request of an upload (sent once); a transient failure is raised as `_TransientUploadError`."""
        headers = {"Content-Type": "application/octet-stream", **headers}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            response = self._request_once(method, url, headers, body, False, about)
        except RegistryUnreachableError as e:
            if _transient(e.__cause__):
                raise _TransientUploadError(e) from e.__cause__
            raise
        if response.status_code in _RETRY_STATUS:
            _discard(response)
            error = BackendUnavailableError(
                f"registry {self.registry}: {about}: {method} refused: HTTP {response.status_code}"
            )
            raise _TransientUploadError(error)
        response = self._checked(method, url, response, about)
        if response.status_code == 400 and method == "PUT" and b"DIGEST_INVALID" in response.content[:4096]:
            raise _DigestRefusedError(about)
        if response.status_code not in ok:
            text = response.text[:300]
            raise BackendUnavailableError(
                f"registry {self.registry}: {about}: {method} refused: HTTP {response.status_code} {text}"
            )
        return response

    def _blob_response(self, repository: str, digest: str, offset: int = 0) -> Any:
        if not _DIGEST.fullmatch(digest):
            raise MalformedArtifactError(f"{digest!r} is not a sha256 digest")
        headers = {"Range": f"bytes={offset}-"} if offset else None
        response = self.request(
            "GET", f"{repository}/blobs/{digest}", headers=headers, stream=True, what=f"blob {digest}"
        )
        if response.status_code not in (200, 206):
            _discard(response)
        if response.status_code == 404:
            raise NotFoundError(f"oci://{self.registry}/{repository}: no blob {digest}")
        if response.status_code not in (200, 206):
            raise BackendUnavailableError(
                f"oci://{self.registry}/{repository}: blob {digest}: HTTP {response.status_code}"
            )
        return response

    def stream_blob(self, repository: str, digest: str, size: int, sink: BlobSink, *, what: str) -> None:
        """Write a blob to `sink`, refusing it unless it is exactly `size` bytes hashing to `digest`.

        Each byte is hashed as it is written (nothing is read back), and handed to `sink.write` in order,
        after every earlier byte, once per attempt (a restart seeks `sink` to 0 first). The caller must not
        use `sink`'s bytes before this returns: a refused blob may have been written in part (write into a
        staging file).
        A connection lost mid-body is resumed with a `Range` request at the bytes written (or, where the
        registry ignores the range, started again when `sink` can be truncated), at most
        `RegistryOptions.retries` times.

        Raises:
            DigestMismatchError: The bytes hash otherwise.
            MalformedArtifactError: More or fewer than `size` bytes.
            RegistryUnreachableError: The connection was lost and could not be resumed (names the blob).
            NotFoundError, BackendUnavailableError: As for `get_manifest`.
        """
        response = self._blob_response(repository, digest)
        h, n, attempt = hashlib.sha256(), 0, 0
        while True:
            try:
                for chunk in response.iter_content(_CHUNK):
                    n += len(chunk)
                    if n > size:
                        response.close()
                        raise MalformedArtifactError(
                            f"{what}: blob {digest} is larger than its descriptor's {size} bytes"
                        )
                    h.update(chunk)
                    sink.write(chunk)
                break
            except self._requests.RequestException as e:
                response.close()
                lost = RegistryUnreachableError(
                    self.registry, self._problem(e), f"GET blob {digest}: {e}", what=f"blob {digest}"
                )
                if attempt >= self.options.retries or not _transient(e):
                    raise lost from e
                _backoff(attempt)
                attempt += 1
                response = self._blob_response(repository, digest, n)
                if response.status_code == 206 and response.headers.get("Content-Range", "").startswith(
                    f"bytes {n}-"
                ):
                    continue
                if n and response.status_code == 200 and sink.seekable():
                    sink.seek(0)
                    sink.truncate()
                    h, n = hashlib.sha256(), 0
                    continue
                if response.status_code != 200 or n:
                    _discard(response)
                    raise lost from e
        if n != size:
            raise MalformedArtifactError(f"{what}: blob {digest} has {n} bytes, its descriptor {size}")
        actual = "sha256:" + h.hexdigest()
        if not hmac.compare_digest(actual, digest):
            raise DigestMismatchError(what, digest, actual)

    def get_blob(self, repository: str, digest: str, max_bytes: int, *, what: str) -> bytes:
        """A small blob (a bundle, a config) whose bytes must hash to `digest` (same errors).

        One read before is answered from the client's content cache (see `get_manifest`).
        """
        cached = self._content.get(repository, "blob:" + digest)
        if cached is not None:
            if len(cached[0]) > max_bytes:
                raise MalformedArtifactError(f"{what}: larger than {max_bytes} bytes")
            return cached[0]
        data = self._retrying(lambda: self._read(self._blob_response(repository, digest), max_bytes, what))
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if not hmac.compare_digest(actual, digest):
            raise DigestMismatchError(what, digest, actual)
        self._content.put(repository, "blob:" + digest, data)
        return data

    # -- referrers ---------------------------------------------------------------------------------------

    def referrers(
        self, repository: str, digest: str, artifact_type: str | None = None
    ) -> list[dict[str, Any]]:
        """The descriptors of manifests whose `subject` is `digest` (API, else the fallback tag).

        Descriptors are returned as the registry lists them (untrusted: fetch each by digest). A repository
        whose registry answered that it has no referrers API is read through the fallback tag for the next
        `_NO_API_SECONDS` without asking again (as oras-go keeps a repository's referrers capability), so a
        registry upgraded meanwhile is asked again within that time.

        Raises:
            MalformedArtifactError: The listing is not an image index of descriptors.
            BackendUnavailableError: See `request`.
        """
        what = f"oci://{self.registry}/{repository}: referrers of {digest}"
        with self._lock:
            no_api = self._no_referrers_api.get(repository, 0.0) > self._clock()
        if no_api:
            index = self._fallback_index(repository, digest)
            found = index.get("manifests", [])
            return [d for d in found if artifact_type is None or d.get("artifactType") == artifact_type]
        response = self.request(
            "GET", f"{repository}/referrers/{digest}", headers={"Accept": INDEX_MEDIA_TYPE}, stream=True
        )
        if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(
            INDEX_MEDIA_TYPE
        ):
            index = _parse_index(self._read(response, _MAX_MANIFEST_BYTES, what), what)
        elif response.status_code in (200, 400, 404, 405):
            _discard(response)
            with self._lock:
                if len(self._no_referrers_api) >= _MAX_TOKENS:
                    self._no_referrers_api.clear()
                self._no_referrers_api[repository] = self._clock() + _NO_API_SECONDS
            index = self._fallback_index(repository, digest)
        else:
            raise BackendUnavailableError(f"{what}: HTTP {response.status_code}")
        found = index.get("manifests", [])
        return [d for d in found if artifact_type is None or d.get("artifactType") == artifact_type]

    def _fallback_index(self, repository: str, digest: str) -> dict[str, Any]:
        tag = digest.replace(":", "-")
        try:
            data, _, _ = self.get_manifest(repository, tag)
        except NotFoundError:
            return {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": []}
        return _parse_index(data, f"oci://{self.registry}/{repository}:{tag}")

    def push_referrer(self, repository: str, manifest: bytes, desc: Mapping[str, Any], subject: str) -> None:
        """PUT a referrer manifest by digest; add it to the fallback tag unless the registry indexes it.

        Raises:
            BackendUnavailableError: See `put_manifest`.
        """
        response = self.put_manifest(repository, str(desc["digest"]), manifest, MANIFEST_MEDIA_TYPE)
        if response.headers.get("OCI-Subject"):
            return
        index = self._fallback_index(repository, subject)
        if any(d.get("digest") == desc["digest"] for d in index["manifests"]):
            return
        index["manifests"].append(dict(desc))
        self.put_manifest(repository, subject.replace(":", "-"), canonical_json(index), INDEX_MEDIA_TYPE)

    def delete_referrer(self, repository: str, referrer: str, subject: str) -> None:
        """Withdraw a referrer of `subject`: drop it from the fallback tag, then DELETE its manifest.

        A registry that refuses the DELETE (deletion disabled, 405) still keeps the manifest by digest, but
        readers of the fallback listing no longer see it; the caller lists again to know.

        Raises:
            BackendUnavailableError: See `put_manifest`; a DELETE answered with a 5xx or refused credentials.
        """
        index = self._fallback_index(repository, subject)
        kept = [d for d in index["manifests"] if d.get("digest") != referrer]
        if len(kept) != len(index["manifests"]):
            index["manifests"] = kept
            self.put_manifest(repository, subject.replace(":", "-"), canonical_json(index), INDEX_MEDIA_TYPE)
        _discard(self.request("DELETE", f"{repository}/manifests/{referrer}"))


class ClientPool:
    """Shared `RegistryClient`s, one per registry and credentials, at most `max_clients` (thread-safe).

    The key is the registry, the whole `RegistryOptions` (CA, TLS mode, username, password, timeout, Docker
    config path) and the credentials they resolve to now (a Docker config file is read again on every
    `get`, so a rotated Secret takes effect at once): a client never sends one registry's or one caller's
    credentials on behalf of another. The least recently used client is dropped when the pool is full; it
    is not closed, since a thread may still be using it (its connections close when it is collected).
    """

    def __init__(self, max_clients: int = 16) -> None:
        """Create an empty pool holding at most `max_clients` clients."""
        self._clients: OrderedDict[tuple[str, RegistryOptions, str | None], RegistryClient] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_clients

    def get(self, registry: str, options: RegistryOptions) -> RegistryClient:
        """The client for `registry` reached with `options`, created on first use.

        Raises:
            BackendUnavailableError: The oci extra (requests) is not installed.
            KeyMaterialError: The Docker config file cannot be read (see `_docker_credentials`).
        """
        key = (registry, options, _credentials(options, registry))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = RegistryClient(registry, options)
                while len(self._clients) > self._max:
                    self._clients.popitem(last=False)
            else:
                self._clients.move_to_end(key)
            return client

    def clear(self) -> None:
        """Drop every client (each closes when collected)."""
        with self._lock:
            self._clients.clear()


_POOL = ClientPool()


def shared_client(registry: str, options: RegistryOptions | None = None) -> RegistryClient:
    """This process's shared client for `registry` and `options` (default: from the environment).

    For long-lived readers (the webhook, the `oci://` store, binding lookups): the client keeps its
    connections and tokens between calls. Do not `close` it. One-shot transfers (`push`, `pull`, `copy`)
    make a client of their own.

    Raises:
        BackendUnavailableError: The oci extra (requests) is not installed.
        KeyMaterialError: The Docker config file cannot be read.
    """
    return _POOL.get(registry, options or RegistryOptions.from_env())


def _parse_index(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise MalformedArtifactError(f"{what}: not JSON") from None
    manifests = doc.get("manifests") if isinstance(doc, dict) else None
    if not isinstance(manifests, list) or not all(
        isinstance(d, dict) and isinstance(d.get("digest"), str) and _DIGEST.fullmatch(d["digest"])
        for d in manifests
    ):
        raise MalformedArtifactError(f"{what}: not an image index of sha256 descriptors")
    return {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}
