"""What a policy requires of attestations: robustness-gate, watermark and CEL condition requirements.

Loaded by `modelsec.policy` while it converts a policy file (which re-exports both requirement types); checked
by `modelsec.verifier.attestations`. A watermark `message` is committed to here, under the policy's `keyFile`,
so the verifier compares commitments and the key itself never leaves this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from modelsec.errors import Error, PolicyError
from modelsec.policy.trust import TimestampAuthority
from modelsec.signer.keys import TrustedKey, load_trusted_key_file

if TYPE_CHECKING:
    from modelsec.policy.cel import CompiledCondition
    from modelsec.policy.models import ConditionModel, LoadReceiptModel, RobustnessModel, WatermarkModel

__all__ = [
    "ConditionRequirement",
    "Lineage",
    "LoadReceiptRequirement",
    "RobustnessRequirement",
    "WatermarkRequirement",
    "condition_requirements",
    "load_receipt_requirement",
    "robustness_requirement",
    "watermark_requirement",
]


@dataclass(frozen=True, slots=True)
class RobustnessRequirement:
    """What a robustness-gate attestation must show (predicate `https://modelsec.dev/robustness-gate/v1`).

    Attributes:
        attack: The attack name the gate must have run (`pgd-linf`).
        min_eps: Smallest accepted perturbation budget ε (input units, L∞).
        min_robust_accuracy: Threshold on robust accuracy (fraction in [0, 1]).
        rule: `point` (the measured accuracy) or `strict` (the lower end of its 95% Wilson interval).
        min_samples: Fewest evaluated examples accepted.
        max_age_seconds: Oldest accepted `finishedAt`, or None for no freshness rule.
        min_steps: Fewest PGD iterations per restart accepted (`parameters.steps`).
        min_restarts: Fewest PGD random restarts accepted (`parameters.restarts`).
        datasets: Accepted evaluation-set digests (hex SHA-256 of `dataset.digest.sha256`); empty: any.
        require_server_run: Only gates a modelsec server ran for a requester (`runBy`) count; trust, for
            the `gate` role, only keys that modelsec servers hold (see
            `modelsec.attestations.predicates.run_by`).
    """

    attack: str = "pgd-linf"
    min_eps: float = 0.0
    min_robust_accuracy: float = 0.0
    rule: str = "point"
    min_samples: int = 1
    max_age_seconds: float | None = None
    min_steps: int = 1
    min_restarts: int = 1
    datasets: frozenset[str] = frozenset()
    require_server_run: bool = False


@dataclass(frozen=True, slots=True)
class WatermarkRequirement:
    """What a watermark attestation must show (predicate `https://modelsec.dev/watermark/v1`).

    Attributes:
        min_confidence: Lowest accepted detection confidence recorded at embed time (default 0.92).
        max_false_positive: Highest accepted false-positive probability at embed time (default 1e-9).
        key_file: The owner's watermark key file, for nodes that hold it. It is read (when the policy is
            loaded) only to compute `message_commitment`; the mark is not re-detected in the weights: the
            signed embed-time detection is trusted.
        max_fidelity_loss: Highest accepted fidelity loss measured at embedding (`fidelity.value`, in the
            probe's own metric); an attestation without a fidelity measurement is refused (None: not
            required).
        fidelity_metric: The metric that measurement must be in (`fidelity.metric`, compared exactly): a
            loss in another metric is not comparable with `max_fidelity_loss`, so such an attestation, or
            one without a measurement, is refused (None: any metric).
        require_server_run: Only embeds a modelsec server performed for a requester (`runBy`) count.
        message_commitment: The `messageCommitment.value` an attestation must carry (hex): the policy's
            `message`, encoded as `modelsec watermark embed -m` encodes it, committed under `key_file`'s key
            (`WatermarkKey.message_commitment`); an attestation of another message or key is ignored (None:
            any message).
    """

    min_confidence: float = 0.92
    max_false_positive: float = 1e-9
    key_file: Path | None = None
    max_fidelity_loss: float | None = None
    require_server_run: bool = False
    message_commitment: str | None = None
    fidelity_metric: str | None = None


def robustness_requirement(r: RobustnessModel | None) -> RobustnessRequirement | None:
    """A validated `attestations.robustness` section as a requirement (None: not required)."""
    if r is None:
        return None
    return RobustnessRequirement(
        attack=r.attack,
        min_eps=r.min_eps,
        min_robust_accuracy=r.min_robust_accuracy,
        rule=r.rule,
        min_samples=r.min_samples,
        max_age_seconds=r.max_age,
        min_steps=r.min_steps,
        min_restarts=r.min_restarts,
        datasets=frozenset(r.dataset_digests or ()),
        require_server_run=r.require_server_run,
    )


def watermark_requirement(
    w: WatermarkModel | None, where: str, base_dir: Path
) -> WatermarkRequirement | None:
    """A validated `attestations.watermark` section as a requirement (None: not required).

    Args:
        w: The section.
        where: Its field path in the policy file, for errors.
        base_dir: The policy file's directory; a relative `keyFile` is resolved against it.

    Returns:
        The requirement; with `message`, its `message_commitment` under the key of `keyFile`.

    Raises:
        PolicyError: `message` is invalid hex (`hex:`/`0x`) or encodes no bytes.
        KeyMaterialError: With `message`, the `keyFile` cannot be read or is not a watermark key.
    """
    if w is None or not w.required:
        return None
    key_file = (base_dir / w.key_file) if w.key_file else None
    commitment = None
    if w.message is not None and key_file is not None:  # the model refuses a message without keyFile
        from modelsec.signer.watermark_keys import load_key_file, parse_message  # only with a message

        field = "message"
        try:
            message = parse_message(w.message)
            field = "keyFile"
            commitment = load_key_file(key_file).message_commitment(message)
        except Error as e:
            raise type(e)(f"{where}.{field}: {e.diagnostics()}") from e
    return WatermarkRequirement(
        min_confidence=w.min_confidence,
        max_false_positive=w.max_false_positive,
        key_file=key_file,
        max_fidelity_loss=w.max_fidelity_loss,
        require_server_run=w.require_server_run,
        message_commitment=commitment,
        fidelity_metric=w.fidelity_metric,
    )


@dataclass(frozen=True, slots=True)
class Lineage:
    """Base-model lineage a model must have (`lineage` of a condition).

    Attributes:
        roots: Approved base-model root digests (hex SHA-256, without `sha256:`).
        max_depth: Most provenance links followed from the model to one of `roots` (the model's own
            provenance is the first link).
    """

    roots: frozenset[str]
    max_depth: int = 3


@dataclass(frozen=True, slots=True)
class ConditionRequirement:
    """A statement of `predicate_type` about the model, signed by one of `signers`, whose condition holds.

    Checked by `modelsec.verifier.conditions`; the statement is verified as every attestation is (signature
    by a policy key or authority, subject = the model root digest, signature time in its key's window).

    Attributes:
        name: Names the requirement in verdicts (`condition NAME: ...`).
        predicate_type: The predicateType URI of the statement.
        signers: Names of the policy keys and authorities that may sign it (empty: any of them); a registered
            predicate type (gate, watermark) also needs its role.
        condition: The compiled CEL condition, or None (presence and signature suffice).
        lineage: Base-model lineage to follow through the provenance, or None.
        where: The policy field it was loaded from (for diagnostics).
    """

    name: str
    predicate_type: str
    signers: frozenset[str] = frozenset()
    condition: CompiledCondition | None = None
    lineage: Lineage | None = None
    where: str = ""


def condition_requirements(
    items: Sequence[ConditionModel], where: str, known_signers: frozenset[str]
) -> tuple[ConditionRequirement, ...]:
    """Validated `attestations.conditions` as requirements, each CEL condition compiled and bound-checked.

    Raises:
        PolicyError: `{where}.conditions[i].condition: ...` (malformed, too long, over a syntax-tree limit);
            `{where}.conditions[i].signers: ...` names no key or authority of the policy; two conditions share
            a name.
    """
    out: list[ConditionRequirement] = []
    for i, c in enumerate(items):
        at = f"{where}.conditions[{i}]"
        unknown = sorted(set(c.signers) - known_signers)
        if unknown:
            raise PolicyError(f"{at}.signers: {unknown} name no key or authority of the policy")
        if any(r.name == c.name for r in out):
            raise PolicyError(f"{at}.name: {c.name!r} is used twice")
        compiled = None
        if c.condition is not None:
            from modelsec.policy.cel import compile_condition  # only policies with CEL conditions need it

            compiled = compile_condition(c.condition, where=at)
        lineage = None
        if c.lineage is not None:
            lineage = Lineage(
                frozenset(d.removeprefix("sha256:") for d in c.lineage.from_), c.lineage.max_depth
            )
        out.append(
            ConditionRequirement(c.name, c.predicate_type, frozenset(c.signers), compiled, lineage, at)
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LoadReceiptRequirement:
    """The policy's `loadReceipt`: a node emits a TPM-quoted receipt of each verified load (issue 33).

    Used by the node (`modelsec.verifier.load_model`, the runtime guard) to emit, and by `modelsec receipts
    verify` to check (`modelsec.verifier.receipts`).

    Attributes:
        required: A load whose receipt cannot be emitted (TPM unreachable) fails closed; when False such a
            load goes on with a `ReceiptWarning`.
        attestation_key_handle: The persistent handle of the node's attestation key.
        pcrs: PCR index -> its expected SHA-256 bank value: what the quote covers and must show.
        nodes: The registered nodes' attestation keys (`TrustedKey.name` is the node's name).
        max_age_seconds: The oldest receipt `receipts verify` accepts.
        store: Where receipts are written: a directory (`Path`), an `oci://REGISTRY/REPOSITORY` URI (referrers
            of the model's manifest), or None (emitted and quoted, not kept).
        timestamp_url: The RFC 3161 TSA the node timestamps each quote's signature at; when set, a receipt
            without a timestamp trusted through `timestamp_authorities` is refused.
        timestamp_authorities: The policy's `timestampAuthorities` (the same TSAs that date signatures).
        window_seconds: How far the TSA's time, or the time the TPM clock implies from an earlier quote of
            the same node, may lie from the receipt's `loadedAt`.
    """

    required: bool
    attestation_key_handle: int
    # Left out of the hash (not of equality) so that a policy holding it stays hashable: the runtime guard
    # caches one verified snapshot per (model, policy).
    pcrs: dict[int, bytes] = field(hash=False)
    nodes: tuple[TrustedKey, ...]
    max_age_seconds: float
    store: Path | str | None
    timestamp_url: str | None = None
    timestamp_authorities: tuple[TimestampAuthority, ...] = ()
    window_seconds: float = 120.0


def load_receipt_requirement(
    model: LoadReceiptModel | None,
    where: str,
    base_dir: Path,
    timestamp_authorities: tuple[TimestampAuthority, ...] = (),
) -> LoadReceiptRequirement | None:
    """The `loadReceipt` of a policy entry, node keys loaded and the store resolved against `base_dir`.

    Raises:
        PolicyError: Two nodes share a name; `timestampUrl` is not http(s); `timestampUrl` is set but the
            entry names no `timestampAuthorities` (its timestamps could never be trusted).
        KeyMaterialError: A node key file cannot be read or is not a public key (the message names it).
    """
    if model is None:
        return None
    nodes = []
    for j, n in enumerate(model.nodes):
        full = Path(n.key) if Path(n.key).is_absolute() else base_dir / n.key
        try:
            nodes.append(load_trusted_key_file(full, name=n.name, roles=frozenset({"node"})))
        except Error as e:
            raise type(e)(f"{where}.nodes[{j}].key: {e.diagnostics()}") from e
    if len({n.name for n in nodes}) != len(nodes):
        raise PolicyError(f"{where}.nodes: a node name is used twice")
    store: Path | str | None = None
    if model.store is not None and model.store.startswith("oci://"):
        store = model.store
    elif model.store is not None:
        store = Path(model.store) if Path(model.store).is_absolute() else base_dir / model.store
    if model.timestamp_url is not None:
        if not model.timestamp_url.lower().startswith(("http://", "https://")):
            raise PolicyError(f"{where}.timestampUrl: must be an http:// or https:// URL")
        if not timestamp_authorities:
            raise PolicyError(
                f"{where}.timestampUrl: the entry names no timestampAuthorities to trust its timestamps"
            )
    return LoadReceiptRequirement(
        required=model.required,
        attestation_key_handle=int(model.attestation_key_handle, 16),
        pcrs={int(k): bytes.fromhex(v) for k, v in model.pcrs.items()},
        nodes=tuple(nodes),
        max_age_seconds=model.max_age,
        store=store,
        timestamp_url=model.timestamp_url,
        timestamp_authorities=timestamp_authorities,
        window_seconds=model.window,
    )
