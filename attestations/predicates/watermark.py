"""The watermark predicate (`https://modelsec.dev/watermark/v1`): parse, build and check it.

The one home of the watermark predicate's format: the producer (`modelsec.watermark.attestation`), the
verifier (`modelsec.verifier.attestations`), the detector's hints and the service all go through this
module, so the fields each of them requires cannot drift apart again.

* `build_watermark_predicate`: the predicate of an embedding: `scheme` (name, sources, key schedule),
  `parameters` (all of `WatermarkParams`, the density, code and message lengths, kappa), `keyCommitment` and
  `messageCommitment` (keyed HMAC-SHA256 values: never the key, never the message), `carriers` (tensor
  names, dtypes, shapes, carrier counts), `embedding` (relative changes, strengths), `fidelity` (when
  measured: probe set digest, metric, value, budget; `modelsec.watermark.fidelity`) and `detection` (bit
  matches, bit error rate, false-positive probability and its log10, confidence, minimum margin,
  thresholds) measured on the written weights, plus `embeddedAt` (RFC 3339, UTC) and the tool version;
  `watermark_statement` wraps it in the unsigned statement.
* `check_watermark_predicate`: the type and range of every number that is present (before any arithmetic).
* `parse_watermark_predicate`: also the fields every consumer requires, typed: `scheme.name`, the objects
  `parameters` and `carriers`, `keyCommitment.value` and `messageCommitment.value` (strings), and the
  embed-time `detection` (`detected`, `confidence`, `falsePositiveProbability`); `fidelity` is optional, but
  when present its `metric`, `value`, `budget` and `probeSetDigest` are required.
* `parse_recorded_parameters`: what a detector reads back (scheme name, every parameter, carrier tensors,
  key commitment).

`runBy` (`modelsec.attestations.predicates.run_by`) records the server and the requester of an embed a
modelsec server performed (EmbedWatermark); `check_watermark_run` checks it against a policy that requires
server-run evidence. What a policy accepts otherwise (detected at embed time, confidence, false-positive
probability) is decided by `modelsec.verifier.attestations`; which schemes a detector can run is decided by
`modelsec.watermark`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Protocol

from modelsec.attestations._numbers import (
    BIG_REAL,
    COUNT,
    UNIT,
    Range,
    check_fields,
    check_number,
    lookup,
    parse_rfc3339,
)
from modelsec.attestations._numbers import integer as _int
from modelsec.attestations._numbers import real as _real
from modelsec.attestations.predicates.run_by import RUN_BY_FIELD, RunBy, parse_run_by
from modelsec.attestations.statement import Statement, Subject
from modelsec.errors import AttestationError, MalformedArtifactError
from modelsec.limits import Limits

__all__ = [
    "WATERMARK_PREDICATE_TYPE",
    "CarrierTensor",
    "EmbeddingRecord",
    "Fidelity",
    "RecordedParameters",
    "WatermarkPredicate",
    "build_watermark_predicate",
    "check_watermark_predicate",
    "check_watermark_run",
    "parse_recorded_parameters",
    "parse_watermark_predicate",
    "parse_watermark_statement",
    "watermark_statement",
]

WATERMARK_PREDICATE_TYPE = "https://modelsec.dev/watermark/v1"

_WATERMARK_FIELDS: dict[str, Range] = {
    # The ranges WatermarkParams accepts, widened only where it has no upper bound of its own.
    "parameters.kappa": _real(0.0, 100.0),
    "parameters.pilotBits": _int(0, 4096),
    "parameters.blockSize": _int(0, 4096),
    "parameters.targetCarriersLog2": _int(0, 64),
    "parameters.densityLog2": _int(0, 64, nullable=True),
    "parameters.minTensorElements": _int(0, COUNT),
    "parameters.maxRelativeChange": UNIT,
    "parameters.maxMessageBits": _int(0, 65536),
    "parameters.minCarriersPerBit": _int(0, COUNT),
    "parameters.codeBits": _int(0, COUNT),
    # Optional: absent before the coded bits got their own margin (issue 30): every bit at kappa.
    "parameters.codeMargin": _real(0.0, 1.0),
    "parameters.messageBits": _int(0, 65536),
    "carriers.count": _int(0, COUNT),
    "carriers.grid.elements": _int(0, COUNT),
    "carriers.grid.elementsPerBit": _int(0, COUNT),
    "embedding.maxRelativeChange": _real(0.0, BIG_REAL),
    "embedding.meanRelativeChange": _real(0.0, BIG_REAL),
    "embedding.relativeL2Change": _real(0.0, BIG_REAL),
    "embedding.strength.min": _real(0.0, BIG_REAL),
    "embedding.strength.median": _real(0.0, BIG_REAL),
    "embedding.strength.max": _real(0.0, BIG_REAL),
    "detection.bits": _int(0, COUNT),
    "detection.bitMatches": _int(0, COUNT),
    "detection.bitErrorRate": UNIT,
    "detection.falsePositiveProbability": UNIT,
    "detection.log10FalsePositiveProbability": _real(-BIG_REAL, 0.0, nullable=True),
    "detection.confidence": _real(-1.0, 1.0),
    "detection.tests": _int(0, COUNT),
    "detection.pilotBits": _int(0, 4096),
    "detection.pilotMatches": _int(0, 4096),
    "detection.messageBits": _int(0, 65536, nullable=True),
    "detection.messageMatches": _int(0, 65536, nullable=True),
    "detection.messageBitErrorRate": _real(0.0, 1.0, nullable=True),
    "detection.codeBitErrorRate": _real(0.0, 1.0, nullable=True),
    "detection.minMargin": _real(-BIG_REAL, BIG_REAL, nullable=True),
    "detection.medianMargin": _real(-BIG_REAL, BIG_REAL, nullable=True),
    "detection.densityLog2": _int(0, 64, nullable=True),
    "detection.carriers": _int(0, COUNT),
    "detection.carrierTensors": _int(0, COUNT),
    "detection.thresholds.minConfidence": UNIT,
    "detection.thresholds.maxFalsePositiveProbability": UNIT,
    # Fidelity measured at embedding (issue 18); optional: older predicates carry none.
    "fidelity.value": UNIT,
    "fidelity.budget": UNIT,
    "fidelity.probes": _int(0, COUNT),
    "fidelity.logitDrift": _real(0.0, BIG_REAL),
}


def check_watermark_predicate(predicate: Mapping[str, Any], *, what: str) -> None:
    """Check the type and range of every number in a watermark predicate (see the module docstring).

    Args:
        predicate: The `https://modelsec.dev/watermark/v1` predicate.
        what: Names the bundle or request in errors.

    Raises:
        MalformedArtifactError: A number has the wrong type or is out of range, `embeddedAt` is present
            and not an RFC 3339 time in range, or `runBy` is present and malformed.
    """
    check_fields(predicate, _WATERMARK_FIELDS, what)
    parse_run_by(predicate, what=what)
    tensors = lookup(predicate, "carriers.tensors")[1]
    if isinstance(tensors, list):
        for i, entry in enumerate(tensors):
            if isinstance(entry, Mapping) and "carriers" in entry:
                check_number(entry["carriers"], _int(0, COUNT), f"carriers.tensors[{i}].carriers", what)
    if "embeddedAt" in predicate:
        parse_rfc3339(predicate["embeddedAt"], field="embeddedAt", what=what)


_REQUIRED_OBJECTS = ("scheme", "parameters", "keyCommitment", "messageCommitment", "carriers", "detection")
_PARAMETERS = {  # predicate name -> RecordedParameters field; all integers except the two floats
    "kappa": "kappa",
    "pilotBits": "pilot_bits",
    "blockSize": "block_size",
    "targetCarriersLog2": "target_carriers_log2",
    "densityLog2": "density_log2",
    "minTensorElements": "min_tensor_elements",
    "maxRelativeChange": "max_relative_change",
    "maxMessageBits": "max_message_bits",
    "minCarriersPerBit": "min_carriers_per_bit",
    "messageBits": "message_bits",
}
_FLOATS = {"kappa", "maxRelativeChange"}


@dataclass(frozen=True, slots=True)
class WatermarkPredicate:
    """A parsed watermark predicate: the fields a verifier reads, typed, and the whole predicate.

    Parsed is not trusted: the signature and subject are checked by the verifier, the values against a
    policy there too.

    Attributes:
        scheme: The scheme name (`scheme.name`, e.g. `modelsec-ss-mult/v1`).
        key_commitment: HMAC-SHA256 commitment to the watermark key (hex), never the key.
        message_commitment: Commitment to the message, never the message.
        detected: Whether the embed-time detection found the mark and (where recorded) read its message
            back exactly (`detection.messageMatched`).
        confidence: The embed-time detection confidence, in [-1, 1].
        false_positive_probability: Probability that an unmarked model scores as high, in [0, 1].
        embedded_at: When the mark was embedded (UTC), or None when not recorded.
        predicate: The whole predicate, read-only.
        fidelity: The measured fidelity (`fidelity`: metric, value, budget, probe set digest), or None when
            the predicate records none.
        run_by: Who embedded the mark, when a modelsec server did (`runBy`), else None.
    """

    scheme: str
    key_commitment: str
    message_commitment: str
    detected: bool
    confidence: float
    false_positive_probability: float
    embedded_at: datetime | None
    predicate: Mapping[str, Any]
    fidelity: Fidelity | None = None
    run_by: RunBy | None = None


@dataclass(frozen=True, slots=True)
class Fidelity:
    """The fidelity measured at embedding (`fidelity` in the predicate).

    Attributes:
        metric: What `value` measures (e.g. `1-min-cosine(mean-pooled last hidden state)`).
        value: The measured loss, in [0, 1].
        budget: The budget the embedder held it to, in [0, 1].
        probe_set_digest: `sha256:<hex>` of the probe set.
    """

    metric: str
    value: float
    budget: float
    probe_set_digest: str


def _fidelity(predicate: Mapping[str, Any], what: str) -> Fidelity | None:
    if "fidelity" not in predicate:
        return None
    obj = _object(predicate, "fidelity", what)
    return Fidelity(
        metric=_string(obj, "metric", "fidelity.metric", what),
        value=_finite(obj, "value", "fidelity.value", what),
        budget=_finite(obj, "budget", "fidelity.budget", what),
        probe_set_digest=_string(obj, "probeSetDigest", "fidelity.probeSetDigest", what),
    )


def _object(predicate: Mapping[str, Any], name: str, what: str) -> Mapping[str, Any]:
    value = predicate.get(name)
    if not isinstance(value, Mapping):
        raise AttestationError(f"{what}: watermark predicate lacks the object {name!r}")
    return value


def _string(obj: Mapping[str, Any], name: str, path: str, what: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise AttestationError(f"{what}: watermark predicate {path} is missing or not a string")
    return value


def _finite(obj: Mapping[str, Any], name: str, path: str, what: str) -> float:
    if name not in obj:
        raise AttestationError(f"{what}: predicate lacks {path}")
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AttestationError(f"{what}: predicate {path} is not a number")
    return float(value)


def parse_watermark_predicate(predicate: Mapping[str, Any], *, what: str) -> WatermarkPredicate:
    """Parse a watermark predicate strictly (numbers first, then the fields every consumer requires).

    Args:
        predicate: The `https://modelsec.dev/watermark/v1` predicate.
        what: Names the bundle in errors.

    Returns:
        The typed predicate (not yet checked against any policy).

    Raises:
        MalformedArtifactError: A number has the wrong type or is out of its field's range, or `embeddedAt`
            is not an RFC 3339 time in range.
        AttestationError: A required object or field (see the module docstring) is missing or mistyped.
    """
    check_watermark_predicate(predicate, what=what)  # every number in range before any arithmetic
    objects = {name: _object(predicate, name, what) for name in _REQUIRED_OBJECTS}
    detection = objects["detection"]
    if not isinstance(detection.get("detected"), bool):
        raise AttestationError(f"{what}: predicate lacks detection.detected (true or false)")
    matched = detection.get("messageMatched")
    if matched is not None and not isinstance(matched, bool):
        raise AttestationError(f"{what}: detection.messageMatched must be true, false or null")
    embedded = predicate.get("embeddedAt")
    return WatermarkPredicate(
        scheme=_string(objects["scheme"], "name", "scheme.name", what),
        key_commitment=_string(objects["keyCommitment"], "value", "keyCommitment.value", what),
        message_commitment=_string(objects["messageCommitment"], "value", "messageCommitment.value", what),
        # Since presence is decided on the pilot bits alone, a mark whose message did not read back exactly
        # at embed time records messageMatched false: it does not vouch for the committed message.
        detected=detection["detected"] and matched is not False,
        confidence=_finite(detection, "confidence", "detection.confidence", what),
        false_positive_probability=_finite(
            detection, "falsePositiveProbability", "detection.falsePositiveProbability", what
        ),
        embedded_at=None if embedded is None else parse_rfc3339(embedded, field="embeddedAt", what=what),
        predicate=predicate,
        fidelity=_fidelity(predicate, what),
        run_by=parse_run_by(predicate, what=what),
    )


def parse_watermark_statement(
    statement: Statement, *, what: str, limits: Limits | None = None
) -> WatermarkPredicate:
    """`parse_watermark_predicate` of a statement's predicate (the parser the predicate registry holds).

    Args:
        statement: A statement whose predicateType is `https://modelsec.dev/watermark/v1`.
        what: Names the bundle in errors.
        limits: Not needed by this predicate (every parser of the registry takes them).

    Raises:
        MalformedArtifactError: As `parse_watermark_predicate`.
        AttestationError: As `parse_watermark_predicate`.
    """
    return parse_watermark_predicate(statement.predicate, what=what)


def check_watermark_run(pred: WatermarkPredicate, *, require_server_run: bool, what: str) -> str:
    """Check who embedded a parsed watermark against a policy's `requireServerRun`.

    Whether `runBy` is true is a matter of which key signed it (see
    `modelsec.attestations.predicates.run_by`).

    Returns:
        A summary (empty when nothing is required).

    Raises:
        AttestationError: `require_server_run` is set and no modelsec server recorded the embed.
    """
    if not require_server_run:
        return ""
    if pred.run_by is None:
        raise AttestationError(
            f"{what}: the watermark records no server run (runBy); the policy requires server-run evidence"
        )
    return f"embedded by {pred.run_by.server} for {pred.run_by.requester}"


@dataclass(frozen=True, slots=True)
class RecordedParameters:
    """What a detector reads back from a watermark predicate (parameters only; nothing here is evidence).

    Attributes:
        scheme: The scheme that embedded the mark; a detector runs only its own scheme.
        kappa: Detection threshold factor.
        pilot_bits: Pilot bits, block_size: code block size, target_carriers_log2 / density_log2: carrier
            density, min_tensor_elements: smallest carrier tensor, max_relative_change: embedding bound,
            max_message_bits / min_carriers_per_bit: message limits (all as `WatermarkParams`).
        message_bits: The message length in bits.
        tensors: The attested carrier tensor names.
        key_commitment: The attested key commitment.
        carrier_set: Which eligible tensors carry bits (`carrierSet`; `all` when not recorded).
        message_code: The message's error-correcting code (`messageCode`; `none` when not recorded: marks
            made before error correction).
        code_margin: The coded message bits' margin as a fraction of `kappa` (`codeMargin`; 1.0 when not
            recorded: marks made before it embedded every bit at `kappa`). For the record: detection does not
            use it.
    """

    scheme: str
    kappa: float
    pilot_bits: int
    block_size: int
    target_carriers_log2: int
    density_log2: int
    min_tensor_elements: int
    max_relative_change: float
    max_message_bits: int
    min_carriers_per_bit: int
    message_bits: int
    tensors: tuple[str, ...]
    key_commitment: str
    carrier_set: str = "all"
    message_code: str = "none"
    code_margin: float = 1.0


def _parameter(parameters: Mapping[str, Any], name: str, what: str) -> int | float:
    value = parameters.get(name)
    ok = isinstance(value, int | float) if name in _FLOATS else isinstance(value, int)
    if isinstance(value, bool) or not ok:
        raise MalformedArtifactError(f"{what}: watermark predicate lacks or mistypes parameters.{name}")
    return float(value) if name in _FLOATS else int(value)  # type: ignore[arg-type]


def parse_recorded_parameters(predicate: Mapping[str, Any], *, what: str) -> RecordedParameters:
    """Read the detection parameters recorded in a watermark predicate (its signature is not checked).

    Args:
        predicate: The `https://modelsec.dev/watermark/v1` predicate.
        what: Names the attestation in errors.

    Returns:
        The recorded parameters.

    Raises:
        MalformedArtifactError: `scheme.name`, a parameter, a carrier tensor name or `keyCommitment.value`
            is missing or mistyped, or a number is out of its field's range.
    """
    check_watermark_predicate(predicate, what=what)  # numbers in range before float() or any allocation
    try:
        scheme = _string(_object(predicate, "scheme", what), "name", "scheme.name", what)
        commitment = _string(_object(predicate, "keyCommitment", what), "value", "keyCommitment.value", what)
        parameters = _object(predicate, "parameters", what)
    except AttestationError as e:
        raise MalformedArtifactError(e.diagnostics()) from None
    values = {field: _parameter(parameters, name, what) for name, field in _PARAMETERS.items()}
    tensors = lookup(predicate, "carriers.tensors")[1]
    if not isinstance(tensors, list) or not all(
        isinstance(t, Mapping) and isinstance(t.get("name"), str) for t in tensors
    ):
        raise MalformedArtifactError(f"{what}: watermark predicate carriers.tensors must list named tensors")
    carrier_set = parameters.get("carrierSet", "all")  # absent before issue 18: all eligible tensors
    if not isinstance(carrier_set, str):
        raise MalformedArtifactError(f"{what}: watermark predicate parameters.carrierSet is not a string")
    message_code = parameters.get("messageCode", "none")  # absent before error correction (issue 30)
    if not isinstance(message_code, str):
        raise MalformedArtifactError(f"{what}: watermark predicate parameters.messageCode is not a string")
    code_margin = parameters.get("codeMargin", 1.0)  # absent before the code margin: every bit at kappa
    if isinstance(code_margin, bool) or not isinstance(code_margin, int | float):
        raise MalformedArtifactError(f"{what}: watermark predicate parameters.codeMargin is not a number")
    return RecordedParameters(
        carrier_set=carrier_set,
        message_code=message_code,
        code_margin=float(code_margin),
        scheme=scheme,
        tensors=tuple(t["name"] for t in tensors),
        key_commitment=commitment,
        **values,  # type: ignore[arg-type]
    )


class _JsonRecord(Protocol):
    def to_json(self) -> Mapping[str, Any]: ...


class CarrierTensor(Protocol):
    """One carrier tensor of an embedding (`modelsec.watermark.TensorReport` is one)."""

    @property
    def name(self) -> str:
        """Tensor name."""
        ...

    @property
    def dtype(self) -> str:
        """The safetensors dtype."""
        ...

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape."""
        ...

    @property
    def carriers(self) -> int:
        """Carrier elements in it."""
        ...


