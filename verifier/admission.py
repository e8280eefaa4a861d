"""Admission: which policies of a policy file decide about a model, and what their outcomes add up to.

One evaluation serves every front door: `modelsec verify`, the loader (`load_model`, `open_model`), the
runtime guard, gRPC `VerifyModel`, `pull` and the admission webhook. Its order is an invariant:

1. **Matching.** Every policy whose `match` globs cover the model reference (a local model is matched as
   `file://<real path>`, that path derived from the descriptor of the directory or file that was opened,
   never from the path resolved before the open: `admit_opened`; DESIGN decision 20) and that applies in
   the namespace (`namespaces:`; outside Kubernetes there is no namespace and every policy applies) is a
   matching policy. Every one of them must pass (policy-controller and Kyverno semantics); file order only
   picks which one verifies a local model's bytes (below).
2. **No match.** A reference no policy matches follows its namespace's `noMatch` (`namespaceRules`:
   `deny`, `warn` or `allow`); outside a namespace it is denied (`noMatch: deny`).
3. **The digest requirement.** A reference that pins no model root digest (`oci://…:tag`) fails every
   matching policy without evidence being read: there is no root digest to look evidence up by, and with
   `requireDigest` (the default) a tag is refused as mutable. A local model has the root digest its
   signatures verify; `--expected-digest` / `$MODELSEC_MODEL_DIGEST` pin it further (`verify_signatures`).
4. **Each policy on its own.** Each matching policy is checked with its own keys, authorities, required
   algorithms and attestations over the same root digest. A failing policy in `mode: enforce` (the
   default) refuses the model; a failing policy in `mode: warn` is reported as a warning and refuses
   nothing. A store outage (`BackendUnavailableError`) is never a policy's failure: it is raised.

A local model (`verify`, the loader, the guard, `VerifyModel`, `pull`) is read once, so one policy verifies
its bytes (`ModelAdmission.policy`): the first enforcing matching policy, carrying the strictest local
rules of every enforcing one (remote code only if each allows it, pickle refused if any refuses it, each
limit the smallest). The others vouch for the root digest its signatures verified before any model file is
opened (`ModelAdmission.vouch`, called by `verify_signatures`). A model that only `warn` policies match is
verified by the first of them, whose failure still refuses the model: the loader hands out verified bytes
only, and there are none to hand out. A warn policy's local rules (refusals, limits) do not tighten the
read of the bytes; its evidence is checked and a failure reported.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import (
    BackendUnavailableError,
    Error,
    ModelMovedError,
    PolicyError,
    PolicyViolationError,
)
from modelsec.limits import Limits
from modelsec.modelformat.model_files import open_beneath
from modelsec.policy import Policy, PolicySet, model_uri

__all__ = [
    "AdmissionVerdict",
    "DigestRequiredError",
    "ModelAdmission",
    "PolicyOutcome",
    "PolicyWarning",
    "admit",
    "admit_model",
    "admit_opened",
    "evaluate",
    "opened_model_uri",
    "report_warnings",
]

ENFORCE = "enforce"
WARN = "warn"


class PolicyWarning(UserWarning):
    """A matching policy in `mode: warn` refused a model that was verified and used nonetheless.

    Issued with `warnings.warn` by the loader and the runtime guard; `verify` prints the same message.
    """


class DigestRequiredError(PolicyViolationError):
    """A reference pins no model root digest, so no matching policy can be checked."""


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """What one matching policy said about a model.

    Attributes:
        policy: The matching policy.
        detail: What satisfied it, or why it refuses the model.
        error: The error it refused with; None when it passed.
    """

    policy: Policy
    detail: str
    error: Error | None = None

    @property
    def passed(self) -> bool:
        """Whether the policy passed."""
        return self.error is None

    @property
    def enforced_failure(self) -> bool:
        """Whether this is a failure that refuses the model (the policy is in `mode: enforce`)."""
        return self.error is not None and self.policy.mode != WARN

    @property
    def warned_failure(self) -> bool:
        """Whether this is a failure that is only reported (the policy is in `mode: warn`)."""
        return self.error is not None and self.policy.mode == WARN


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    """The outcome of every matching policy for one model reference (see the module docstring).

    Attributes:
        uri: The reference matched (without its digest).
        namespace: The namespace evaluated in; None outside Kubernetes.
        outcomes: One per matching policy, in file order; empty when none matched.
        no_match: The `noMatch` action applied when no policy matched (`deny`, `warn`, `allow`); else None.
        source: The policy file, for diagnostics.
    """

    uri: str
    namespace: str | None
    outcomes: tuple[PolicyOutcome, ...]
    no_match: str | None
    source: str

    @property
    def matched(self) -> tuple[Policy, ...]:
        """The matching policies, in file order."""
        return tuple(o.policy for o in self.outcomes)

    @property
    def allowed(self) -> bool:
        """Whether the model may be used: no enforcing policy failed (or none matched and noMatch allows)."""
        if not self.outcomes:
            return self.no_match in (WARN, "allow")  # fail closed: anything else denies
        return not any(o.enforced_failure for o in self.outcomes)

    @property
    def enforced_failures(self) -> tuple[PolicyOutcome, ...]:
        """The failures that refuse the model."""
        return tuple(o for o in self.outcomes if o.enforced_failure)

    @property
    def warned_failures(self) -> tuple[PolicyOutcome, ...]:
        """The failures of policies in `mode: warn`, which are reported and refuse nothing."""
        return tuple(o for o in self.outcomes if o.warned_failure)

    @property
    def no_match_detail(self) -> str:
        """Why nothing matched, in words (the namespace named when there is one)."""
        where = "" if self.namespace is None else f" in namespace {self.namespace!r}"
        return f"no policy in {self.source} matches this model{where} (noMatch: {self.no_match})"

    def warnings(self) -> tuple[str, ...]:
        """Each warn policy's failure (and a `noMatch: warn`), in words."""
        if not self.outcomes:
            return (self.no_match_detail,) if self.no_match == WARN else ()
        return tuple(f"policy {o.policy.name!r} (mode: warn): {o.detail}" for o in self.warned_failures)

    @classmethod
    def refused(
        cls, uri: str, namespace: str | None, matched: Iterable[Policy], error: Error, source: str
    ) -> AdmissionVerdict:
        """Every policy in `matched` refuses with `error` (e.g. a store outage or an overrun deadline).

        It refuses the model unless all of them are in `mode: warn`, as any other failure does.
        """
        why = error.diagnostics()
        return cls(uri, namespace, tuple(PolicyOutcome(p, why, error) for p in matched), None, source)

    def raise_for_enforced(self) -> None:
        """Raise the first enforcing policy's error (its own class), or the refusal of an unmatched model.

        Raises:
            PolicyViolationError: No policy matches and `noMatch` is `deny`.
            VerificationError: An enforcing policy failed (the class and fields of its own error).
        """
        if not self.outcomes:
            if self.no_match == "deny":
                raise PolicyViolationError(f"{self.uri}: {self.no_match_detail}")
            return
        failed = self.enforced_failures
        if failed and failed[0].error is not None:
            raise failed[0].error


