"""Progress of long operations, reported through `logging` (the library never writes to a terminal itself).

Each step of a long operation (a release stage, a layer pushed or pulled, a blob copied) is one INFO record on
the logger `modelsec.progress`. Nothing is shown unless the application asks: the `modelsec` command line
shows the latest step as one status line on stderr when stderr is a terminal and `--json` is not given; an
application may attach its own handler. Records carry no secret (names, digests, counts and sizes only).
"""

from __future__ import annotations

import logging

__all__ = ["PROGRESS_LOGGER", "step"]

PROGRESS_LOGGER = "modelsec.progress"
_logger = logging.getLogger(PROGRESS_LOGGER)


def step(message: str) -> None:
    """Report the step that starts now (one line, e.g. `pull: layer 2/6 model-00002.safetensors`)."""
    _logger.info(message)
