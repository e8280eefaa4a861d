"""Where a workload names its models: annotations, KServe storage fields, container images, image volumes.

Pure reading of a Kubernetes object, no policy and no verification (`modelsec.webhook.review` decides).
Two kinds of source are returned:

* model references (`PendingReference`, `<uri>[@sha256:<digest>]`): the annotation `modelsec.dev/models` on a
  Pod, on a workload and on its pod template, on a KServe InferenceService or TrainedModel and on each
  InferenceService component (`predictor`, `explainer`, `transformer`, and the predictor of every
  `canary[]` entry), and every KServe storage field, as the `kserve` SDK's models name them (the list is
  checked against kserve 0.21.0's in tests/unit/webhook/test_kserve_sources.py): `storageUri`,
  `<framework>.storageUri` (including `model.storageUri`), each `storageUris[].uri` (KServe 0.15+, on a
  component and on its framework spec), `storage` and `<framework>.storage` (a `StorageSpec` names no URI,
  only a storage key and a path: it is the reference `kserve-storage://<key or default>/<path>`, which pins
  no digest), a TrainedModel's `spec.model.storageUri`, and a container's `STORAGE_URI` environment variable
  (a `valueFrom` there is refused: its value cannot be read here). A component's `logger` is where request
  logs are written, not a model: it is not read;
* OCI images (`ImageSource`): every container, init container and ephemeral container image and every image
  volume (`spec.volumes[].image.reference`, Kubernetes 1.31+) of the pod spec (for KServe: of each
  component, its framework specs and its `workerSpec`). Whether an image is a model is decided by the
  policies, not here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelsec.errors import InvalidReferenceError, MalformedArtifactError
from modelsec.registry.reference import parse_image_reference
from modelsec.verifier.pinning import MODELS_ANNOTATION, split_models_annotation
from modelsec.webhook.decision import InvalidReviewError

__all__ = [
    "KSERVE",
    "KSERVE_TRAINED_MODEL",
    "WORKLOAD_KINDS",
    "ContainerSite",
    "ImageSource",
    "Locations",
    "PendingReference",
    "Site",
    "collect",
    "covered",
    "locate",
    "parse_image",
]

JsonPath = tuple[str | int, ...]  # JSON pointer tokens (RFC 6901) from the object's root

WORKLOAD_KINDS = {
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}
KSERVE = ("serving.kserve.io", "InferenceService")
KSERVE_TRAINED_MODEL = ("serving.kserve.io", "TrainedModel")
_KSERVE_COMPONENTS = ("predictor", "explainer", "transformer")
# Mappings in a component that are not a framework or model spec: `logger` names where request logs are
# written (its `storage` is an output, not a model), `workerSpec` is a pod spec read as one.
_KSERVE_NOT_MODEL_SPECS = frozenset({"logger", "workerSpec"})
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_EPHEMERAL = "ephemeralContainers"
_KSERVE_CONTAINER = "kserve-container"
_STORAGE_ENV = "STORAGE_URI"


@dataclass(frozen=True, slots=True)
class PendingReference:
    """A model reference as written (`raw`) and where it was found (`where`); parsed later."""

    raw: str
    where: str


@dataclass(frozen=True, slots=True)
class ImageSource:
    """An OCI image a workload pulls, normalised the way the kubelet resolves it.

    Attributes:
        image: The reference as written.
        repository: `REGISTRY/REPOSITORY` normalised (`modelsec.registry.reference`: Docker Hub spellings
            as `docker.io`, `library/` for a one-component Docker Hub name, the host in lower case, no
            `:443`); empty when the reference is invalid.
        digest: The pinned sha256 manifest digest (64 hex), or None for a tag-only reference.
        malformed: Invalid under the reference grammar, or pinned by a digest other than sha256.
        where: The field it came from (e.g. `spec.volumes[weights].image.reference`).
        invalid: Why the reference is invalid under the grammar (None when it parses): nothing can be said
            about which repository it names.
    """

    image: str
    repository: str
    digest: str | None
    malformed: bool
    where: str
    invalid: str | None = None

    @property
    def uri(self) -> str:
        """The model URI policies match it as: `oci://<repository>`."""
        return "oci://" + self.repository


@dataclass(frozen=True, slots=True)
class Site:
    """One place in the object where a model source is written, for a mutation to rewrite (`locate`).

    Attributes:
        path: The JSON pointer tokens of the string (RFC 6901; `pointer` renders them).
        value: The string found there.
        kind: `annotation` (a `modelsec.dev/models` list of references), `uri` (one model reference: a
            KServe storage field or `STORAGE_URI`) or `image` (a container image or an image volume).
        where: The field, as `collect` names it in diagnostics.
    """

    path: JsonPath
    value: str
    kind: str
    where: str


@dataclass(frozen=True, slots=True)
class ContainerSite:
    """A container that may serve a model: one of a pod spec's containers and init containers.

    Attributes:
        path: The JSON pointer tokens of the container object.
        name: Its `name` (KServe's default `kserve-container` for a framework spec without one).
        env: Its `env` list as written (None when the field is absent).
        where: The field, for diagnostics.
    """

    path: JsonPath
    name: str
    env: list[Any] | None
    where: str


@dataclass(frozen=True, slots=True)
class Locations:
    """Every rewritable model source of an object and the containers that may serve its models."""

    sites: tuple[Site, ...]
    containers: tuple[ContainerSite, ...]


def parse_image(image: str, where: str) -> ImageSource:
    """Read an image reference `[registry[:port]/]path[:tag][@digest]` (never raises).

    Parsed and normalised by `modelsec.registry.reference.parse_image_reference`, the one reader of
    image references: `llama` is `docker.io/library/llama`, `INDEX.DOCKER.IO:443/org/llama` is
    `docker.io/org/llama`. Without this, a policy naming `oci://docker.io/org/**` could be bypassed by
    another spelling of the same repository.
    """
    try:
        ref = parse_image_reference(image)
    except InvalidReferenceError as e:
        return ImageSource(image, "", None, True, where, e.reason)
    digest = ref.digest.removeprefix("sha256:") if ref.digest and ref.digest.startswith("sha256:") else None
    return ImageSource(image, ref.name, digest, ref.digest is not None and digest is None, where)


def _get(doc: object, path: Sequence[str], where: str) -> object:
    value = doc
    for part in path:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise InvalidReviewError(f"{where}: {'.'.join(path)} is not an object")
        value = value.get(part)
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidReviewError(f"{where} is not an object")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidReviewError(f"{where} is not a list")
    return value


class _Collector:
    def __init__(self) -> None:
        self.refs: list[PendingReference] = []
        self.images: list[ImageSource] = []
        self.sites: list[Site] = []
        self.containers: list[ContainerSite] = []
        self._seen: set[str] = set()

    def add(self, raw: str, where: str) -> None:
        if raw not in self._seen:
            self._seen.add(raw)
            self.refs.append(PendingReference(raw, where))

    def annotations(self, value: object, where: str, path: JsonPath) -> None:
        annotations = _mapping(value, where)
        text = annotations.get(MODELS_ANNOTATION) if annotations is not None else None
        if text is None:
            return
        if not isinstance(text, str):
            raise InvalidReviewError(f"{where}[{MODELS_ANNOTATION}] is not a string")
        try:
            raws = split_models_annotation(text)
        except MalformedArtifactError:
            raise InvalidReviewError(f"{where}[{MODELS_ANNOTATION}] has an empty entry") from None
        self.sites.append(Site((*path, MODELS_ANNOTATION), text, "annotation", where))
        for raw in raws:
            self.add(raw, where)

    def uri(self, value: object, where: str, path: JsonPath) -> None:
        if value is None:
            return
        if not isinstance(value, str) or not value.strip():
            raise InvalidReviewError(f"{where} is not a non-empty string")
        self.sites.append(Site(path, value, "uri", where))
        self.add(value.strip(), where)

    def image(self, value: str, where: str, path: JsonPath) -> None:
        self.sites.append(Site(path, value, "image", where))
        self.images.append(parse_image(value, where))

    def storage_spec(self, value: object, where: str) -> None:
        spec = _mapping(value, where)
        if spec is None:
            return
        key, path = spec.get("key", "default"), spec.get("path", "")
        if not isinstance(key, str) or not isinstance(path, str):
            raise InvalidReviewError(f"{where}.key and .path must be strings")
        self.add(f"kserve-storage://{key or 'default'}/{path.lstrip('/')}", where)

    def container(
        self, value: object, where: str, path: JsonPath, serving: bool, default_name: str = ""
    ) -> None:
        container = _mapping(value, where)
        if container is None:
            return
        image = container.get("image")
        if image is not None:
            if not isinstance(image, str):
                raise InvalidReviewError(f"{where}.image is not a string")
            self.image(image, f"{where}.image", (*path, "image"))
        env_list = _list(container.get("env"), f"{where}.env")
        for i, env in enumerate(env_list):
            if isinstance(env, Mapping) and env.get("name") == _STORAGE_ENV:
                if env.get("valueFrom") is not None:
                    raise InvalidReviewError(
                        f"{where}.env[{_STORAGE_ENV}] comes from valueFrom: a model source must be "
                        "written in the object to be verified"
                    )
                self.uri(env.get("value"), f"{where}.env[{i}]({_STORAGE_ENV})", (*path, "env", i, "value"))
        if serving:
            name = container.get("name", default_name)
            if not isinstance(name, str):
                raise InvalidReviewError(f"{where}.name is not a string")
            env = env_list if container.get("env") is not None else None
            self.containers.append(ContainerSite(path, name, env, where))

    def pod_spec(self, value: object, where: str, path: JsonPath, serving: bool = True) -> None:
        spec = _mapping(value, where)
        if spec is None:
            return
        for field in _CONTAINER_LISTS:
            for i, container in enumerate(_list(spec.get(field), f"{where}.{field}")):
                # Ephemeral containers debug a running Pod; they are added through their own subresource.
                self.container(
                    container, f"{where}.{field}[{i}]", (*path, field, i), serving and field != _EPHEMERAL
                )
        for i, volume in enumerate(_list(spec.get("volumes"), f"{where}.volumes")):
            image = _mapping(volume, f"{where}.volumes[{i}]") or {}
            source = _mapping(image.get("image"), f"{where}.volumes[{i}].image")
            if source is None:
                continue
            ref = source.get("reference")
            vwhere = f"{where}.volumes[{i}].image.reference"
            if not isinstance(ref, str) or not ref:
                # An image volume without a reference is refused by the API server; fail closed anyway.
                raise InvalidReviewError(f"{vwhere} is not a non-empty string")
            self.image(ref, vwhere, (*path, "volumes", i, "image", "reference"))

    def model_source(self, spec: Mapping[str, Any], where: str, path: JsonPath) -> None:
        """The KServe storage fields of a component or of a framework/model spec."""
        self.uri(spec.get("storageUri"), f"{where}.storageUri", (*path, "storageUri"))
        self.storage_spec(spec.get("storage"), f"{where}.storage")
        for i, item in enumerate(_list(spec.get("storageUris"), f"{where}.storageUris")):
            entry = _mapping(item, f"{where}.storageUris[{i}]")
            if entry is None or entry.get("uri") is None:
                # The CRD requires `uri`; an entry without one must not pass as "no reference".
                raise InvalidReviewError(f"{where}.storageUris[{i}].uri is missing")
            self.uri(entry.get("uri"), f"{where}.storageUris[{i}].uri", (*path, "storageUris", i, "uri"))

    def kserve_component(self, value: object, where: str, path: JsonPath, serving: bool) -> None:
        """One InferenceService component; `serving`: its containers serve the model (the predictor)."""
        component = _mapping(value, where)
        if component is None:
            return
        self.annotations(component.get("annotations"), f"{where}.annotations", (*path, "annotations"))
        self.model_source(component, where, path)
        self.pod_spec(component, where, path, serving)
        self.pod_spec(component.get("workerSpec"), f"{where}.workerSpec", (*path, "workerSpec"), serving)
        for key, sub in sorted(component.items()):
            # Framework and model specs (`sklearn`, `huggingface`, `model`, ...) embed a container.
            if (
                key not in _CONTAINER_LISTS
                and key not in _KSERVE_NOT_MODEL_SPECS
                and isinstance(sub, Mapping)
                and _is_container_like(sub)
            ):
                self.model_source(sub, f"{where}.{key}", (*path, key))
                # KServe names the container of a framework spec `kserve-container`.
                self.container(sub, f"{where}.{key}", (*path, key), serving, _KSERVE_CONTAINER)


def _is_container_like(value: Mapping[str, Any]) -> bool:
    return any(
        k in value for k in ("storageUri", "storageUris", "storage", "image", "env", "modelFormat", "runtime")
    )


def covered(group: str, kind: str) -> bool:
    """Whether objects of this API group and kind are read by `collect` (and reviewed by the webhooks)."""
    key = (group, kind)
    return key == ("", "Pod") or key in WORKLOAD_KINDS or key in (KSERVE, KSERVE_TRAINED_MODEL)


def _walk(group: str, kind: str, obj: Mapping[str, Any]) -> _Collector:
    c = _Collector()
    meta = ("metadata", "annotations")
    if (group, kind) == ("", "Pod"):
        c.annotations(_get(obj, meta, kind), "metadata.annotations", meta)
        c.pod_spec(obj.get("spec"), "spec", ("spec",))
    elif (group, kind) in WORKLOAD_KINDS:
        template = WORKLOAD_KINDS[(group, kind)]
        c.annotations(_get(obj, meta, kind), "metadata.annotations", meta)
        where = ".".join(template)
        c.annotations(
            _get(obj, (*template, *meta), kind), f"{where}.metadata.annotations", (*template, *meta)
        )
        c.pod_spec(_get(obj, (*template, "spec"), kind), f"{where}.spec", (*template, "spec"))
    elif (group, kind) == KSERVE:
        c.annotations(_get(obj, meta, kind), "metadata.annotations", meta)
        for component in _KSERVE_COMPONENTS:
            c.kserve_component(
                _get(obj, ("spec", component), kind),
                f"spec.{component}",
                ("spec", component),
                component == "predictor",
            )
        for i, canary in enumerate(_list(_get(obj, ("spec", "canary"), kind), "spec.canary")):
            entry = _mapping(canary, f"spec.canary[{i}]") or {}
            path = ("spec", "canary", i, "predictor")
            c.kserve_component(entry.get("predictor"), f"spec.canary[{i}].predictor", path, True)
    elif (group, kind) == KSERVE_TRAINED_MODEL:
        c.annotations(_get(obj, meta, kind), "metadata.annotations", meta)
        model = _mapping(_get(obj, ("spec", "model"), kind), "spec.model")
        if model is not None:
            c.model_source(model, "spec.model", ("spec", "model"))
    else:
        raise InvalidReviewError(f"kind {group or 'core'}/{kind} is not covered by modelsec")
    return c


def collect(
    group: str, kind: str, obj: Mapping[str, Any]
) -> tuple[list[PendingReference], list[ImageSource]]:
    """The model references and OCI images an object names (see the module docstring).

    Args:
        group: The object's API group (`""` for core).
        kind: Its kind.
        obj: The object (`request.object`).

    Returns:
        The references (deduplicated, in order found) and the images.

    Raises:
        InvalidReviewError: The kind is not covered, or a field holding a source has the wrong type.
    """
    c = _walk(group, kind, obj)
    return c.refs, c.images


def locate(group: str, kind: str, obj: Mapping[str, Any]) -> Locations:
    """Where an object writes its model sources, and the containers that may serve them (for a mutation).

    Every occurrence is returned (`collect` deduplicates references; a rewrite must reach each copy): the
    `modelsec.dev/models` annotations, the KServe storage fields that hold a URI (`storageUri`,
    `storageUris[].uri`, `STORAGE_URI`; a `storage` spec names no URI), every container, init container and
    ephemeral container image and every image volume. The containers are the containers and init
    containers of every pod spec (a Pod's, a workload's template, and for an InferenceService those of its
    predictor, canary predictors, their framework specs and `workerSpec`); ephemeral containers, and the
    transformer and explainer of an InferenceService, serve no model and are not listed.

    Raises:
        InvalidReviewError: As `collect`.
    """
    c = _walk(group, kind, obj)
    return Locations(tuple(c.sites), tuple(c.containers))
