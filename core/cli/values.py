"""Option values modelsec checks itself, reported as usage errors (exit 2) naming the option.

A value that is wrong by itself (out of range, NaN, malformed syntax, an inconsistent pair) is the command
line's fault: click reports it as `Invalid value for '--eps': ...` with the usage line and exit 2, and
under `--json` as the `UsageError` reply. The library keeps raising `PolicyError` for the same values given
through the Python API; these types and callbacks only move the check to the command line's parsing, in
the library's own terms where a library function decides. Only click and `modelsec.errors` load at import.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import click

from modelsec.errors import Error

__all__ = [
    "FiniteFloatRange",
    "bad_options",
    "checked_by",
    "device_value",
    "expected_digests_value",
    "listen_value",
    "message_syntax_value",
    "message_value",
    "oci_reference_value",
    "root_digest_value",
    "timestamp_url_value",
    "usage_errors",
]

_Callback = Callable[[click.Context, click.Parameter, Any], Any]


class FiniteFloatRange(click.FloatRange):
    """`click.FloatRange` that also refuses NaN and infinities (click's range comparisons let NaN through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The number, as `click.FloatRange` converts it; NaN and infinities fail as a usage error."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number

    def _describe_range(self) -> str:
        """The bounds for `--help` (`x>=0`, `0<=x<=1`); none for an unbounded range (click wrote x<=None)."""
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


def bad_options(message: str, *options: str) -> NoReturn:
    """Raise the usage error (exit 2) of an inconsistent combination of option values, naming `options`."""
    raise click.BadParameter(
        message, ctx=click.get_current_context(silent=True), param_hint=" / ".join(f"'{o}'" for o in options)
    )


@contextlib.contextmanager
def usage_errors(*options: str) -> Iterator[None]:
    """Turn a modelsec error of a value object built from `options` alone into their usage error.

    For objects (`GateConfig`, `WatermarkParams`) whose every field comes from the command line, so that a
    rule the option types do not repeat is still a usage error, never an exit 1.
    """
    try:
        yield
    except Error as e:
        bad_options(e.diagnostics(), *options)


def checked_by(check: Callable[[Any], object]) -> _Callback:
    """A click callback that runs the library's own syntax check `check` on a given value.

    The value itself is passed on unchanged; a modelsec error from `check` becomes a usage error naming the
    option (None and empty `multiple` values are not checked).
    """

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or value == ():
            return value
        try:
            check(value)
        except Error as e:
            raise click.BadParameter(e.diagnostics(), ctx=ctx, param=param) from None
        return value

    return callback


def _message(text: str) -> None:
    from modelsec.errors import PolicyError
    from modelsec.signer.watermark_keys import parse_message
    from modelsec.watermark.spread_spectrum import WatermarkParams

    # The CLI embeds with the default parameters' message limit.
    limit = WatermarkParams().max_message_bits
    bits = 8 * len(parse_message(text))
    if bits > limit:
        raise PolicyError(
            f"the message has {bits} bits; it must have 8 to {limit} (at most {limit // 8} bytes)"
        )


def _message_syntax(text: str) -> None:
    from modelsec.signer.watermark_keys import parse_message

    parse_message(text)


message_value = checked_by(_message)
"""`-m/--message` of `watermark embed` and `release`: `hex:`/`0x` hex or UTF-8, 1 to 64 bytes."""
message_syntax_value = checked_by(_message_syntax)
"""`watermark detect -m`: `hex:`/`0x` hex or UTF-8, not empty (the length limit depends on --attestation)."""


def _expected_digests(values: tuple[str, ...]) -> None:
    from modelsec.verifier.pinning import expected_digest_set

    expected_digest_set(values)


expected_digests_value = checked_by(_expected_digests)
"""`verify --expected-digest`: `sha256:<64 lower-case hex>` or bare hex, as the library pins."""


def _oci_reference(value: str) -> None:
    from modelsec.registry.client import parse_reference

    parse_reference(value)


oci_reference_value = checked_by(_oci_reference)
"""`push`/`pull` REFERENCE: `oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]`."""

_HEX64 = re.compile(r"[0-9a-fA-F]{64}\Z")


def root_digest_value(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A model root digest `[sha256:]<64 hex>` (`attest pull`, `attest delete --digest`), in lower case."""
    if value is None:
        return None
    hex_digest = value.removeprefix("sha256:")
    if not _HEX64.match(hex_digest):
        raise click.BadParameter(
            f"{value!r} is not a model root digest [sha256:]<64 hex>", ctx=ctx, param=param
        )
    return hex_digest.lower()


def _timestamp_url(url: str) -> None:
    try:
        from modelsec.verifier.trust.timestamps import check_timestamp_url
    except ImportError:  # without the timestamp extra, `_timestamper` says what to install
        return
    check_timestamp_url(url)


timestamp_url_value = checked_by(_timestamp_url)
"""`--timestamp-url`: an http:// or https:// URL
(`modelsec.verifier.trust.timestamps.check_timestamp_url`)."""


def listen_value(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`serve --listen`: HOST:PORT with a port up to 65535 (the configuration file's rule)."""
    from modelsec.config import check_listen

    if value is None:
        return None
    try:
        return check_listen(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?\Z")


def device_value(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """`gate pgd --device`: cpu, cuda or cuda:K."""
    if not _DEVICE.match(value):
        raise click.BadParameter(f"{value!r}: use cpu, cuda or cuda:K", ctx=ctx, param=param)
    return value
