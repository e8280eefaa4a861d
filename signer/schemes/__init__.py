"""The registry of signature schemes: the one place that lists them.

Everything that depends on the scheme (key generation and loading, the manifest a key signs, the default
bundle names and hence the signed ignore list, which manifests a signature may cover, the CLI's keygen
choices) asks this registry; nothing else branches on `SignatureAlgorithm`. A new scheme is one module
under this package implementing `SignatureScheme` plus one line in `_registered`, and a member of
`modelsec.algorithms.SignatureAlgorithm` for its policy/CLI spelling.

The registration order is the order of `SIGNATURE_FILE_NAMES`, which signing records in every manifest's
`ignore_paths`: append, never reorder.

The scheme modules are imported by the registry's first question, not by importing it: `modelsec.signer.keys`
and the verifier import the registry, and the runtime guard's start-up pays for every scheme's module
(classes, `cryptography` key types) otherwise (issue 32 item 5).
"""

from __future__ import annotations

import functools

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import UnsupportedAlgorithmError
from modelsec.signer.schemes.base import KeyBackend, PublicKeyVerifier, SignatureScheme

__all__ = [
    "KeyBackend",
    "PublicKeyVerifier",
    "SignatureScheme",
    "all_schemes",
    "scheme_for",
    "scheme_for_bundle_name",
    "schemes_for_key",
    "supported_names",
]


@functools.cache
def _registered() -> tuple[SignatureScheme, ...]:
    from modelsec.signer.schemes.ecdsa import ECDSA_P256, ECDSA_P384
    from modelsec.signer.schemes.mldsa import ML_DSA_44, ML_DSA_65, ML_DSA_87
    from modelsec.signer.schemes.sm2.scheme import SM2

    return (
        ECDSA_P256,
        ECDSA_P384,
        SM2,
        ML_DSA_44,
        ML_DSA_65,
        ML_DSA_87,
    )


@functools.cache
def _by_algorithm() -> dict[SignatureAlgorithm, SignatureScheme]:
    return {s.algorithm: s for s in _registered()}


def all_schemes() -> tuple[SignatureScheme, ...]:
    """Every registered scheme, in registration order."""
    return _registered()


def scheme_for(algorithm: SignatureAlgorithm | str) -> SignatureScheme:
    """The scheme registered for `algorithm` (an enum member or its spelling, e.g. `ecdsa-p256`).

    Raises:
        UnsupportedAlgorithmError: No scheme is registered under that name.
    """
    try:
        return _by_algorithm()[SignatureAlgorithm(algorithm)]
    except (KeyError, ValueError):
        raise UnsupportedAlgorithmError(
            f"signature algorithm {str(algorithm)!r} is not supported (use {supported_names()})"
        ) from None


def scheme_for_bundle_name(name: str) -> SignatureScheme | None:
    """The scheme whose default bundle file is called `name`, or None."""
    return next((s for s in _registered() if s.default_bundle_name == name), None)


def schemes_for_key(der: bytes) -> tuple[SignatureScheme, ...]:
    """The schemes to try, in order, on a key whose (unencrypted) DER is `der`.

    The schemes that recognise the key's algorithm identifier; every scheme when none does (an encrypted
    PKCS#8 key hides it, or the key is of an unsupported type and the first scheme explains why).
    """
    registered = _registered()
    return tuple(s for s in registered if s.key_matches(der)) or registered


def supported_names() -> str:
    """The registered schemes' spellings for diagnostics, e.g. `ecdsa-p256, ecdsa-p384 or sm2`."""
    names = [s.algorithm.value for s in _registered()]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
