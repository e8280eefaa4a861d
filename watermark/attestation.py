"""The watermark attestation: a DSSE-signed in-toto statement about the *watermarked* model.

Statement (in-toto Statement v1, DSSE payloadType `application/vnd.in-toto+json`, sigstore bundle v0.3):

* `subject`: the watermarked model directory, `digest.sha256` = its model root digest, i.e. the OMS
  SHA-256 subject digest computed exactly as `modelsec sign` and `modelsec digest` compute it (same ignore
  list: `.git`, `.gitattributes`, `.github`, `.gitignore` and the signature bundle names). An SM2 signer also
  records the `sm3` root digest (DESIGN.md decision 2).
* `predicateType`: `https://modelsec.dev/watermark/v1`.
* `predicate`: built, parsed and checked by `modelsec.attestations.predicates.watermark` (its one home);
  this module gives it the embedding and the scheme's description.

The attestation file lives outside the model directory, or inside it under the reserved name
`model.watermark.sig` (recorded in every manifest's ignore list); any other file inside would itself be
hashed into the root digest that it attests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelsec.attestations.predicates.watermark import WATERMARK_PREDICATE_TYPE
from modelsec.errors import KeyMaterialError, PolicyError, UnsupportedAlgorithmError
from modelsec.limits import Limits

if TYPE_CHECKING:
    from modelsec.attestations.bundle import StatementSigner
    from modelsec.attestations.predicates.run_by import RunBy
    from modelsec.attestations.predicates.watermark import WatermarkPredicate
    from modelsec.attestations.statement import Statement
    from modelsec.signer.keys import TrustedKey
    from modelsec.watermark.embed import EmbedResult
    from modelsec.watermark.spread_spectrum import WatermarkKey, WatermarkParams

__all__ = [
    "PREDICATE_TYPE",
    "DetectionHints",
    "WatermarkAttestation",
    "check_key_commitment",
    "detection_hints",
    "model_root_digests",
    "read_detection_hints",
    "verify_watermark_attestation",
    "watermark_statement",
    "write_watermark_attestation",
]

PREDICATE_TYPE = WATERMARK_PREDICATE_TYPE
_SOURCES = (
    "Cox, Kilian, Leighton, Shamoon: Secure spread spectrum watermarking for multimedia, IEEE TIP 6(12) 1997",
    "Uchida, Nagai, Sakazawa, Satoh: Embedding Watermarks into Deep Neural Networks, ICMR 2017",
    "RFC 5869 (HKDF-SHA256); NIST SP 800-38A (AES-256-CTR keystream)",
)


def model_root_digests(model_dir: Path, *, sm3: bool = False, limits: Limits | None = None) -> dict[str, str]:
    """The model root digest(s) of a directory, exactly as `modelsec sign` reports them.

    Args:
        model_dir: The model directory.
        sm3: Also compute the SM3 root digest.
        limits: Walk and parser limits.

    Returns:
        `{"sha256": hex}` (plus `"sm3": hex`).

    Raises:
        MalformedArtifactError: Empty or unreadable directory, or a malformed safetensors file.
        PolicyViolationError: A symlink or special file.
    """
    from modelsec.algorithms import HashAlgorithm
    from modelsec.signer import compute_manifests
    from modelsec.signer.layout import MODEL_IGNORE_PATHS

    algorithms = [HashAlgorithm.SHA256, *([HashAlgorithm.SM3] if sm3 else [])]
    manifests = compute_manifests(
        model_dir,
        algorithms,
        ignore_paths=MODEL_IGNORE_PATHS,
        tensor_hash=None,
        limits=limits,
    )
    out = {"sha256": manifests[HashAlgorithm.SHA256].subject_digest["sha256"]}
    if sm3:
        out["sm3"] = manifests[HashAlgorithm.SM3].subject_digest["sm3"]
    return out


def watermark_statement(
    result: EmbedResult,
    digests: Mapping[str, str],
    *,
    name: str,
    embedded_at: datetime | None = None,
    run_by: RunBy | None = None,
) -> Statement:
    """Build the in-toto statement for an embedding (no key material, no message).

    Args:
        result: From `embed_model`.
        digests: The watermarked model's root digests (`model_root_digests`).
        name: Informational subject name (the directory name).
        embedded_at: Time of embedding (default: now, UTC).
        run_by: Who embedded the mark, recorded as `runBy`, when a modelsec server did (EmbedWatermark).

    Returns:
        The unsigned statement.

    Raises:
        MalformedArtifactError: A recorded number is out of its field's range (never signed).
    """
    from modelsec import __version__
    from modelsec.attestations.predicates.watermark import build_watermark_predicate
    from modelsec.attestations.predicates.watermark import watermark_statement as build_statement
    from modelsec.watermark.spread_spectrum import SCHEME

    scheme = {
        "name": SCHEME,
        "sources": list(_SOURCES),
        "keySchedule": "HKDF-SHA256 subkeys per purpose, tensor name and shape; AES-256-CTR keystreams",
        "statistic": "per tensor x = w / rms(carriers); bit b: sign(sum s_i x_i) over its carriers",
        "embedding": "w' = w + m_b t_b s_i |w_i| (informed, multiplicative, t_b <= maxRelativeChange)",
    }
    predicate = build_watermark_predicate(
        result, scheme=scheme, tool_version=__version__, embedded_at=embedded_at
    )
    return build_statement(predicate, digests, name=name, run_by=run_by)


def sign_watermark_attestation(
    result: EmbedResult,
    signer: StatementSigner,
    *,
    sm3: bool | None = None,
    digests: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    run_by: RunBy | None = None,
) -> tuple[dict[str, str], bytes]:
    """Sign the watermark statement about the watermarked model as a DSSE bundle.

    Args:
        result: From `embed_model` (its `out_dir` is hashed now, after writing, unless `digests` is given).
        signer: A key backend (`modelsec.signer.load_private_key_file`).
        sm3: Also record the SM3 root digest (default: when the signer is an SM2 key).
        digests: The model root digests the caller already computed for `result.out_dir` (`sha256`, and
            `sm3` when `sm3`), e.g. by signing it; None hashes the directory.
        limits: Walk and parser limits.
        run_by: Who embedded the mark, when a modelsec server did (recorded as `runBy`).

    Returns:
        The root digests recorded in the subject, and the bundle bytes.

    Raises:
        MalformedArtifactError: The model directory cannot be hashed.
    """
    from modelsec.attestations.bundle import sign_statement

    if sm3 is None:
        sm3 = getattr(getattr(signer, "algorithm", None), "value", "") == "sm2"
    if digests is None or "sha256" not in digests or (sm3 and "sm3" not in digests):
        digests = model_root_digests(result.out_dir, sm3=sm3, limits=limits)
    recorded = dict(digests)
    statement = watermark_statement(result, recorded, name=result.out_dir.resolve().name, run_by=run_by)
    return recorded, sign_statement(statement, signer)


def write_watermark_attestation(
    result: EmbedResult,
    signer: StatementSigner,
    path: Path,
    *,
    sm3: bool | None = None,
    digests: Mapping[str, str] | None = None,
    limits: Limits | None = None,
) -> tuple[str, Path]:
    """Sign the watermark statement (`sign_watermark_attestation`) and write the bundle to `path`.

    Args:
        result: From `embed_model`.
        signer: A key backend.
        path: Bundle path: outside `result.out_dir`, or its reserved name `model.watermark.sig` in it.
        sm3: Also record the SM3 root digest (default: when the signer is an SM2 key).
        digests: Root digests already computed for `result.out_dir` (skips hashing it again).
        limits: Walk and parser limits.

    Returns:
        The SHA-256 model root digest and the path written.

    Raises:
        PolicyError: `path` lies inside the model directory, exists as a symlink, or cannot be written.
        MalformedArtifactError: The model directory cannot be hashed.
    """
    from modelsec.signer.layout import ATTESTATION_FILE_NAMES, write_bundle_file

    out_dir = result.out_dir.resolve()
    target = path.absolute()
    reserved = out_dir == target.resolve().parent and target.name in ATTESTATION_FILE_NAMES
    if not reserved and (out_dir == target.resolve().parent or out_dir in target.resolve().parents):
        raise PolicyError(
            f"{path}: inside the model directory {result.out_dir}, an attestation may only be written as "
            f"{' or '.join(ATTESTATION_FILE_NAMES)} (any other file would change the root digest it attests)"
        )
    if target.is_symlink():
        raise PolicyError(f"{path}: refusing to write the attestation through a symlink")
    recorded, bundle = sign_watermark_attestation(result, signer, sm3=sm3, digests=digests, limits=limits)
    write_bundle_file(target, bundle, what="watermark attestation")
    return recorded["sha256"], target


@dataclass(frozen=True, slots=True)
class WatermarkAttestation:
    """A verified watermark attestation.

    Attributes:
        root_digest: The attested model root digest (SHA-256, hex), equal to the expected one.
        key: The trusted key that signed it.
        statement: The verified statement (predicate read-only).
        parsed: The parsed predicate (scheme, commitments, embed-time detection).
    """

    root_digest: str
    key: TrustedKey
    statement: Statement
    parsed: WatermarkPredicate

    @property
    def predicate(self) -> Mapping[str, Any]:
        """The watermark predicate."""
        return self.statement.predicate

    @property
    def scheme(self) -> str:
        """The scheme that embedded the mark (`scheme.name`)."""
        return self.parsed.scheme

    @property
    def detected_at_embedding(self) -> bool:
        """Whether the embed-time detection recorded a detected mark."""
        return self.parsed.detected


def verify_watermark_attestation(
    bundle_path: Path,
    keys: Sequence[TrustedKey],
    *,
    root_digest: str | None = None,
    model_dir: Path | None = None,
    limits: Limits | None = None,
) -> WatermarkAttestation:
    """Verify a watermark attestation bundle and that it is about the expected model.

    Order: read the bundle (size bounded, symlinks refused) and parse it strictly; verify its one DSSE
    signature over the PAE with the trusted keys allowed the `watermark` role (keys are never taken from
    the bundle); parse the statement from the verified payload bytes with predicateType
    `https://modelsec.dev/watermark/v1`; compare the subject's `sha256` with the expected root digest
    (given, or computed from `model_dir`) in constant time; check the predicate's required fields.

    Args:
        bundle_path: The attestation bundle.
        keys: Trusted public keys (`modelsec.signer.load_trusted_key_file`).
        root_digest: Expected model root digest (hex SHA-256).
        model_dir: Compute the expected digest from this directory instead.
        limits: Size limits.

    Returns:
        The verified attestation.

    Raises:
        SignatureError: No trusted key verifies the signature, or the bundle is missing.
        MalformedArtifactError: The bundle or statement is malformed or has another predicateType.
        MalformedArtifactError: Also: a number of the predicate is out of its field's range.
        AttestationError: The subject is another model, or the predicate lacks required fields
            (`modelsec.attestations.predicates.watermark.parse_watermark_predicate`, the verifier's rule).
        PolicyError: Neither or both of `root_digest` and `model_dir` given.
    """
    from modelsec.attestations.predicates.watermark import parse_watermark_predicate
    from modelsec.attestations.statement import parse_statement
    from modelsec.verifier.attestations import verify_statement_bundle
    from modelsec.verifier.trust.bundles import read_bundle

    limits = limits or Limits()
    if root_digest is not None and model_dir is None:
        expected = root_digest
    elif root_digest is None and model_dir is not None:
        expected = model_root_digests(model_dir, limits=limits)["sha256"]
    else:
        raise PolicyError("give exactly one of root_digest and model_dir")

    bundle = read_bundle(bundle_path, limits)
    statement = parse_statement(bundle.envelope.payload, what=str(bundle_path), predicate_type=PREDICATE_TYPE)
    signer_key = verify_statement_bundle(bundle, statement, keys, expected, what=str(bundle_path))
    parsed = parse_watermark_predicate(statement.predicate, what=str(bundle_path))
    return WatermarkAttestation(root_digest=expected, key=signer_key, statement=statement, parsed=parsed)


@dataclass(frozen=True, slots=True)
class DetectionHints:
    """What an attestation tells the detector (parameters only; nothing here is evidence).

    Attributes:
        params: The scheme parameters used at embedding, with the recorded density fixed.
        tensors: The attested carrier tensors.
        message_bits: The message length in bits.
        key_commitment: The attested key commitment (compare with `WatermarkKey.commitment()`).
    """

    params: WatermarkParams
    tensors: tuple[str, ...]
    message_bits: int
    key_commitment: str


def detection_hints(predicate: Mapping[str, Any], *, what: str) -> DetectionHints:
    """Read the detection parameters from a watermark predicate.

    Choosing the test from a file that does not depend on the suspect's weights keeps the false-positive
    probability exact, so the attestation need not be trusted for this (verify it with
    `verify_watermark_attestation` to rely on its claims). The recorded scheme must be the one this
    detector runs: another scheme's parameters would make the test meaningless.

    Args:
        predicate: The `https://modelsec.dev/watermark/v1` predicate.
        what: Names the attestation in errors.

    Returns:
        The hints.

    Raises:
        MalformedArtifactError: A required field is missing, has the wrong type or is out of range.
        UnsupportedAlgorithmError: The predicate records another watermark scheme.
        PolicyError: The recorded parameters are invalid.
    """
    from modelsec.attestations.predicates.watermark import parse_recorded_parameters
    from modelsec.watermark.schemes import get_scheme
    from modelsec.watermark.spread_spectrum import SCHEME, WatermarkParams

    recorded = parse_recorded_parameters(predicate, what=what)
    if get_scheme(recorded.scheme, what=what).name != SCHEME:  # hints are this scheme's parameters
        raise UnsupportedAlgorithmError(f"{what}: no detection hints for scheme {recorded.scheme!r}")
    params = WatermarkParams(
        kappa=recorded.kappa,
        pilot_bits=recorded.pilot_bits,
        block_size=recorded.block_size,
        target_carriers_log2=recorded.target_carriers_log2,
        density_log2=recorded.density_log2,
        min_tensor_elements=recorded.min_tensor_elements,
        max_relative_change=recorded.max_relative_change,
        max_message_bits=recorded.max_message_bits,
        min_carriers_per_bit=recorded.min_carriers_per_bit,
        carrier_set=recorded.carrier_set,
        message_code=recorded.message_code,
        code_margin=recorded.code_margin,
    )
    return DetectionHints(
        params=params,
        tensors=recorded.tensors,
        message_bits=recorded.message_bits,
        key_commitment=recorded.key_commitment,
    )


def read_detection_hints(bundle_path: Path, *, limits: Limits | None = None) -> DetectionHints:
    """`detection_hints` of an attestation bundle file (its signature is not checked here).

    Raises:
        SignatureError: The file does not exist.
        MalformedArtifactError: Not a bundle, not a watermark statement, or missing parameters.
        PolicyError: Invalid recorded parameters.
    """
    from modelsec.attestations.statement import parse_statement
    from modelsec.verifier.trust.bundles import read_bundle

    bundle = read_bundle(bundle_path, limits or Limits())
    statement = parse_statement(bundle.envelope.payload, what=str(bundle_path), predicate_type=PREDICATE_TYPE)
    return detection_hints(statement.predicate, what=str(bundle_path))


def check_key_commitment(
    hints: DetectionHints, key: WatermarkKey, *, key_name: str, attestation: Path
) -> None:
    """Refuse a detection key other than the one the attestation commits to (constant-time comparison).

    Raises:
        KeyMaterialError: `key`'s commitment differs from the attestation's `keyCommitment`.
    """
    import hmac

    if not hmac.compare_digest(hints.key_commitment, key.commitment()):
        raise KeyMaterialError(f"{key_name}: this key does not match the key commitment of {attestation}")