def _matching(policies: PolicySet, uri: str, namespace: str | None) -> tuple[tuple[Policy, ...], str | None]:
    """The matching policies, or none and the `noMatch` action that applies."""
    matched = policies.matching(uri, namespace)
    if matched:
        return matched, None
    return (), "deny" if namespace is None else policies.rule_for(namespace).no_match


def evaluate(
    policies: PolicySet,
    uri: str,
    check: Callable[[Policy], str],
    *,
    namespace: str | None = None,
    pinned: bool = True,
) -> AdmissionVerdict:
    """Evaluate every policy matching `uri` (steps 1-4 of the module docstring).

    Args:
        policies: The policy file.
        uri: The model reference without its digest (`oci://registry/repo`, `file:///models/m`).
        check: Checks one matching policy: returns what satisfied it, raises a modelsec `Error` when the
            policy refuses the model.
        namespace: The Kubernetes namespace; None outside Kubernetes (every policy applies, noMatch denies).
        pinned: Whether the reference pins a model root digest; False fails every matching policy (step 3)
            without calling `check`.

    Returns:
        The verdict, with one outcome per matching policy; nothing is raised for a refusal.

    Raises:
        BackendUnavailableError: `check` could not read the evidence (an outage is no policy's failure).
    """
    matched, no_match = _matching(policies, uri, namespace)
    if not pinned and matched:
        names = ", ".join(repr(p.name) for p in matched)
        if all(p.require_digest for p in matched):
            why = f"policy {names} requires a pinned @sha256:<model root digest> (tags are mutable)"
        else:
            why = "no model root digest to verify"
        return AdmissionVerdict.refused(uri, namespace, matched, DigestRequiredError(why), policies.source)
    outcomes = tuple(_outcome(p, check) for p in matched)
    return AdmissionVerdict(uri, namespace, outcomes, no_match, policies.source)


def _outcome(policy: Policy, check: Callable[[Policy], str]) -> PolicyOutcome:
    try:
        return PolicyOutcome(policy, check(policy))
    except BackendUnavailableError:
        raise
    except Error as e:
        return PolicyOutcome(policy, e.diagnostics(), e)


