"""The mutating admission webhook: tags resolved to digests and pinned, the digest handed to the guard.

DESIGN.md decision 17 ("one digest from CI to device memory"). Served at `POST /mutate` beside `/validate`
(`modelsec.webhook.server`); its MutatingWebhookConfiguration runs before the validating one, which then
reviews the patched object. Pure logic, no HTTP. Order, failing closed at every step (any failure is a deny
naming the field and the reason, and no patch):

1. the review is read as the validating webhook reads it (`Reviewer.parse`, `Reviewer.check_review`):
   `admission.k8s.io/v1`, CREATE or UPDATE of a covered kind with an object; a subresource request
   (`pods/ephemeralcontainers`) is answered without a patch (no model is pinned through it);
2. every place the object writes a model source is located (`modelsec.webhook.sources.locate`): the
   `modelsec.dev/models` annotations, the KServe storage fields that hold a URI, container, init
   container and ephemeral container images and image volumes (`volumes[].image.reference`);
3. a source is *covered* when a policy that applies in the namespace matches it (normalised as the
   validating webhook normalises it: `modelsec.registry.reference`). Only covered `oci://` (and
   `modelsec+oci://`) references and images are resolved; a reference that is malformed, not covered, or
   not in a registry (`file://`, `kserve-storage://`, ...) is left as written for the validating webhook
   to judge;
4. a covered reference that names a tag (or no tag and no digest: `latest`, as the runtime pulls it) is
   resolved to the sha256 digest of the manifest the registry serves for it now (a GET whose bytes are
   hashed: the registry's `Docker-Content-Digest` header is never believed), once per distinct tag in the
   review, so every field naming the same tag gets the same digest. It is rewritten as
   `REGISTRY/REPOSITORY@sha256:<hex>` (`oci://…@sha256:<hex>` in a model reference, `modelsec+oci://…`
   kept as `modelsec+oci://…@sha256:<hex>` so that KServe still routes it to modelsec's initializer). A
   tag the registry does not hold, a registry that cannot be read, or the deadline is a deny (fail closed);
5. the pin: for each covered reference that now names a digest, the model root digests that a binding
   signed by a matching policy's key attaches to that OCI manifest (`bindings`, as the validating webhook
   reads them); a digest that names no manifest, or that no trusted binding names, is pinned as it is
   (it is then a model root digest, or the validating webhook refuses it). The value is
   `<uri>@sha256:<root>[,…]`, sorted, as `modelsec.verifier.pinning.parse_digest_pins` reads it; a registry
   outage while reading bindings is a deny;
6. `MODELSEC_MODEL_DIGEST` (the pin) and `MODELSEC_POLICY` (the `guardPolicy` of the matching policies;
   several different ones are a deny) are injected into every container and init container of each pod
   spec (a Pod's, a workload's template, an InferenceService's predictor, canary predictors, their
   framework specs and `workerSpec`), or only into the containers that the annotation
   `modelsec.dev/serving-containers` (comma-separated container names, on the pod template or else the
   object) names; a name there that no container has is a deny. A variable already set to the same value
   is left alone; set to another value, or from `valueFrom`, it is a deny, never an overwrite. On an
   UPDATE of a Pod (whose env is immutable) nothing is added, but a conflicting value still denies;
7. the answer carries an RFC 6902 JSON patch (`patchType: JSONPatch`, base64) when anything changes.
   A second review of the patched object yields no patch (`reinvocationPolicy: IfNeeded` is idempotent).

What is not done here: no signature or attestation is verified (the validating webhook does, on the
patched object), nothing is cached (a tag must be resolved when the object is admitted). Modes apply as in
the validating webhook: `warn` and `audit` allow a refused mutation without a patch (`warn` says why).
"""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelsec.errors import (
    BackendUnavailableError,
    Error,
    MalformedArtifactError,
    NotFoundError,
)
from modelsec.policy import POLICY_ENV, Policy, PolicySet
from modelsec.registry.client import RegistryClient, RegistryOptions
from modelsec.registry.reference import (
    OciReference,
    normalize_model_uri,
    oci_scheme,
    parse_image_reference,
    parse_reference,
    pinned_uri,
)
from modelsec.verifier.pinning import MODEL_DIGEST_ENV, split_models_annotation, split_reference
from modelsec.webhook.decision import (
    AdmissionRequest,
    DeadlineExceededError,
    Decision,
    InvalidReviewError,
)
from modelsec.webhook.review import Reviewer, admission_review
from modelsec.webhook.sources import (
    WORKLOAD_KINDS,
    ContainerSite,
    JsonPath,
    Site,
    locate,
    parse_image,
)

