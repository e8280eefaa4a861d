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
challenges are answered; nothing is retried after a network error (the caller's deadline holds).

Why not oras-py: its request wrapper retries any connection error with sleeps of up to 83 s (a webhook
must fail closed within its deadline), sets no timeouts, re-serialises manifests it uploads (the digest
is then not the caller's), does not compare pulled blobs with their digests, and lists no referrers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from modelsec.errors import (
    BackendUnavailableError,
    DigestMismatchError,
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
    "OciReference",
    "RegistryClient",
    "RegistryOptions",
    "descriptor",
    "parse_reference",
    "root_tag",
]

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

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


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
    """

    ca_file: Path | None = None
    plain_http: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = 10.0
    docker_config: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RegistryOptions:
        """Options from the environment (`overrides` that are not None win).

        Variables: `$MODELSEC_OCI_USERNAME`, `_PASSWORD`, `_CA`, `_PLAIN_HTTP` (`1`), `_TIMEOUT` (seconds),
        `$DOCKER_CONFIG` (a directory holding `config.json`).

        Raises:
            MalformedArtifactError: `$MODELSEC_OCI_TIMEOUT` is not a number.
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


class RegistryClient:
    """One registry, reached over the distribution API (see the module docstring)."""

    def __init__(self, registry: str, options: RegistryOptions | None = None) -> None:
        try:
            import requests
        except ModuleNotFoundError as e:
            raise BackendUnavailableError(
                "OCI registries need the oci extra: pip install 'modelsec[oci]'"
            ) from e
        self.registry = registry
        self.options = options or RegistryOptions()
        self._requests = requests
        self._session = requests.Session()
        self._session.trust_env = False  # no proxies or netrc credentials from the environment
        self._verify: bool | str = str(self.options.ca_file) if self.options.ca_file else True
        # Docker Hub is named `docker.io` (what references normalise to) and served at its API host.
        endpoint = DOCKER_HUB_ENDPOINT if registry == DOCKER_HUB else registry
        self._base = ("http" if self.options.plain_http else "https") + f"://{endpoint}/v2/"
        if self.options.username:
            raw = f"{self.options.username}:{self.options.password or ''}".encode()
            self._basic: str | None = base64.b64encode(raw).decode()
        else:
            self._basic = _docker_credentials(self.options.docker_config, registry)
        self._auth: str | None = None

    def close(self) -> None:
        """Close the HTTP session."""
        self._session.close()

    # -- transport ---------------------------------------------------------------------------------------

    def _send(self, method: str, url: str, headers: dict[str, str], data: Any, stream: bool) -> Any:
        if self._auth:
            headers = {**headers, "Authorization": self._auth}
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
            raise RegistryUnreachableError(self.registry, self._problem(e), f"{method} {url}: {e}") from e

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
    ) -> Any:
        """One request under `/v2/` (or an absolute upload URL), answering one authentication challenge.

        Raises:
            BackendUnavailableError: Unreachable, TLS failure, a 5xx answer, or credentials refused.
        """
        url = path if path.startswith(("http://", "https://")) else self._base + path
        headers = dict(headers or {})
        sent = self._auth
        response = self._send(method, url, headers, data, stream)
        # Another thread may have answered the challenge meanwhile: then retry with its credentials.
        if response.status_code == 401 and (self._auth != sent or self._answer(response)):
            if hasattr(data, "seek"):
                data.seek(0)
            response = self._send(method, url, headers, data, stream)
        if (
            self.options.plain_http
            and response.status_code == 400
            and b"HTTPS server" in response.content[:200]
        ):
            # Go's net/http (the CNCF registry, Harbor, Zot) answers plain HTTP on a TLS port with this 400.
            raise RegistryUnreachableError(self.registry, "tls-server", f"{method} {url}: HTTP 400")
        if response.status_code in (401, 403):
            raise BackendUnavailableError(f"registry {self.registry}: {method} {path}: access denied")
        if response.status_code >= 500:
            raise BackendUnavailableError(
                f"registry {self.registry}: {method} {path}: HTTP {response.status_code}"
            )
        return response

    def _answer(self, response: Any) -> bool:
        """Set `_auth` from a 401 challenge; False when there is nothing new to send."""
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic":
            if not self._basic or self._auth == f"Basic {self._basic}":
                return False
            self._auth = f"Basic {self._basic}"
            return True
        if scheme != "bearer":
            return False
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            return False
        headers = {"Authorization": f"Basic {self._basic}"} if self._basic else {}
        try:
            got = self._session.get(
                realm, params=params, headers=headers, verify=self._verify, timeout=self.options.timeout
            )
            body = got.json() if got.status_code == 200 else {}
        except (self._requests.RequestException, ValueError) as e:
            raise BackendUnavailableError(f"registry {self.registry}: token request failed") from e
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token or self._auth == f"Bearer {token}":
            return False
        self._auth = f"Bearer {token}"
        return True

    @staticmethod
    def _read(response: Any, max_bytes: int, what: str) -> bytes:
        out = bytearray()
        for chunk in response.iter_content(_CHUNK):
            out += chunk
            if len(out) > max_bytes:
                response.close()
                raise MalformedArtifactError(f"{what}: larger than {max_bytes} bytes")
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
        response = self.request(
            "GET",
            f"{repository}/manifests/{ref}",
            headers={"Accept": f"{MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}"},
            stream=True,
        )
        if response.status_code == 404:
            raise NotFoundError(f"{what}: no such manifest")
        if response.status_code != 200:
            raise BackendUnavailableError(f"{what}: HTTP {response.status_code}")
        data = self._read(response, _MAX_MANIFEST_BYTES, what)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if ref.startswith("sha256:") and not hmac.compare_digest(digest, ref):
            raise DigestMismatchError(what, ref, digest)
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        return data, media_type, digest

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
        """Whether the repository holds the blob (HEAD)."""
        return bool(self.request("HEAD", f"{repository}/blobs/{digest}").status_code == 200)

    def put_blob(self, repository: str, digest: str, size: int, data: bytes | IO[bytes]) -> None:
        """Upload a blob (monolithic POST + PUT) unless the repository already holds it.

        Raises:
            BackendUnavailableError: The registry refused it (e.g. its digest differs) or is unreachable.
        """
        if self.blob_exists(repository, digest):
            return
        start = self.request("POST", f"{repository}/blobs/uploads/")
        location = start.headers.get("Location", "")
        if start.status_code != 202 or not location:
            raise BackendUnavailableError(
                f"oci://{self.registry}/{repository}: upload refused: HTTP {start.status_code}"
            )
        if location.startswith("/"):
            location = self._base[: -len("/v2/")] + location
        sep = "&" if "?" in location else "?"
        done = self.request(
            "PUT",
            f"{location}{sep}digest={digest}",
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            data=data,
        )
        if done.status_code != 201:
            raise BackendUnavailableError(
                f"oci://{self.registry}/{repository}: blob {digest} refused: HTTP {done.status_code}"
            )

    def _blob_response(self, repository: str, digest: str) -> Any:
        if not _DIGEST.fullmatch(digest):
            raise MalformedArtifactError(f"{digest!r} is not a sha256 digest")
        response = self.request("GET", f"{repository}/blobs/{digest}", stream=True)
        if response.status_code == 404:
            raise NotFoundError(f"oci://{self.registry}/{repository}: no blob {digest}")
        if response.status_code != 200:
            raise BackendUnavailableError(
                f"oci://{self.registry}/{repository}: blob {digest}: HTTP {response.status_code}"
            )
        return response

    def stream_blob(self, repository: str, digest: str, size: int, sink: IO[bytes], *, what: str) -> None:
        """Write a blob to `sink`, refusing it unless it is exactly `size` bytes hashing to `digest`.

        Raises:
            DigestMismatchError: The bytes hash otherwise.
            MalformedArtifactError: More or fewer than `size` bytes.
            NotFoundError, BackendUnavailableError: As for `get_manifest`.
        """
        response = self._blob_response(repository, digest)
        h, n = hashlib.sha256(), 0
        for chunk in response.iter_content(_CHUNK):
            n += len(chunk)
            if n > size:
                response.close()
                raise MalformedArtifactError(
                    f"{what}: blob {digest} is larger than its descriptor's {size} bytes"
                )
            h.update(chunk)
            sink.write(chunk)
        if n != size:
            raise MalformedArtifactError(f"{what}: blob {digest} has {n} bytes, its descriptor {size}")
        actual = "sha256:" + h.hexdigest()
        if not hmac.compare_digest(actual, digest):
            raise DigestMismatchError(what, digest, actual)

    def get_blob(self, repository: str, digest: str, max_bytes: int, *, what: str) -> bytes:
        """A small blob (a bundle, a config) whose bytes must hash to `digest` (same errors)."""
        response = self._blob_response(repository, digest)
        data = self._read(response, max_bytes, what)
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if not hmac.compare_digest(actual, digest):
            raise DigestMismatchError(what, digest, actual)
        return data

    # -- referrers ---------------------------------------------------------------------------------------

    def referrers(
        self, repository: str, digest: str, artifact_type: str | None = None
    ) -> list[dict[str, Any]]:
        """The descriptors of manifests whose `subject` is `digest` (API, else the fallback tag).

        Descriptors are returned as the registry lists them (untrusted: fetch each by digest).

        Raises:
            MalformedArtifactError: The listing is not an image index of descriptors.
            BackendUnavailableError: See `request`.
        """
        what = f"oci://{self.registry}/{repository}: referrers of {digest}"
        response = self.request(
            "GET", f"{repository}/referrers/{digest}", headers={"Accept": INDEX_MEDIA_TYPE}, stream=True
        )
        if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(
            INDEX_MEDIA_TYPE
        ):
            index = _parse_index(self._read(response, _MAX_MANIFEST_BYTES, what), what)
        elif response.status_code in (200, 400, 404, 405):
            response.close()
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
        self.request("DELETE", f"{repository}/manifests/{referrer}").close()


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