class EmbeddingRecord(Protocol):
    """What the predicate records of an embedding (`modelsec.watermark.EmbedResult` is one).

    The attributes are `EmbedResult`'s: `params`, `detection` and `fidelity` give their recorded JSON form
    (`to_json()`); see `modelsec.watermark.embed.EmbedResult` for the units.
    """

    @property
    def params(self) -> _JsonRecord:
        """Scheme parameters."""
        ...

    @property
    def density_log2(self) -> int:
        """Carrier density exponent used."""
        ...

    @property
    def message_bits(self) -> int:
        """Message length in bits."""
        ...

    @property
    def code_bits(self) -> int:
        """Pilot plus message bits."""
        ...

    @property
    def carriers(self) -> int:
        """Carrier elements."""
        ...

    @property
    def tensors(self) -> Sequence[CarrierTensor]:
        """The carrier tensors."""
        ...

    @property
    def max_relative_change(self) -> float:
        """Largest relative weight change."""
        ...

    @property
    def mean_relative_change(self) -> float:
        """Mean relative change over the carriers."""
        ...

    @property
    def relative_l2_change(self) -> float:
        """Relative L2 change over the eligible tensors."""
        ...

    @property
    def strength_min(self) -> float:
        """Smallest per-bit strength."""
        ...

    @property
    def strength_median(self) -> float:
        """Median per-bit strength."""
        ...

    @property
    def strength_max(self) -> float:
        """Largest per-bit strength."""
        ...

    @property
    def detection(self) -> _JsonRecord:
        """Detection on the written weights."""
        ...

    @property
    def key_commitment(self) -> str:
        """Commitment to the watermark key."""
        ...

    @property
    def message_commitment(self) -> str:
        """Commitment to the message."""
        ...

    @property
    def fidelity(self) -> _JsonRecord | None:
        """The measured fidelity, or None when not measured."""
        ...

    @property
    def grid_mark(self) -> _JsonRecord | None:
        """The grid mark in tensors on a quantisation grid (issue 30 item 5), or None when there is none."""
        ...