@dataclass(frozen=True, slots=True)
class ModelAdmission:
    """The policies one model is verified under: one reads its bytes, each other vouches for its root digest.

    Build it with `admit` / `admit_model`; `Policy` alone is the admission of a single policy (`of`).

    Attributes:
        uri: The reference the policies matched (`file://<real path>` for a local model).
        policy: Verifies the model's signatures and bytes (the first enforcing matching policy, with the
            strictest local rules of every enforcing one).
        others: The other matching policies, each checked over the root digest `policy` verified.
        source: The policy file, for diagnostics.
        policy_digest: Hex SHA-256 of the policy file's bytes ("" when not read from a file): recorded in
            load receipts.
    """

    uri: str
    policy: Policy
    others: tuple[Policy, ...] = ()
    source: str = "command line"
    policy_digest: str = ""

    @classmethod
    def of(cls, policy: Policy | ModelAdmission) -> ModelAdmission:
        """`policy` itself when it is an admission, else the admission of that one policy."""
        if isinstance(policy, ModelAdmission):
            return policy
        return cls(uri="", policy=policy)

    @property
    def policies(self) -> tuple[Policy, ...]:
        """Every matching policy: `policy` first."""
        return (self.policy, *self.others)

    def vouch(self, root_digest: str, check: Callable[[Policy], object]) -> tuple[str, ...]:
        """Check each of `others` over `root_digest`, which `policy` verified (step 4).

        Args:
            root_digest: The model root digest the signatures of `policy` verified.
            check: Checks one policy over that digest (e.g. its own signatures with
                `expected_digests=[root_digest]`), raising a modelsec `Error` when it refuses the model.

        Returns:
            The warnings of the failing policies in `mode: warn`.

        Raises:
            VerificationError: An enforcing policy refused the model (the error it raised).
            BackendUnavailableError: Evidence could not be read.
        """
        if not self.others:
            return ()

        def one(p: Policy) -> str:
            check(p)
            return f"verified model root digest {root_digest}"

        outcomes = tuple(_outcome(p, one) for p in self.others)
        verdict = AdmissionVerdict(self.uri, None, outcomes, None, self.source)
        verdict.raise_for_enforced()
        return verdict.warnings()

    def requiring(self, algorithms: Iterable[SignatureAlgorithm]) -> ModelAdmission:
        """Every matching policy tightened to require `algorithms` (`verify --require`).

        The result does not depend on the order of the matching policies: each algorithm is required of every
        one of them that `can_sign` it, so each must verify a signature of that algorithm with its own keys or
        authorities. A policy that cannot is left as it is, rather than required to do the impossible.

        Raises:
            PolicyError: No matching policy can sign one of `algorithms`: the requirement could never be met.
        """
        wanted = frozenset(algorithms)
        members = self.policies
        for algorithm in sorted(wanted):
            if not any(p.can_sign(algorithm) for p in members):
                names = ", ".join(repr(p.name) for p in members)
                raise PolicyError(
                    f"required algorithm {algorithm} can never be met: no matching policy ({names}) trusts a "
                    f"key or authority that makes {algorithm} weights signatures"
                )

        def tightened(p: Policy) -> Policy:
            extra = {a for a in wanted if p.can_sign(a)}
            return dataclasses.replace(p, require_algorithms=p.require_algorithms | extra)

        return dataclasses.replace(
            self, policy=tightened(self.policy), others=tuple(tightened(p) for p in self.others)
        )


def admit(policies: PolicySet, uri: str) -> ModelAdmission:
    """The admission of the model `uri` names, outside any namespace (steps 1-2 of the module docstring).

    Args:
        policies: The policy file.
        uri: The reference without its digest (`file://<real path>`, `oci://registry/repo`).

    Returns:
        The policy that verifies the bytes and the policies that vouch for the root digest.

    Raises:
        PolicyViolationError: No policy matches (`noMatch: deny`).
    """
    matched, _ = _matching(policies, uri, None)
    if not matched:
        raise PolicyViolationError(
            f"{uri}: no policy in {policies.source} matches this model (noMatch: deny)"
        )
    enforcing = [p for p in matched if p.mode != WARN]
    primary = enforcing[0] if enforcing else matched[0]
    strict = enforcing or [primary]
    limits = Limits(
        **{f.name: min(getattr(p.limits, f.name) for p in strict) for f in dataclasses.fields(Limits)}
    )
    primary = dataclasses.replace(
        primary,
        allow_remote_code=all(p.allow_remote_code for p in strict),
        refuse_pickle=any(p.refuse_pickle for p in strict),
        limits=limits,
    )
    others = tuple(p for p in matched if p.name != primary.name)
    return ModelAdmission(uri, primary, others, policies.source, policies.digest)


