"""Verification policy: which keys and identities are trusted, which algorithms must sign, what is refused.

Two levels:

* `Policy` is what one verification applies (keys, required algorithms, refusals, limits). Its defaults are
  the safe ones of DESIGN.md decision 6 and apply from the first `modelsec verify`, before any policy file
  exists: pickle formats and remote code are refused even when signed.
* `PolicySet` is the policy *file* (YAML or JSON, `apiVersion: modelsec.dev/v1alpha1`, `kind: ModelPolicy`):
  named policies, each matching model references by glob (`oci://registry/models/**`,
  `file:///models/**`; a local directory is matched as `file://<real path>`), and `noMatch: deny`. It is
  validated strictly (`modelsec.policy.models.PolicyFileModel`, published as
  `schemas/model-policy.schema.json`): unknown fields, duplicate keys, wrong types, `null` values and
  unreadable keys are `PolicyError`s naming the file and the field path. Loaded from a path or from
  `$MODELSEC_POLICY`.

Example:
```yaml
apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: internal-models
    match: ["file:///models/**"]
    keys:
      - {path: trust/ci-p256.pub.pem, name: ci-ecdsa, roles: [weights],
         validUntil: "2026-01-01T00:00:00Z"}  # rotated: signatures timestamped (else verified) by then count
      - trust/ci-sm2.pub.pem               # shorthand: all roles (as roles left out; [] is refused)
    authorities:                           # identities, besides pinned keys (DESIGN.md decision 12)
      - name: corp-ca
        roles: [weights]
        x509:
          roots: [trust/corp-root.pem]       # bundles' own intermediates are untrusted path material
          identities: [{san: "mailto:release@corp.example"}]
      - name: sigstore
        sigstore:
          trustedRoot: production            # production | staging | a trusted_root.json file
          identities:
            - identity: https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main
              issuer: https://token.actions.githubusercontent.com
    timestampAuthorities:                  # RFC 3161 TSAs; self-issued certificates are the roots
      - {name: corp-tsa, certChain: [trust/tsa-root.pem]}
    requireTimestamp: true                 # every weights signature needs a trusted timestamp
    requireAlgorithms: [ecdsa-p256, sm2]
    checkHashes: [sha256]                  # file digests the loader recomputes (default: every signed one)
    allowRemoteCode: false
    limits: {maxFiles: 4096}
    attestations:
      robustness: {attack: pgd-linf, minEps: 0.03, minRobustAccuracy: 0.85, rule: strict, minSamples: 500,
                   maxAge: 30d, minSteps: 40, minRestarts: 1,
                   requireServerRun: true,    # only gates a modelsec server ran (runBy recorded)
                   datasetDigests: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]}
      watermark: {required: true, minConfidence: 0.92, maxFalsePositive: 1.0e-9, requireServerRun: false,
                 maxFidelityLoss: 1.0e-4,
                 keyFile: trust/watermark.key, message: release-2}  # the mark's message (as `embed -m`)
    attestationStore: /var/lib/modelsec/attestations  # besides model.watermark.sig / model.gate.sig; a
                                                      # path or file:// | sqlite:// | grpc(s):// URI
                                                      # (`attestationDir`: the older name, a path)
    mode: enforce                          # enforce | warn (a failure is reported, never fatal), per policy
    namespaces: ["ml-*"]                   # admission: where the policy applies (default: everywhere)
    guardPolicy: /etc/modelsec/guard.yaml       # admission: MODELSEC_POLICY of the serving containers
noMatch: deny
namespaceRules:                            # admission: the first rule whose glob matches the namespace
  - {namespaces: ["scratch-*"], noMatch: allow}          # a reference no policy matches: deny|warn|allow
  - {namespaces: ["prod-*"], requireModel: true}          # a workload there must name a model
```

Every matching policy must pass (policy-controller and Kyverno semantics), at every front door alike:
`verify`, the loader, the runtime guard, gRPC `VerifyModel`, `pull` and the admission webhook all use the
one evaluation of `modelsec.verifier.admission`. At admission the policies that apply in the namespace
match (`PolicySet.matching`); elsewhere there is no namespace and all of them do. A failing policy in
`mode: enforce` (the default) refuses the model; one in `mode: warn` is reported (a webhook warning, a
`verify` warning, a `PolicyWarning` from the loader and the guard) and refuses nothing. A model that only
`warn` policies match is still verified locally by the first of them (the loader hands out verified bytes
only), so that one's failure refuses a local load. `requireDigest` refuses references that pin no model
root digest.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.errors import Error, ModelMovedError, PolicyError
from modelsec.limits import Limits

# The parts a policy is made of (authorities, requirements, TSAs and key windows), the key registry and OCI
# reference normalisation are imported by what uses them (parsing a policy file, `from_key_files`,
# `can_sign`, `matching`): the loader imports this module, and its import is paid for by every process the
# runtime guard starts (issue 32 item 5).
if TYPE_CHECKING:  # pydantic is imported when a file is parsed, not by every `import modelsec.policy`
    from modelsec.policy.authorities import Authority
    from modelsec.policy.models import KeyRefModel, PolicyModel
    from modelsec.policy.requirements import (
        ConditionRequirement,
        LoadReceiptRequirement,
        RobustnessRequirement,
        WatermarkRequirement,
    )
    from modelsec.policy.trust import KeyWindow, TimestampAuthority
    from modelsec.signer.keys import TrustedKey

__all__ = [
    "API_VERSION",
    "POLICY_ENV",
    "ROLES",
    "NamespaceRule",
    "Policy",
    "PolicySet",
    "model_uri",
]

API_VERSION = "modelsec.dev/v1alpha1"  # the `apiVersion` of every modelsec configuration file
POLICY_ENV = "MODELSEC_POLICY"
ROLES = frozenset({"weights", "watermark", "gate"})  # what a trusted key may sign


@dataclass(frozen=True, slots=True)
class Policy:
    """What a verifier trusts and requires.

    Attributes:
        keys: Trusted public keys; keys are never taken from an artifact.
        authorities: Certificate and Sigstore authorities with identity constraints; a certificate in a
            bundle is believed only through one of them (DESIGN.md decision 12).
        require_algorithms: Every one of these must have produced a valid signature.
        allow_remote_code: Accept `*.py` files and `auto_map` in config files (default: refuse).
        refuse_pickle: Refuse pickle formats in a model (default: refuse): by name (`.bin`, `.pt`, ...) and
            by content (`modelsec.modelformat.content`: pickles, torch zips, compressed pickles, and
            archives that hold or may hold pickles). Even when False, modelsec never unpickles anything:
            the files are only verified as opaque bytes.
        check_hashes: File digest algorithms the verifier/loader recomputes; empty means every hash type
            of every verified bundle.
        limits: Parsing and size limits.
        name: The policy's name in diagnostics.
        robustness: A robustness-gate attestation required, or None.
        watermark: A watermark attestation required, or None.
        attestation_store: The attestation store searched besides the reserved names in the model
            directory: a directory path or a store URI (`modelsec.verifier.stores.open_store`), relative
            paths already resolved against the policy file's directory.
        require_digest: References (admission) must pin the model root digest.
        mode: `enforce` (a failure refuses the model) or `warn` (a failure is reported, never fatal), at
            every front door alike (`modelsec.verifier.admission`).
        namespaces: Admission only: namespace globs this policy applies in (empty: every namespace).
        timestamp_authorities: RFC 3161 TSAs whose timestamps in a weights bundle are verified and place its
            signature in time (`modelsec.verifier.trust.timestamps`); with none, timestamps are not read.
        require_timestamp: Every weights signature must carry a timestamp of one of them.
        key_windows: Validity windows of pinned keys: a signature counts only if every trusted timestamp,
            or without one the verification time, lies inside its key's window.
        load_receipt: Emit (node) and check (`receipts verify`) TPM-quoted load receipts, or None
            (`modelsec.verifier.receipts`).
        guard_policy: Admission only: the absolute path, inside the serving containers, of the policy file
            their runtime guard loads; the mutating webhook injects it as `MODELSEC_POLICY`
            (`modelsec.webhook.mutate`). Not resolved against the policy file's directory.
    """

    keys: tuple[TrustedKey, ...]
    require_algorithms: frozenset[SignatureAlgorithm] = frozenset()
    allow_remote_code: bool = False
    refuse_pickle: bool = True
    check_hashes: frozenset[HashAlgorithm] = frozenset()
    limits: Limits = field(default_factory=Limits)
    name: str = "command line"
    robustness: RobustnessRequirement | None = None
    watermark: WatermarkRequirement | None = None
    attestation_store: str | None = None
    require_digest: bool = True
    authorities: tuple[Authority, ...] = ()
    mode: str = "enforce"
    namespaces: tuple[str, ...] = ()
    timestamp_authorities: tuple[TimestampAuthority, ...] = ()
    require_timestamp: bool = False
    key_windows: tuple[KeyWindow, ...] = ()
    guard_policy: str | None = None
    conditions: tuple[ConditionRequirement, ...] = ()
    load_receipt: LoadReceiptRequirement | None = None

    def window_for(self, key: TrustedKey) -> KeyWindow | None:
        """The validity window of `key`, or None when it has none."""
        return next((w for w in self.key_windows if w.key == key), None)

    def applies_in(self, namespace: str | None) -> bool:
        """Whether this policy applies in `namespace` (admission); None (no namespace) means every policy."""
        if namespace is None or not self.namespaces:
            return True
        return any(fnmatch.fnmatchcase(namespace, p) for p in self.namespaces)

    @property
    def requires_attestations(self) -> bool:
        """Whether any attestation beyond the weights signatures is required."""
        return self.robustness is not None or self.watermark is not None or bool(self.conditions)

    def can_sign(self, algorithm: SignatureAlgorithm) -> bool:
        """Whether a weights signature of `algorithm` can verify under this policy's own keys or authorities.

        A pinned key makes signatures of its own algorithm only; an authority can vouch for the algorithms
        whose scheme is `certified` (all but SM2: the ecosystem's certificates carry no SM2 keys).
        """
        if any(k.algorithm is algorithm and k.may("weights") for k in self.keys):
            return True
        from modelsec.signer.schemes import scheme_for

        return scheme_for(algorithm).certified and any(a.may("weights") for a in self.authorities)

    def __post_init__(self) -> None:
        if not self.keys and not self.authorities:
            raise PolicyError(
                f"policy {self.name!r} trusts no key: give at least one public key or authority"
            )
        if self.require_timestamp and not self.timestamp_authorities:
            raise PolicyError(f"policy {self.name!r}: requireTimestamp needs timestampAuthorities")

    @classmethod
    def from_key_files(
        cls,
        paths: Iterable[str | os.PathLike[str]],
        *,
        require: Iterable[SignatureAlgorithm] = (),
        allow_remote_code: bool = False,
        limits: Limits | None = None,
    ) -> Policy:
        """A policy trusting the public keys in `paths` (PEM SubjectPublicKeyInfo), defaults otherwise.

        Raises:
            PolicyError: No key given.
            KeyMaterialError: A key file cannot be read or parsed.
            UnsupportedAlgorithmError: A key of an unsupported type.
        """
        from modelsec.signer.keys import load_trusted_key_file

        return cls(
            keys=tuple(load_trusted_key_file(p) for p in paths),
            require_algorithms=frozenset(require),
            allow_remote_code=allow_remote_code,
            limits=limits or Limits(),
        )


def model_uri(path: Path) -> str:
    """The reference a local model directory or file is matched as: `file://<real path>`.

    Resolved by path, before anything is opened: what reads the model matches again from the descriptor it
    opened (`modelsec.verifier.admission.admit_opened`).

    Raises:
        ModelMovedError: A component changed between a link's `lstat` and its `readlink` (renamed or
            exchanged while the path was resolved).
    """
    try:
        return "file://" + os.path.realpath(path)
    except OSError as e:
        raise ModelMovedError(str(path), f"cannot resolve its real path: {e.strerror}") from e


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """`**` matches anything (including `/`), `*` anything but `/`, `?` one character but `/`.

    "Anything" includes a line feed and every other character, for `*` and `**` alike (the regex is compiled
    with DOTALL): a directory name holding a line feed is matched like any other. Patterns themselves may
    not hold control characters (`PolicyModel.match` refuses them).
    """
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class NamespaceRule:
    """Admission rules for the namespaces matching `namespaces` (globs; the first matching rule applies).

    Attributes:
        namespaces: Namespace globs (`fnmatch`).
        no_match: What a model reference that no applicable policy matches gets: `deny`, `warn` or `allow`.
        require_model: A workload here must name at least one model.
    """

    namespaces: tuple[str, ...] = ()
    no_match: str = "deny"
    require_model: bool = False


@dataclass(frozen=True, slots=True)
class _Entry:
    regexes: tuple[re.Pattern[str], ...]
    policy: Policy


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A validated policy file: named policies matched by model reference; no match means deny.

    Which policies decide about a model, and what their outcomes add up to, is
    `modelsec.verifier.admission`'s (every matching policy must pass).

    Attributes:
        entries: The policies in file order.
        source: Where the policy came from (path or `$MODELSEC_POLICY`), for diagnostics.
        digest: Hex SHA-256 of the file bytes that were parsed ("" when built from a mapping): identifies
            this policy version (e.g. in the webhook's cache keys).
        namespace_rules: Admission only: per-namespace `noMatch` and `requireModel` (`rule_for`).
    """

    entries: tuple[_Entry, ...]
    source: str
    digest: str = ""
    namespace_rules: tuple[NamespaceRule, ...] = ()

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The policies in file order."""
        return tuple(e.policy for e in self.entries)

    def matching(self, uri: str, namespace: str | None = None) -> tuple[Policy, ...]:
        """Every policy whose `match` globs cover `uri` and that applies in `namespace` (admission).

        Like policy-controller and Kyverno, the admission webhook requires every one of them to pass; an
        empty result means the reference follows `rule_for(namespace).no_match`. An `oci://` URI is
        compared normalised (`modelsec.registry.reference.normalize_model_uri`), as the patterns are.

        Raises:
            InvalidReferenceError: `uri` is an `oci://` URI that is not a valid reference.
        """
        from modelsec.registry.reference import normalize_model_uri

        uri = normalize_model_uri(uri)
        return tuple(
            e.policy
            for e in self.entries
            if e.policy.applies_in(namespace) and any(r.match(uri) for r in e.regexes)
        )

    def rule_for(self, namespace: str) -> NamespaceRule:
        """The first namespace rule matching `namespace`, else the default rule (`noMatch: deny`)."""
        for rule in self.namespace_rules:
            if any(fnmatch.fnmatchcase(namespace, p) for p in rule.namespaces):
                return rule
        return NamespaceRule()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> PolicySet:
        """Load and validate a YAML or JSON policy file; key paths are relative to its directory.

        Raises:
            PolicyError: Unreadable, larger than 1 MiB, not YAML/JSON, or invalid (the message names the file
                and the field path).
            KeyMaterialError: A listed key, or the watermark keyFile of a `message`, cannot be read or parsed.
        """
        from modelsec.config import read_config

        path = Path(path)
        raw, doc = read_config(path, "policy file")
        parsed = cls.from_mapping(doc, base_dir=path.parent, source=str(path))
        return dataclasses.replace(parsed, digest=hashlib.sha256(raw).hexdigest())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PolicySet:
        """Load the policy file named by `$MODELSEC_POLICY`.

        Raises:
            PolicyError: The variable is unset or the file is invalid.
        """
        env = os.environ if environ is None else environ
        value = env.get(POLICY_ENV)
        if not value:
            raise PolicyError(f"${POLICY_ENV} is not set: point it at a policy file")
        return cls.from_file(Path(value))

    @classmethod
    def from_mapping(cls, doc: object, *, base_dir: Path, source: str) -> PolicySet:
        """Validate a parsed policy document (`modelsec.policy.models.PolicyFileModel`).

        Raises:
            PolicyError: Invalid document (the message names the field path).
            KeyMaterialError: A listed key, or the watermark keyFile of a `message`, cannot be read or parsed.
        """
        from modelsec.config import validate
        from modelsec.policy.models import PolicyFileModel

        model = validate(PolicyFileModel, doc, source)
        entries = []
        names: set[str] = set()
        for i, item in enumerate(model.policies):
            where = f"{source}: policies[{i}]"
            if item.name in names:
                raise PolicyError(f"{where}.name {item.name!r} is used twice")
            names.add(item.name)
            entries.append(_Entry(tuple(_glob_regex(p) for p in item.match), _policy(item, where, base_dir)))
        rules = tuple(
            NamespaceRule(tuple(r.namespaces), r.no_match, r.require_model) for r in model.namespace_rules
        )
        return cls(tuple(entries), source, namespace_rules=rules)


def _policy(item: PolicyModel, where: str, base_dir: Path) -> Policy:
    """A validated policy entry as a `Policy`: keys loaded, paths resolved against `base_dir`."""
    from modelsec.policy import trust
    from modelsec.policy.authorities import authority_from_model
    from modelsec.policy.requirements import (
        condition_requirements,
        load_receipt_requirement,
        robustness_requirement,
        watermark_requirement,
    )

    if not item.keys and not item.authorities:
        raise PolicyError(f"{where}: trusts nothing: give at least one of keys and authorities")
    keys = tuple(_load_key(k, f"{where}.keys[{j}]", base_dir) for j, k in enumerate(item.keys))
    tsas = trust.timestamp_authorities(item.timestamp_authorities, where, base_dir)
    policy = Policy(
        keys=keys,
        require_algorithms=frozenset(item.require_algorithms),
        allow_remote_code=item.allow_remote_code,
        refuse_pickle=item.refuse_pickle,
        check_hashes=frozenset(item.check_hashes),
        limits=Limits(**{k: v for k, v in item.limits.model_dump().items() if v is not None}),
        name=item.name,
        robustness=robustness_requirement(item.attestations.robustness),
        watermark=watermark_requirement(
            item.attestations.watermark, f"{where}.attestations.watermark", base_dir
        ),
        attestation_store=_store(item, where, base_dir),
        require_digest=item.require_digest,
        authorities=tuple(
            authority_from_model(a, f"{where}.authorities[{j}]", base_dir)
            for j, a in enumerate(item.authorities)
        ),
        mode=item.mode,
        namespaces=tuple(item.namespaces),
        timestamp_authorities=tsas,
        require_timestamp=item.require_timestamp,
        key_windows=trust.key_windows(keys, item.keys),
        guard_policy=item.guard_policy,
        load_receipt=load_receipt_requirement(item.load_receipt, f"{where}.loadReceipt", base_dir, tsas),
    )
    if item.attestations.conditions:
        signers = frozenset([k.name for k in policy.keys] + [a.name for a in policy.authorities])
        policy = dataclasses.replace(
            policy,
            conditions=condition_requirements(item.attestations.conditions, f"{where}.attestations", signers),
        )
    # Each policy verifies with its own keys and authorities only: a requirement they cannot meet would refuse
    # every model at verification time; say so when the file is loaded instead.
    if unmet := sorted(a.value for a in policy.require_algorithms if not policy.can_sign(a)):
        raise PolicyError(
            f"{where}.requireAlgorithms: {', '.join(unmet)} can never be met: no key or authority of policy "
            f"{item.name!r} makes such weights signatures"
        )
    return policy


def _store(item: PolicyModel, where: str, base_dir: Path) -> str | None:
    """`attestationStore` (a path or store URI) or its older name `attestationDir` (a path).

    A relative path (plain, or after `file://` / `sqlite://`) is resolved against the policy file's
    directory; the scheme itself is checked when the store is opened (`modelsec.verifier.stores`).
    """
    if item.attestation_store is not None and item.attestation_dir is not None:
        raise PolicyError(f"{where}: give attestationStore or attestationDir (its older name), not both")
    name = "attestationStore" if item.attestation_store is not None else "attestationDir"
    store = item.attestation_store if item.attestation_store is not None else item.attestation_dir
    if store is None:
        return None
    scheme, sep, target = store.partition("://")
    if not sep:
        return str(base_dir / store)
    if name == "attestationDir":
        raise PolicyError(f"{where}.attestationDir must be a path (use attestationStore for a store URI)")
    if not target:
        raise PolicyError(f"{where}.attestationStore {store!r} names no directory, file or server")
    if scheme in ("file", "sqlite"):  # the schemes whose target is a local path
        return f"{scheme}://{base_dir / target}"
    return store


def _load_key(item: str | KeyRefModel, where: str, base_dir: Path) -> TrustedKey:
    if isinstance(item, str):  # the shorthand: a path, every role
        path, name, roles = item, None, frozenset[str]()
    else:
        path, name, roles = item.path, item.name, frozenset[str](item.roles)
    full = Path(path) if os.path.isabs(path) else base_dir / path
    from modelsec.signer.keys import load_trusted_key_file

    try:
        return load_trusted_key_file(full, name=name or Path(path).name, roles=roles)
    except Error as e:
        raise type(e)(f"{where}: {e.diagnostics()}") from e