def build_watermark_predicate(
    record: EmbeddingRecord,
    *,
    scheme: Mapping[str, Any],
    tool_version: str,
    embedded_at: datetime | None = None,
) -> dict[str, Any]:
    """The watermark predicate of an embedding: its parameters, commitments, carriers and embed-time results.

    Holds no key material and no message: only their keyed commitments (`keyCommitment`,
    `messageCommitment`); the decoded message the detection read back (`decodedMessageHex`) is left out.
    Not checked here (`watermark_statement` checks it before anything is signed).

    Args:
        record: The embedding (`modelsec.watermark.EmbedResult`).
        scheme: The scheme's description (`scheme`: name, sources, key schedule), from the scheme itself.
        tool_version: modelsec's version (`modelsec.__version__`, which this layer does not import).
        embedded_at: Time of embedding (default: now), recorded in UTC to the second.

    Returns:
        The predicate, JSON-ready.
    """
    when = (embedded_at or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    detection = dict(record.detection.to_json())
    detection.pop("decodedMessageHex", None)
    return {
        "scheme": dict(scheme),
        "parameters": {
            **record.params.to_json(),
            "densityLog2": record.density_log2,
            "codeBits": record.code_bits,
            "messageBits": record.message_bits,
        },
        "keyCommitment": {"algorithm": "hmac-sha256", "value": record.key_commitment},
        "messageCommitment": {"algorithm": "hmac-sha256", "value": record.message_commitment},
        "carriers": {
            "count": record.carriers,
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "carriers": t.carriers}
                for t in record.tensors
            ],
            # Optional (issue 30 item 5): older predicates have no tensor on a grid.
            **({"grid": record.grid_mark.to_json()} if record.grid_mark is not None else {}),
        },
        "embedding": {
            "maxRelativeChange": record.max_relative_change,
            "meanRelativeChange": record.mean_relative_change,
            "relativeL2Change": record.relative_l2_change,
            "strength": {
                "min": record.strength_min,
                "median": record.strength_median,
                "max": record.strength_max,
            },
        },
        "detection": detection,
        **({"fidelity": record.fidelity.to_json()} if record.fidelity is not None else {}),
        "embeddedAt": when.isoformat().replace("+00:00", "Z"),
        "tool": {"name": "modelsec", "version": tool_version},
    }


def watermark_statement(
    predicate: Mapping[str, Any], digests: Mapping[str, str], *, name: str, run_by: RunBy | None = None
) -> Statement:
    """Build the unsigned watermark statement, refusing a predicate no verifier would accept.

    Args:
        predicate: The predicate (`build_watermark_predicate`).
        digests: The watermarked model's root digests (`sha256`, optionally `sm3`).
        name: Informational subject name (the directory name).
        run_by: Who embedded the mark, recorded as `runBy`, when a modelsec server did (EmbedWatermark).

    Returns:
        The unsigned statement.

    Raises:
        MalformedArtifactError: A number is out of its field's range.
        AttestationError: A required field is missing (`parse_watermark_predicate`).
    """
    if run_by is not None:
        predicate = {**predicate, RUN_BY_FIELD: run_by.to_json()}
    parse_watermark_predicate(predicate, what="watermark statement")
    return Statement(
        subjects=(Subject(name=name, digest=MappingProxyType(dict(digests))),),
        predicate_type=WATERMARK_PREDICATE_TYPE,
        predicate=MappingProxyType(dict(predicate)),
    )