def admit_model(model_path: Path, policy: Policy | PolicySet | ModelAdmission | None) -> ModelAdmission:
    """The admission of a local model directory or file, matched as `file://<real path>` before it is opened.

    For options and messages that come before the model is opened (`verify --require`, a service's policy
    names). The path can change before the open: whatever reads the model passes this admission to
    `admit_opened` with the opened descriptor, which refuses it unless the same real path was opened.

    Args:
        model_path: The model directory, or one file of it.
        policy: An admission as it is, one `Policy` alone, a `PolicySet` to match, or None for the policy
            file named by `$MODELSEC_POLICY`.

    Raises:
        PolicyError: `policy` is None and `$MODELSEC_POLICY` is unset or invalid.
        PolicyViolationError: No policy of the set matches the model.
    """
    if isinstance(policy, ModelAdmission):
        return policy
    if isinstance(policy, Policy):
        return ModelAdmission(model_uri(model_path), policy)
    policy_set = policy if policy is not None else PolicySet.from_env()
    return admit(policy_set, model_uri(model_path))


def opened_real_path(fd: int, path: Path) -> str:
    """The real path of the directory or file open on `fd`, derived from the descriptor.

    Read as `/proc/self/fd/<fd>` (the kernel's name of the open object; Linux), else `os.path.realpath(path)`.
    Either way the name must still be that object (`lstat` of it has the `fstat` identity of `fd`): a name
    that now holds something else, or none, is refused.

    Args:
        fd: An open descriptor.
        path: The path it was opened by, for the fallback and for messages.

    Raises:
        ModelMovedError: The name no longer holds the opened object (it was renamed, exchanged or removed).
    """
    opened = os.fstat(fd)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
    try:
        named = os.lstat(real)
    except OSError as e:
        raise ModelMovedError(str(path), f"the opened model is no longer at {real!r} ({e.strerror})") from e
    if not real.startswith("/") or (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
        raise ModelMovedError(str(path), f"{real!r} no longer names the directory or file that was opened")
    return real


def opened_model_uri(model_path: Path, root_fd: int, single: str | None) -> str:
    """`file://<real path>` of an opened model: its root directory, or its one file `single` below it.

    The single file is opened beneath `root_fd` as the verifier opens it (no link followed but a hub
    snapshot's link into its own `blobs/`), so the path is the file that would be read.

    Raises:
        ModelMovedError: The path no longer names what was opened.
        PolicyViolationError: `single` is a link (other than a hub snapshot's blob link).
        MalformedArtifactError: `single` cannot be opened.
    """
    if single is None:
        return "file://" + opened_real_path(root_fd, model_path)
    fd = open_beneath(root_fd, single, what=str(model_path.parent))
    try:
        return "file://" + opened_real_path(fd, model_path)
    finally:
        os.close(fd)


def admit_opened(
    model_path: Path,
    root_fd: int,
    single: str | None,
    policy: Policy | PolicySet | ModelAdmission | None,
) -> ModelAdmission:
    """The admission of an opened local model: matched as `file://<real path of what was opened>`.

    Every front door that reads a local model (`verify_model`, the loader, the guard, gRPC `VerifyModel`)
    opens the model root once and decides here, from the descriptor, which policies verify it; each later
    read goes through that descriptor. So the policy is chosen for the bytes that are read, even if someone
    who can write the folder above the model exchanges it with a link meanwhile (DESIGN decision 20).

    Args:
        model_path: The model path as given (messages; the `/proc` fallback).
        root_fd: A descriptor of the model directory (the directory holding `single`).
        single: One file's name below `root_fd`, or None for the directory itself.
        policy: A `PolicySet` to match (None: `$MODELSEC_POLICY`), one `Policy`, or an admission matched
            before the open (`admit_model`), which must have matched the same real path.

    Raises:
        ModelMovedError: The path no longer names what was opened, or an admission matched before the open
            names another path than the one opened (the model path changed in between).
        PolicyError: `policy` is None and `$MODELSEC_POLICY` is unset or invalid.
        PolicyViolationError: No policy of the set matches the model.
    """
    uri = opened_model_uri(model_path, root_fd, single)
    if isinstance(policy, ModelAdmission):
        if policy.uri and policy.uri != uri:
            raise ModelMovedError(
                str(model_path), f"the policy was chosen for {policy.uri} but {uri} was opened"
            )
        return policy
    if isinstance(policy, Policy):
        return ModelAdmission(uri, policy)
    return admit(policy if policy is not None else PolicySet.from_env(), uri)


def report_warnings(messages: Iterable[str]) -> None:
    """Issue each failure of a `mode: warn` policy as a `PolicyWarning` (the loader's and the guard's way)."""
    for message in messages:
        warnings.warn(message, PolicyWarning, stacklevel=3)
