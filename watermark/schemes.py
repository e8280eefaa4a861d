"""The watermark-scheme protocol and registry (issue 13: "no watermark-scheme protocol").

A scheme is one module with an object implementing `WatermarkScheme`, registered here with one line in
`_REGISTRY`. Consumers (the attestation's detection hints, the CLI, the service) look a scheme up by the
name recorded in an attestation (`scheme.name`) with `get_scheme`, so an attestation naming an unknown scheme
is refused rather than read with another scheme's parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from modelsec.errors import UnsupportedAlgorithmError

if TYPE_CHECKING:
    from modelsec.signer.watermark_keys import WatermarkKey
    from modelsec.watermark.detection import DetectionResult
    from modelsec.watermark.embed import EmbedResult

__all__ = ["SpreadSpectrumScheme", "WatermarkScheme", "get_scheme", "scheme_names"]


class WatermarkScheme(Protocol):
    """A keyed parameter watermark: embed into a model directory, detect blind from the key."""

    @property
    def name(self) -> str:
        """The scheme name recorded in attestations (e.g. `modelsec-ss-mult/v1`)."""
        ...

    def embed(
        self, model_dir: Path, out_dir: Path, key: WatermarkKey, message: bytes, **options: Any
    ) -> EmbedResult:
        """Write a marked copy of `model_dir` to `out_dir`."""
        ...

    def detect(self, model: Any, key: WatermarkKey, **options: Any) -> DetectionResult:
        """Detect the mark of `key` in a model (directory, arrays or tensor source)."""
        ...


class SpreadSpectrumScheme:
    """`modelsec-ss-mult/v1` (`modelsec.watermark.spread_spectrum`): `embed_model` / `detect`."""

    @property
    def name(self) -> str:
        """`modelsec-ss-mult/v1`."""
        from modelsec.watermark.spread_spectrum import SCHEME

        return SCHEME

    def embed(
        self, model_dir: Path, out_dir: Path, key: WatermarkKey, message: bytes, **options: Any
    ) -> EmbedResult:
        """`modelsec.watermark.embed.embed_model`."""
        from modelsec.watermark.embed import embed_model

        return embed_model(model_dir, out_dir, key, message, **options)

    def detect(self, model: Any, key: WatermarkKey, **options: Any) -> DetectionResult:
        """`modelsec.watermark.detection.detect`."""
        from modelsec.watermark.detection import detect

        return detect(model, key, **options)


_REGISTRY: Mapping[str, WatermarkScheme] = {
    "modelsec-ss-mult/v1": SpreadSpectrumScheme(),
}


def scheme_names() -> tuple[str, ...]:
    """The registered scheme names."""
    return tuple(_REGISTRY)


def get_scheme(name: str, *, what: str = "watermark") -> WatermarkScheme:
    """The registered scheme called `name`.

    Raises:
        UnsupportedAlgorithmError: No scheme of that name is registered.
    """
    scheme = _REGISTRY.get(name)
    if scheme is None:
        raise UnsupportedAlgorithmError(
            f"{what}: the watermark was embedded with scheme {name!r}; this detector runs "
            f"{', '.join(repr(n) for n in _REGISTRY)}"
        )
    return scheme
