"""Image and `oci://` references, normalised once, as a container runtime resolves them (DESIGN.md 20).

Every image a workload names, every `oci://` model reference and every `oci://` pattern of a policy is read
here and only here, and only the normalised form is compared (policy match, which references a policy
covers, the digest an image is bound to). Two spellings that a pull sends to the same registry endpoint
and repository normalise to the same value; so `REGISTRY.INTERNAL:443/models/llm` and
`registry.internal/models/llm` cannot be told apart by a policy, nor can `index.docker.io/acme/llm`,
`registry-1.docker.io/acme/llm`, `docker.io/acme/llm` and `acme/llm`.

Grammar (github.com/distribution/reference `regexp.go`, the parser behind `ParseNormalizedNamed`, which
the kubelet, containerd and Docker use)::

    reference        := name [ ":" tag ] [ "@" digest ]
    name             := [ domain "/" ] remote-name          (at most 255 characters)
    domain           := host [ ":" port-number ]
    host             := domain-name | "[" IPv6 address "]"
    domain-name      := domain-component ( "." domain-component )*
    domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
    remote-name      := path-component ( "/" path-component )*
    path-component   := [a-z0-9]+ ( ( [._] | "__" | "-"+ ) [a-z0-9]+ )*
    tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest           := algorithm ":" hex       (go-digest: sha256, sha384, sha512; lower-case hex of
                                                 64, 96, 128 digits)

Normalisation (`normalize.go`'s `splitDockerDomain`, and the endpoint a pull reaches):

* the first component is a registry only when it holds `.` or `:`, is `localhost`, or holds an upper-case
  letter; otherwise the name is on Docker Hub (`llm` is `docker.io/library/llm`, `acme/llm` is
  `docker.io/acme/llm`);
* the host is lower-cased (DNS names compare case-insensitively, RFC 4343);
* the port is read as a number, and `443` (the HTTPS default, RFC 9110 section 4.2.2) is dropped:
  `registry.internal:443` is `registry.internal`;
* `index.docker.io` (the legacy name) and `registry-1.docker.io` (the API endpoint) are `docker.io`;
  a one-component Docker Hub name gains `library/`;
* the repository is case-sensitive and must be lower case (the grammar): an upper-case repository is
  refused, never folded (the runtime refuses to pull it).

Spellings of a model reference: `oci://REFERENCE`, and `modelsec+oci://REFERENCE`, the URI format of
modelsec's KServe storage initializer (`modelsec.distribution.initializer`; KServe claims `oci://` for its
modelcars, so a `storageUri` routed to modelsec must use its own prefix). Both name the same artifact: they
parse to the same `OciReference`, normalise to the same `oci://REGISTRY/REPOSITORY` for policy matching, and
a rewrite (a tag pinned at admission) keeps the scheme it found (`pinned_uri`), so KServe still routes the
URI to modelsec.

What is not done: no network lookup (a CNAME or a mirror configured in the runtime is not followed), and
`localhost:5000` stays as written (a port other than 443 is another endpoint).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from modelsec.errors import InvalidReferenceError, PolicyError

__all__ = [
    "DOCKER_HUB",
    "DOCKER_HUB_ENDPOINT",
    "INITIALIZER_SCHEME",
    "OCI_SCHEMES",
    "OciReference",
    "normalize_model_uri",
    "normalize_pattern",
    "oci_scheme",
    "parse_image_reference",
    "parse_reference",
    "pinned_uri",
]

DOCKER_HUB = "docker.io"
INITIALIZER_SCHEME = "modelsec+oci://"  # the storage initializer's URI format (see the module docstring)
OCI_SCHEMES = ("oci://", INITIALIZER_SCHEME)
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"  # where `docker.io` is served (the v2 API host)
_DOCKER_HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io", DOCKER_HUB_ENDPOINT})
_HTTPS_PORT = 443
_NAME_MAX = 255  # NameTotalLengthMax

_COMPONENT = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = re.compile(rf"(?:{_COMPONENT}(?:\.{_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::(?P<port>[0-9]+))?\Z")
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*\Z")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}\Z")
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_IDENTIFIER = re.compile(r"[a-f0-9]{64}\Z")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True, slots=True)
class OciReference:
    """A normalised image reference: `REGISTRY/REPOSITORY[:TAG][@DIGEST]` (see the module docstring).

    Attributes:
        registry: Lower-case host with its port unless 443 (`docker.io` for every Docker Hub spelling).
        repository: The path, lower case (`library/<name>` for a one-component Docker Hub name).
        tag: The tag as written, or None.
        digest: `algorithm:hex` as written, or None (`parse_reference` admits sha256 only).
    """

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def ref(self) -> str:
        """What a manifest request names: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def name(self) -> str:
        """`REGISTRY/REPOSITORY` (what a runtime pulls from)."""
        return f"{self.registry}/{self.repository}"

    @property
    def repository_uri(self) -> str:
        """`oci://REGISTRY/REPOSITORY` (what policies match)."""
        return f"oci://{self.name}"

    @property
    def endpoint(self) -> str:
        """The host and port the distribution API is reached at (`registry-1.docker.io` for Docker Hub)."""
        return DOCKER_HUB_ENDPOINT if self.registry == DOCKER_HUB else self.registry

    def __str__(self) -> str:
        return (
            self.repository_uri
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def _registry(host: str, text: str) -> str:
    """A registry host as a pull reaches it: lower case, no `:443`, Docker Hub aliases as `docker.io`."""
    m = _HOST.match(host)
    if m is None:
        raise InvalidReferenceError(text, f"registry {host!r} is not a host name or [IPv6] with a port")
    name = host.lower()
    if m.group("port") is not None:
        port = int(m.group("port"))
        if not 0 < port < 65536:
            raise InvalidReferenceError(text, f"registry port {m.group('port')} is not within 1-65535")
        name = name[: len(name) - len(m.group("port")) - 1]
        if port != _HTTPS_PORT:
            name = f"{name}:{port}"
    return DOCKER_HUB if name in _DOCKER_HUB_ALIASES else name


def _is_registry(first: str) -> bool:
    """Whether a name's first component names a registry (`splitDockerDomain`)."""
    return "." in first or ":" in first or first == "localhost" or first.lower() != first


# A pure function of the text returning a frozen value, called several times per admission decision for the
# same few images: the answers are kept (bounded; a refusal raises and is not kept).
@functools.lru_cache(maxsize=4096)
def parse_image_reference(text: str) -> OciReference:
    """Parse and normalise an image reference as the container runtime does (see the module docstring).

    Args:
        text: `[REGISTRY[:PORT]/]REPOSITORY[:TAG][@DIGEST]`, as in a pod's `image` or an image volume.

    Returns:
        The normalised reference; its digest is any go-digest algorithm (sha256, sha384, sha512).

    Raises:
        InvalidReferenceError: Not a reference under the grammar: empty, whitespace, an upper-case or
            malformed repository, a bad host, port, tag or digest, a name over 255 characters, or a bare
            64-hex name (`reason` says which).
    """
    if not text:
        raise InvalidReferenceError(text, "empty")
    name, at, digest = text.partition("@")
    if at:
        m = _DIGEST.match(digest)
        algorithm = digest.split(":", 1)[0]
        hex_part = digest.split(":", 1)[-1]
        if m is None or _DIGEST_HEX.get(algorithm) != len(hex_part) or hex_part.lower() != hex_part:
            raise InvalidReferenceError(
                text, f"digest {digest!r} is not sha256, sha384 or sha512 with lower-case hex of its length"
            )
    slash = name.rfind("/")
    tag: str | None = None
    if ":" in name[slash + 1 :]:  # a colon after the last slash is a tag, before it a port
        name, _, tag = name.rpartition(":")
        if not _TAG.match(tag):
            raise InvalidReferenceError(text, f"tag {tag!r} is not [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
    if len(name) > _NAME_MAX:
        raise InvalidReferenceError(text, f"name is longer than {_NAME_MAX} characters")
    if _IDENTIFIER.match(name):
        raise InvalidReferenceError(text, "a 64-hex name is an image ID, not a repository")
    first, sep, rest = name.partition("/")
    if sep and _is_registry(first):
        registry, path = _registry(first, text), rest
    else:
        registry, path = DOCKER_HUB, name
    if not _PATH.match(path):
        problem = "is not lower case" if _PATH.match(path.lower()) else "is not a valid repository path"
        raise InvalidReferenceError(
            text, f"repository {path!r} {problem} (components [a-z0-9] joined by '.', '_', '__' or '-')"
        )
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return OciReference(registry, path, tag, digest if at else None)


def oci_scheme(uri: str) -> str | None:
    """The scheme of an OCI model reference (`oci://` or `modelsec+oci://`, see `OCI_SCHEMES`), or None.

    Only the prefix is looked at: whether the rest is a reference is `parse_reference`'s to say.
    """
    if uri.startswith(OCI_SCHEMES):
        for scheme in OCI_SCHEMES:
            if uri.startswith(scheme):
                return scheme
    return None


def parse_reference(uri: str) -> OciReference:
    """Parse and normalise an `oci://` reference (the scheme may be omitted); only sha256 digests.

    Args:
        uri: `oci://[REGISTRY/]REPOSITORY[:TAG][@sha256:HEX]` or the same after `modelsec+oci://` (a name
            without a registry is on Docker Hub, as a runtime reads it).

    Raises:
        InvalidReferenceError: See `parse_image_reference`, or a digest other than sha256.
    """
    scheme = oci_scheme(uri)
    target = uri[len(scheme) :] if scheme else uri
    ref = parse_image_reference(target)
    if ref.digest is not None and not ref.digest.startswith("sha256:"):
        raise InvalidReferenceError(uri, f"digest {ref.digest!r} is not sha256:<64 hex>")
    return ref


@functools.lru_cache(maxsize=1024)
def normalize_model_uri(uri: str) -> str:
    """The form a model URI is compared in: an OCI one as `OciReference.repository_uri`, others unchanged.

    `oci://` and `modelsec+oci://` URIs both become `oci://REGISTRY/REPOSITORY`; the tag is dropped
    (policies match the repository; a tag pins nothing). A pure function of `uri`, so its answers are kept
    (the last 1,024): one admission decision normalises each reference several times (its sources, the
    policies it matches), and the webhook sees the same references again and again. A refusal is not kept.

    Raises:
        InvalidReferenceError: An OCI URI that is not a reference (see `parse_reference`).
    """
    return parse_reference(uri).repository_uri if oci_scheme(uri) else uri


def pinned_uri(uri: str, digest: str) -> str:
    """An OCI model URI pinned to a manifest digest, in the scheme it was written with.

    Args:
        uri: `oci://…` or `modelsec+oci://…`, with a tag or none.
        digest: `sha256:<64 hex>`.

    Returns:
        `SCHEME REGISTRY/REPOSITORY@sha256:<64 hex>`, the name normalised, the tag dropped.

    Raises:
        InvalidReferenceError: `uri` is not an OCI reference, or `digest` is not sha256.
    """
    scheme = oci_scheme(uri)
    if scheme is None:
        raise InvalidReferenceError(uri, f"not an OCI reference (want one of {', '.join(OCI_SCHEMES)})")
    ref = parse_reference(uri)
    pinned = parse_reference(f"{ref.name}@{digest}")
    return f"{scheme}{pinned.name}@{pinned.digest}"


def normalize_pattern(pattern: str) -> str:
    """A policy's `match` glob in the normalised form of the references it is compared with.

    A `modelsec+oci://` pattern is an `oci://` one (references of both spellings normalise to `oci://`).
    For an `oci://` pattern whose registry part holds no glob character, the registry is normalised as a
    reference's is (case, `:443`, Docker Hub aliases, a first component that is no registry meaning Docker
    Hub) and a one-component Docker Hub path gains `library/` (`oci://docker.io/llm*` covers
    `docker.io/library/llm`); a glob registry is only lower-cased. Other patterns are unchanged.

    Raises:
        PolicyError: The pattern's repository part holds an upper-case letter (a repository is lower case:
            the pattern could never match), or its registry is not a host.
    """
    scheme = oci_scheme(pattern)
    if scheme is None:
        return pattern
    body = pattern[len(scheme) :]
    first, sep, rest = body.partition("/")
    if any(c.isupper() for c in rest if c.isalpha()):
        raise PolicyError(f"match pattern {pattern!r}: a repository path is lower case; it can never match")
    if _GLOB.search(first):
        return f"oci://{first.lower()}{sep}{rest}"
    if sep and _is_registry(first):
        try:
            registry, path = _registry(first, pattern), rest
        except InvalidReferenceError as e:
            raise PolicyError(f"match pattern {pattern!r}: {e.reason}") from None
    else:
        registry, path = DOCKER_HUB, body
    if registry == DOCKER_HUB and path and "/" not in path and "**" not in path:
        path = f"library/{path}"
    return f"oci://{registry}/{path}"
