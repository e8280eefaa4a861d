"""The registry of signature schemes: the one place that lists them.

Everything that depends on the scheme (key generation and loading, the manifest a key signs, the default
bundle names and hence the signed ignore list, which manifests a signature may cover, the CLI's keygen
choices) asks this registry; nothing else branches on `SignatureAlgorithm`. A new scheme is one module
under this package implementing `SignatureScheme` plus one line in `_REGISTERED`, and a member of
`modelsec.algorithms.SignatureAlgorithm` for its policy/CLI spelling.

The registration order is the order of `SIGNATURE_FILE_NAMES`, which signing records in every manifest's
`ignore_paths`: append, never reorder.
"""

from __future__ import annotations

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import UnsupportedAlgorithmError
from modelsec.signer.schemes.base import KeyBackend, PublicKeyVerifier, SignatureScheme
from modelsec.signer.schemes.ecdsa import ECDSA_P256, ECDSA_P384
from modelsec.signer.schemes.mldsa import ML_DSA_44, ML_DSA_65, ML_DSA_87
from modelsec.signer.schemes.sm2.scheme import SM2

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

_REGISTERED: tuple[SignatureScheme, ...] = (
    ECDSA_P256,
    ECDSA_P384,
    SM2,
    ML_DSA_44,
    ML_DSA_65,
    ML_DSA_87,
)
_BY_ALGORITHM: dict[SignatureAlgorithm, SignatureScheme] = {s.algorithm: s for s in _REGISTERED}


def all_schemes() -> tuple[SignatureScheme, ...]:
    """Every registered scheme, in registration order."""
    return _REGISTERED


def scheme_for(algorithm: SignatureAlgorithm | str) -> SignatureScheme:
    """The scheme registered for `algorithm` (an enum member or its spelling, e.g. `ecdsa-p256`).

    Raises:
        UnsupportedAlgorithmError: No scheme is registered under that name.
    """
    try:
        return _BY_ALGORITHM[SignatureAlgorithm(algorithm)]
    except (KeyError, ValueError):
        raise UnsupportedAlgorithmError(
            f"signature algorithm {str(algorithm)!r} is not supported (use {supported_names()})"
        ) from None


def scheme_for_bundle_name(name: str) -> SignatureScheme | None:
    """The scheme whose default bundle file is called `name`, or None."""
    return next((s for s in _REGISTERED if s.default_bundle_name == name), None)


def schemes_for_key(der: bytes) -> tuple[SignatureScheme, ...]:
    """The schemes to try, in order, on a key whose (unencrypted) DER is `der`.

    The schemes that recognise the key's algorithm identifier; every scheme when none does (an encrypted
    PKCS#8 key hides it, or the key is of an unsupported type and the first scheme explains why).
    """
    return tuple(s for s in _REGISTERED if s.key_matches(der)) or _REGISTERED


def supported_names() -> str:
    """The registered schemes' spellings for diagnostics, e.g. `ecdsa-p256, ecdsa-p384 or sm2`."""
    names = [s.algorithm.value for s in _REGISTERED]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
