"""The RFC 3161 verifier, imported only when timestamps must be checked (`rfc3161-client` is optional)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING

from modelsec.attestations.bundle import Bundle
from modelsec.errors import BackendUnavailableError

if TYPE_CHECKING:
    from modelsec.policy import TimestampAuthority
    from modelsec.verifier.trust.timestamps import CheckedTimestamps

__all__ = ["check_bundle_timestamps", "timestamps_module"]


def timestamps_module(source: str) -> ModuleType:
    """`modelsec.verifier.trust.timestamps`, which needs `rfc3161-client` (the `timestamp` extra).

    Args:
        source: The bundle whose timestamps are to be verified (named in the error).

    Raises:
        BackendUnavailableError: `rfc3161-client` is not installed.
    """
    try:
        from modelsec.verifier.trust import timestamps
    except ModuleNotFoundError as e:
        raise BackendUnavailableError(
            f"{source}: verifying RFC 3161 timestamps needs rfc3161-client "
            "(pip install 'modelsec[timestamp]')"
        ) from e
    return timestamps


def check_bundle_timestamps(
    bundle: Bundle, authorities: Sequence[TimestampAuthority], *, now: datetime | None = None
) -> CheckedTimestamps:
    """The bundle's timestamps over its signature, each verified once (`timestamps.check_timestamps`).

    The one place both the X.509 chain check and the signature-time check get a bundle's trusted times.

    Raises:
        SignatureError: A timestamp a configured TSA vouches for is dated after `now` plus the clock-skew
            allowance (`timestamps.CLOCK_SKEW`).
        BackendUnavailableError: `rfc3161-client` is not installed.
    """
    result: CheckedTimestamps = timestamps_module(bundle.source).check_timestamps(
        bundle.timestamps, bundle.signature.sig, authorities, source=bundle.source, now=now
    )
    return result
