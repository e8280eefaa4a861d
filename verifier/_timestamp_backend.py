"""The RFC 3161 verifier, imported only when timestamps must be checked (`rfc3161-client` is optional)."""

from __future__ import annotations

from types import ModuleType

from modelsec.errors import BackendUnavailableError

__all__ = ["timestamps_module"]


def timestamps_module(source: str) -> ModuleType:
    """`modelsec.verifier.timestamps`, which needs `rfc3161-client` (the `timestamp` extra).

    Args:
        source: The bundle whose timestamps are to be verified (named in the error).

    Raises:
        BackendUnavailableError: `rfc3161-client` is not installed.
    """
    try:
        from modelsec.verifier import timestamps
    except ModuleNotFoundError as e:
        raise BackendUnavailableError(
            f"{source}: verifying RFC 3161 timestamps needs rfc3161-client "
            "(pip install 'modelsec[timestamp]')"
        ) from e
    return timestamps
