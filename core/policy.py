"""Verification policy: which keys are trusted, which algorithms must have signed, what is refused.

This is the in-memory form; the policy *file* format (YAML/JSON, DESIGN.md "Policy") loads into it. The
defaults are the safe ones of DESIGN.md decision 6 and apply from the first `modelsec verify`, before any
policy file exists: pickle formats and remote code are refused even when signed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import PolicyError
from modelsec.limits import Limits
from modelsec.signer.keys import TrustedKey, load_trusted_key_file

__all__ = ["Policy"]


@dataclass(frozen=True, slots=True)
class Policy:
    """What a verifier trusts and requires.

    Attributes:
        keys: Trusted public keys; keys are never taken from an artifact.
        require_algorithms: Every one of these must have produced a valid signature.
        allow_remote_code: Accept `*.py` files and `auto_map` in config files (default: refuse).
        limits: Parsing and size limits.
    """

    keys: tuple[TrustedKey, ...]
    require_algorithms: frozenset[SignatureAlgorithm] = frozenset()
    allow_remote_code: bool = False
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not self.keys:
            raise PolicyError("the policy trusts no key: give at least one public key")

    @classmethod
    def from_key_files(
        cls,
        paths: Iterable[Path],
        *,
        require: Iterable[SignatureAlgorithm] = (),
        allow_remote_code: bool = False,
        limits: Limits | None = None,
    ) -> Policy:
        """A policy trusting the public keys in `paths` (PEM SubjectPublicKeyInfo).

        Raises:
            PolicyError: No key given.
            KeyMaterialError: A key file cannot be read or parsed.
            UnsupportedAlgorithmError: A key of an unsupported type.
        """
        return cls(
            keys=tuple(load_trusted_key_file(p) for p in paths),
            require_algorithms=frozenset(require),
            allow_remote_code=allow_remote_code,
            limits=limits or Limits(),
        )
