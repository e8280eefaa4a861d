"""Pinning a model to the root digest admission approved.

An admission webhook approves a workload for the models its annotation `modelsec.dev/models` names, as a
comma-separated list of `<uri>@sha256:<model root digest>` (DESIGN.md "Admission"). A pod can hand that
value, or a bare `sha256:<digest>`, to the processes it runs through `MODELSEC_MODEL_DIGEST` (the downward
API); the verifier and the loader then refuse a model whose signed root digest is not pinned
(`verify_signatures(..., expected_digests=...)`). One parser serves the webhook and the pin, so the two can
never read the same annotation differently.

What is checked here is syntax only: a pin is trusted as configuration, and the root digest it is compared
with is the one the verified bundles sign.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from modelsec.errors import MalformedArtifactError, PolicyError

__all__ = [
    "MODELS_ANNOTATION",
    "MODEL_DIGEST_ENV",
    "DigestPin",
    "digest_pins_from_env",
    "digests_for_model",
    "expected_digest_set",
    "parse_digest_pins",
    "pinned_root_digests",
    "split_models_annotation",
    "split_reference",
]

MODELS_ANNOTATION = "modelsec.dev/models"
MODEL_DIGEST_ENV = "MODELSEC_MODEL_DIGEST"
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")
_HEX_RE = re.compile(r"[0-9a-f]{64}\Z")
_URI_RE = re.compile(r"[a-z][a-z0-9+.-]*://[^\s@,]+\Z")


@dataclass(frozen=True, slots=True)
class DigestPin:
    """One pinned model: the URI it was admitted under (None for a bare digest) and its root digest (hex)."""

    uri: str | None
    digest: str


def split_reference(raw: str) -> tuple[str, str | None]:
    """Split one model reference `<uri>[@sha256:<64 hex>]` into its URI and digest (hex, or None).

    Args:
        raw: One reference, already split from its list and stripped.

    Returns:
        The URI and the 64-hex root digest, or None when the reference pins none.

    Raises:
        MalformedArtifactError: The URI has no scheme, contains whitespace, `,` or `@`, or the part after
            the last `@` is not `sha256:` and 64 lowercase hex digits.
    """
    uri, at, suffix = raw.rpartition("@")
    if not at:
        uri, digest = raw, None
    elif not _DIGEST_RE.match(suffix):
        raise MalformedArtifactError(
            f"{raw}: malformed digest {suffix!r} (want sha256: and 64 lowercase hex digits)"
        )
    else:
        digest = suffix.removeprefix("sha256:")
    if not _URI_RE.match(uri):
        raise MalformedArtifactError(f"{raw}: malformed model URI (want scheme://path[@sha256:<digest>])")
    return uri, digest


def split_models_annotation(text: str) -> list[str]:
    """The references of a `modelsec.dev/models` value: split on commas, each stripped.

    Raises:
        MalformedArtifactError: An entry is empty (`a,,b`, a trailing comma, or an empty value).
    """
    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise MalformedArtifactError(f"{MODELS_ANNOTATION} value {text!r} has an empty entry")
    return parts


def parse_digest_pins(value: str, *, source: str = MODEL_DIGEST_ENV) -> tuple[DigestPin, ...]:
    """Parse a pin: a bare `sha256:<64 hex>`, or a whole `modelsec.dev/models` annotation value.

    Every entry of an annotation value must pin a digest (`<uri>@sha256:<64 lowercase hex>`); nothing is
    normalised (no upper-case hex, no bare hex without `sha256:`), so a typo cannot pin something else.

    Args:
        value: The variable's (or annotation's) value.
        source: Names where the value came from in errors.

    Returns:
        The pins, in order (at least one).

    Raises:
        PolicyError: The value is empty or malformed, or an entry pins no digest; the message names
            `source` and the bad entry.
    """
    text = value.strip()
    if _DIGEST_RE.match(text):
        return (DigestPin(None, text.removeprefix("sha256:")),)
    if text.startswith("sha256:") and not any(c in text for c in "@,"):
        # A bare digest that is not one: say so, not "malformed model URI" (it is no URI).
        problem = (
            "the hex digits are not lower-case" if _DIGEST_RE.match(text.lower()) else "not 64 hex digits"
        )
        raise PolicyError(f"{source}: {text!r}: {problem} (want sha256:<64 hex>, in lower case)")
    try:
        pins = []
        for raw in split_models_annotation(text):
            uri, digest = split_reference(raw)
            if digest is None:
                raise MalformedArtifactError(f"{raw}: pins no digest (want <uri>@sha256:<digest>)")
            pins.append(DigestPin(uri, digest))
    except MalformedArtifactError as e:
        raise PolicyError(
            f"{source}: {e} (want sha256:<64 hex> or <uri>@sha256:<64 hex>[,<uri>@sha256:<64 hex>...])"
        ) from e
    return tuple(pins)


def digest_pins_from_env(environ: Mapping[str, str] | None = None) -> tuple[DigestPin, ...] | None:
    """The pins of `MODELSEC_MODEL_DIGEST`, or None when it is unset.

    Raises:
        PolicyError: The variable is set but empty or malformed.
    """
    env = os.environ if environ is None else environ
    value = env.get(MODEL_DIGEST_ENV)
    return None if value is None else parse_digest_pins(value)


def expected_digest_set(digests: Collection[str]) -> frozenset[str]:
    """Normalise expected model root digests (`sha256:<hex>` or bare hex) to a set of 64-hex strings.

    Raises:
        PolicyError: The collection is empty (pass None to pin nothing), or a digest is malformed.
    """
    if isinstance(digests, str):
        digests = [digests]
    result = set()
    for d in digests:
        hex_digest = d.removeprefix("sha256:") if isinstance(d, str) else d
        if not isinstance(hex_digest, str) or not _HEX_RE.match(hex_digest):
            raise PolicyError(f"expected model digest {d!r} is not sha256:<64 lowercase hex>")
        result.add(hex_digest)
    if not result:
        raise PolicyError("expected_digests is empty (pass None to pin no digest)")
    return frozenset(result)


def pinned_root_digests(
    uri: str,
    expected_digests: Collection[str] | None,
    *,
    option: str = "expected_digests",
    environ: Mapping[str, str] | None = None,
) -> frozenset[str] | None:
    """The root digests the model `uri` may have: the caller's pin and `$MODELSEC_MODEL_DIGEST` together.

    What `modelsec verify` and the loader (`load_model`, `load_signed_model`, `open_model`) pin. Both pins
    apply when both are given: an argument only tightens the variable, it never widens or replaces what
    admission pinned, so the digest must be one of each, and two pins with no digest in common are refused
    before anything is read. The variable is read with `digest_pins_from_env` (as the runtime guard reads
    it) and its entries are chosen with `digests_for_model`. Syntax only; the root digest compared with the
    result is the one the verified bundles sign (`verify_signatures(..., expected_digests=...)`).

    Args:
        uri: The model's reference, `file://<real path of the model directory>` (`modelsec.policy.model_uri`).
        expected_digests: The caller's pin (`sha256:<hex>` or hex), or None.
        option: How the caller's pin is named in errors (`--expected-digest` for the CLI).
        environ: The environment to read; default `os.environ`.

    Returns:
        The 64-hex digests the signed model root may have, or None when neither pins anything.

    Raises:
        PolicyError: `expected_digests` is empty or malformed, `$MODELSEC_MODEL_DIGEST` is set but empty or
            malformed, or the two pin no digest in common.
    """
    pinned = expected_digest_set(expected_digests) if expected_digests is not None else None
    env_pins = digest_pins_from_env(environ)
    if env_pins is None:
        return pinned
    from_env = digests_for_model(env_pins, uri)
    if pinned is None:
        return from_env
    if not pinned & from_env:
        raise PolicyError(
            f"{option} ({', '.join(f'sha256:{d}' for d in sorted(pinned))}) and ${MODEL_DIGEST_ENV} "
            f"({', '.join(f'sha256:{d}' for d in sorted(from_env))}) pin no digest in common"
        )
    return pinned & from_env


def digests_for_model(pins: Collection[DigestPin], uri: str) -> frozenset[str]:
    """The root digests a model referenced as `uri` (e.g. `file:///models/llm`) is pinned to.

    The pins whose URI names the model decide; when none names it (a bare digest, or an annotation that
    names the OCI reference the volume came from), every pinned digest is accepted.
    """
    named = frozenset(p.digest for p in pins if p.uri is not None and p.uri.rstrip("/") == uri.rstrip("/"))
    return named or frozenset(p.digest for p in pins)