__all__ = [
    "SERVING_CONTAINERS_ANNOTATION",
    "Mutation",
    "Mutator",
    "Resolver",
    "pointer",
    "registry_resolver",
]

SERVING_CONTAINERS_ANNOTATION = "modelsec.dev/serving-containers"

Resolver = Callable[[OciReference], str]
"""Resolves a tag reference to the `sha256:<hex>` digest of the manifest the registry serves for it.

Raises `NotFoundError` (no such tag) or `BackendUnavailableError` (the registry cannot be read)."""


def registry_resolver(options: RegistryOptions | None = None) -> Resolver:
    """A `Resolver` that asks the reference's own registry (`RegistryClient.get_manifest`).

    The manifest is fetched by tag and its bytes hashed; the digest returned is that hash, never a header.

    Args:
        options: TLS, credentials and timeout (default: `RegistryOptions.from_env()` at each call).
    """

    def resolve(ref: OciReference) -> str:
        client = RegistryClient(ref.registry, options or RegistryOptions.from_env())
        try:
            _, _, digest = client.get_manifest(ref.repository, ref.tag or "latest")
        finally:
            client.close()
        return digest

    return resolve


def pointer(path: JsonPath) -> str:
    """An RFC 6901 JSON pointer (`~` as `~0`, `/` as `~1`) from its tokens."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in path)


@dataclass(frozen=True, slots=True)
class Mutation:
    """An answered mutating review.

    Attributes:
        decision: The response (with the patch) and what the audit log and metrics record.
        patch: The RFC 6902 operations (`op`, `path`, `value`), empty when nothing changes or on a deny.
        patched: The object with the patch applied (the object unchanged when the patch is empty), or None
            when the request could not be read.
        pin: The `MODELSEC_MODEL_DIGEST` value computed for the object, or None when it names no covered
            model.
    """

    decision: Decision
    patch: tuple[dict[str, Any], ...] = ()
    patched: Mapping[str, Any] | None = None
    pin: str | None = None


class _Refused(Exception):
    """Internal control flow: a mutation that must be denied (`reason`, `message`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(slots=True)
class _Plan:
    """The operations and pins of one review, built in order (step numbers: module docstring)."""

    policies: PolicySet
    namespace: str
    resolve: Resolver
    check_deadline: Callable[[], None]
    ops: list[tuple[str, JsonPath, Any]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    covered: dict[tuple[str, str], tuple[Policy, ...]] = field(default_factory=dict)
    resolved: dict[tuple[str, str, str], str | None] = field(default_factory=dict)

    def digest_of(self, ref: OciReference, where: str) -> str | None:
        """Step 4: the hex digest a tag names now (once per review), or None (the refusal is recorded)."""
        tag = ref.tag or "latest"
        key = (ref.registry, ref.repository, tag)
        if key not in self.resolved:
            self.check_deadline()
            self.resolved[key] = None
            try:
                digest = self.resolve(ref)
            except NotFoundError as e:
                self.refused.append(
                    (
                        "tag-unresolved",
                        f"{where}: tag {tag!r} of {ref.repository_uri} cannot be resolved: {e.diagnostics()}",
                    )
                )
            except BackendUnavailableError as e:
                self.refused.append(
                    (
                        "registry-unavailable",
                        f"{where}: tag {tag!r} of {ref.repository_uri} cannot be "
                        f"resolved, the registry cannot be read: {e.diagnostics()}",
                    )
                )
            except Error as e:
                self.refused.append(("tag-unresolved", f"{where}: {ref}: {e.diagnostics()}"))
            else:
                if not (digest.startswith("sha256:") and len(digest) == 71):
                    problem = f"{where}: {ref}: not a sha256 digest: {digest!r}"
                    self.refused.append(("tag-unresolved", problem))
                else:
                    self.resolved[key] = digest.removeprefix("sha256:")
            self.check_deadline()
        return self.resolved[key]

    def reference(self, raw: str, where: str) -> str:
        """Steps 3-4 for one model reference: the reference as it must be written (`raw` if unchanged)."""
        try:
            uri, digest = split_reference(raw)
            normalised = normalize_model_uri(uri)
        except MalformedArtifactError:
            return raw  # the validating webhook refuses it, naming why
        matched = self.policies.matching(normalised, self.namespace)
        if not matched:
            return raw
        if digest is None:
            if oci_scheme(uri) is None:
                return raw  # no tag to resolve: the policies that require a digest refuse it
            ref = parse_reference(uri)
            digest = self.digest_of(ref, where)
            if digest is None:
                return raw
            # The scheme is kept: a `modelsec+oci://` storageUri must still reach modelsec's initializer.
            raw = pinned_uri(uri, f"sha256:{digest}")
        self.covered.setdefault((normalised, digest), matched)
        return raw

    def site(self, site: Site) -> None:
        """Steps 3-4 for one located field: a replace operation when it must change."""
        if site.kind == "annotation":
            entries = split_models_annotation(site.value)
            new = [self.reference(e, site.where) for e in entries]
            if new != entries:
                self.ops.append(("replace", site.path, ",".join(new)))
        elif site.kind == "uri":
            text = site.value.strip()
            if (new_uri := self.reference(text, site.where)) != text:
                self.ops.append(("replace", site.path, new_uri))
        else:
            image = parse_image(site.value, site.where)
            if image.invalid is not None or image.malformed:
                return
            matched = self.policies.matching(image.uri, self.namespace)
            if not matched:
                return  # not a model: runtime images are not pinned here
            digest = image.digest
            if digest is None:
                ref = parse_image_reference(site.value)
                digest = self.digest_of(ref, site.where)
                if digest is None:
                    return
                self.ops.append(("replace", site.path, f"{ref.name}@sha256:{digest}"))
            self.covered.setdefault((image.uri, digest), matched)


def _apply(doc: Any, op: str, path: JsonPath, value: Any) -> None:
    """Apply one `replace` or `add` (a new key, or `-`: the end of a list) operation in place."""
    parent = doc
    for token in path[:-1]:
        parent = parent[token]
    last = path[-1]
    if op == "add" and last == "-":
        parent.append(value)
    else:
        parent[last] = value


class Mutator:
    """Answers mutating AdmissionReviews with the policies, configuration and mode of a `Reviewer`.

    The reviewer's policies are read at each review, so a reloaded policy file applies to both webhooks.

    Example:
        >>> mutator = Mutator(reviewer, registry_resolver(), bindings=bound_root_digests)
        >>> mutation = mutator.review(body)  # raises BadRequestError when the uid is unreadable
        >>> mutation.decision.response["response"].get("patch")
    """

    def __init__(
        self,
        reviewer: Reviewer,
        resolve: Resolver,
        *,
        bindings: Callable[[str, Policy], set[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create a mutator.

        Args:
            reviewer: Its policies, configuration (mode, deadline) and request parsing are shared.
            resolve: Resolves a tag to a manifest digest (`registry_resolver`).
            bindings: The model root digests that trusted bindings attach to an `oci://…@sha256:` manifest
                under a policy (`modelsec.distribution.push_pull.bound_root_digests`); default: the
                reviewer's. None: digests are pinned as written.
            clock: Monotonic clock in seconds (tests inject one).
        """
        self.reviewer = reviewer
        self.resolve = resolve
        self.bindings = bindings if bindings is not None else reviewer.bindings
        self._clock = clock

    def review(self, body: bytes) -> Mutation:
        """Parse (`Reviewer.parse`) and mutate in one call.

        Raises:
            BadRequestError: No readable `request.uid` (answer HTTP 400).
        """
        return self.mutate(self.reviewer.parse(body))

    def mutate(self, request: AdmissionRequest, *, started: float | None = None) -> Mutation:
        """Decide on a parsed request; never raises (every failure is a deny without a patch).

        Args:
            request: From `Reviewer.parse`.
            started: When the deadline started (monotonic seconds; default now).

        Returns:
            The mutation: its response (in the request's apiVersion, uid echoed), patch and patched object.
        """
        config = self.reviewer.config
        deadline = (self._clock() if started is None else started) + config.deadline_seconds

        def check_deadline() -> None:
            if self._clock() > deadline:
                raise DeadlineExceededError(
                    f"tags were not resolved within the {config.deadline_seconds:g} s deadline"
                )

        info = Reviewer.request_info(request.review["request"])
        dry_run = False
        try:
            req = self.reviewer.check_review(request)
            dry_run = req.get("dryRun") is True
            if req.get("subResource"):
                return self._answer(request, "allow", "subresource", (), dry_run, info)
            kind = req["kind"]
            group, kind_name = kind.get("group", ""), kind.get("kind")
            obj = req["object"]
            locations = locate(group, kind_name, obj)
            serving = _serving_names(group, kind_name, obj)
        except Error as e:
            return self._answer(request, "deny", "malformed-request", (e.diagnostics(),), dry_run, info)
        except Exception as e:  # noqa: BLE001 - fail closed: any bug in parsing is a deny, never an allow
            message = f"internal error while reading the request: {type(e).__name__}"
            return self._answer(request, "deny", "malformed-request", (message,), dry_run, info)
        namespace = info.get("namespace", "")
        plan = _Plan(self.reviewer.policies, namespace, self.resolve, check_deadline)
        pin: str | None = None
        try:
            for site in locations.sites:
                plan.site(site)
            if plan.refused:
                raise _Refused(plan.refused[0][0], "; ".join(m for _, m in plan.refused))
            pin = self._pin(plan.covered, check_deadline)
            guard = sorted({p.guard_policy for ps in plan.covered.values() for p in ps if p.guard_policy})
            if len(guard) > 1:
                raise _Refused(
                    "guard-policy-conflict",
                    f"the policies matching this workload's models name different guardPolicy files "
                    f"({', '.join(guard)}): one process loads one",
                )
            env = [(MODEL_DIGEST_ENV, pin)] if pin is not None else []
            env += [(POLICY_ENV, guard[0])] if guard else []
            if env:
                pod_update = (group, kind_name) == ("", "Pod") and req.get("operation") == "UPDATE"
                targets = _targets(locations.containers, serving)
                plan.ops += _inject(targets, env, add=not pod_update)
        except _Refused as e:
            return self._answer(request, "deny", e.reason, (e.message,), dry_run, info)
        except DeadlineExceededError as e:
            return self._answer(request, "deny", "deadline", (e.diagnostics(),), dry_run, info)
        except BackendUnavailableError as e:
            message = f"the registry cannot be read: {e.diagnostics()}"
            return self._answer(request, "deny", "registry-unavailable", (message,), dry_run, info)
        except Error as e:
            return self._answer(request, "deny", "error", (e.diagnostics(),), dry_run, info)
        except Exception as e:  # noqa: BLE001 - fail closed: a bug while mutating is a deny, never an allow
            message = f"internal error: {type(e).__name__}: {e}"
            return self._answer(request, "deny", "error", (message,), dry_run, info)
        patched = copy.deepcopy(obj)
        patch = []
        for op, path, value in plan.ops:
            _apply(patched, op, path, value)
            patch.append({"op": op, "path": pointer(path), "value": value})
        reason = "mutated" if patch else "unchanged"
        return self._answer(request, "allow", reason, (), dry_run, info, tuple(patch), patched, pin)

    def _pin(
        self, covered: Mapping[tuple[str, str], Sequence[Policy]], check_deadline: Callable[[], None]
    ) -> str | None:
        """Step 5: the `MODELSEC_MODEL_DIGEST` value, or None when no covered model names a digest.

        Raises:
            BackendUnavailableError: A registry holding bindings cannot be read.
        """
        pins: set[str] = set()
        for (uri, digest), policies in covered.items():
            roots: set[str] = set()
            if uri.startswith("oci://") and self.bindings is not None:
                for policy in policies:
                    check_deadline()
                    try:
                        roots |= self.bindings(f"{uri}@sha256:{digest}", policy)
                    except BackendUnavailableError:
                        raise
                    except Error:
                        continue  # no manifest (a root digest) or no readable binding: pinned as written
            pins |= {f"{uri}@sha256:{root}" for root in (roots or {digest})}
        return ",".join(sorted(pins)) if pins else None

    def _answer(
        self,
        request: AdmissionRequest,
        verdict: str,
        reason: str,
        messages: tuple[str, ...],
        dry_run: bool,
        info: Mapping[str, str],
        patch: tuple[dict[str, Any], ...] = (),
        patched: Mapping[str, Any] | None = None,
        pin: str | None = None,
    ) -> Mutation:
        mode = self.reviewer.config.mode
        review, shown = admission_review(request, mode, verdict, reason, messages, annotation="mutation")
        response = review["response"]
        warnings = tuple(w[:512] for w in shown)
        if warnings:
            response["warnings"] = list(warnings)
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(list(patch)).encode()).decode()
        decision = Decision(
            response=review,
            uid=request.uid,
            verdict=verdict,
            allowed=response["allowed"],
            reason=reason,
            mode=mode,
            dry_run=dry_run,
            messages=messages,
            request_info={**info, "webhook": "mutate"},
            warnings=warnings,
        )
        if patched is None and verdict == "allow":
            patched = request.review["request"].get("object")
        return Mutation(decision, patch, patched, pin)


def _serving_names(group: str, kind: str, obj: Mapping[str, Any]) -> frozenset[str] | None:
    """The container names `modelsec.dev/serving-containers` lists (pod template first), or None.

    Raises:
        InvalidReviewError: The value is not a string, or has an empty entry.
    """
    places: list[tuple[str, ...]] = []
    if (group, kind) in WORKLOAD_KINDS:
        places.append((*WORKLOAD_KINDS[(group, kind)], "metadata", "annotations"))
    places.append(("metadata", "annotations"))
    for place in places:
        value: Any = obj
        for part in place:
            value = value.get(part) if isinstance(value, Mapping) else None
        text = value.get(SERVING_CONTAINERS_ANNOTATION) if isinstance(value, Mapping) else None
        if text is None:
            continue
        where = ".".join(place) + f"[{SERVING_CONTAINERS_ANNOTATION}]"
        if not isinstance(text, str):
            raise InvalidReviewError(f"{where} is not a string")
        names = [n.strip() for n in text.split(",")]
        if not all(names):
            raise InvalidReviewError(f"{where} has an empty entry: {text!r}")
        return frozenset(names)
    return None


def _targets(containers: Sequence[ContainerSite], serving: frozenset[str] | None) -> list[ContainerSite]:
    """Step 6: the containers to inject into.

    Raises:
        _Refused: The annotation names a container that the object does not have.
    """
    if serving is None:
        return list(containers)
    missing = sorted(serving - {c.name for c in containers})
    if missing:
        raise _Refused(
            "serving-containers",
            f"annotation {SERVING_CONTAINERS_ANNOTATION} names containers this workload does not have: "
            f"{', '.join(missing)} (they would run the model unpinned)",
        )
    return [c for c in containers if c.name in serving]


def _inject(
    targets: Sequence[ContainerSite], env: Sequence[tuple[str, str]], *, add: bool
) -> list[tuple[str, JsonPath, Any]]:
    """Step 6: the `add` operations for the variables a container lacks.

    Raises:
        _Refused: A container sets one of them to another value, or from `valueFrom`.
    """
    ops: list[tuple[str, JsonPath, Any]] = []
    conflicts: list[str] = []
    for container in targets:
        listed = [e for e in container.env or [] if isinstance(e, Mapping)]
        missing = []
        for name, value in env:
            present = [e for e in listed if e.get("name") == name]
            for entry in present:
                if entry.get("valueFrom") is not None or entry.get("value") != value:
                    shown = "valueFrom" if entry.get("valueFrom") is not None else repr(entry.get("value"))
                    conflicts.append(
                        f"{container.where} (container {container.name!r}) sets {name} to {shown}, "
                        f"but the admitted models need {value!r}"
                    )
            if not present:
                missing.append({"name": name, "value": value})
        if not missing or not add:
            continue
        if container.env is None:
            ops.append(("add", (*container.path, "env"), missing))
        else:
            ops += [("add", (*container.path, "env", "-"), entry) for entry in missing]
    if conflicts:
        raise _Refused("env-conflict", "; ".join(conflicts))
    return ops
