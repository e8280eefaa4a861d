"""What `--help` and shell completion show (issue 31): short help, the environment named, nothing hidden."""

from __future__ import annotations

import pytest


def _option_help(text: str, option: str) -> str:
    """An option's help text in `--help` output, its wrapped lines joined."""
    words = " ".join(text.split())
    start = words.index(f" {option} ")
    end = words.find(" -", start + len(option) + 2)
    return words[start : end if end != -1 else None]


@pytest.mark.parametrize("command", [["pull"], ["push"], ["copy"]])
def test_plain_http_help_names_its_environment_variable(command: list[str], cli) -> None:  # type: ignore[no-untyped-def]
    r = cli(*command, "--help")
    assert r.returncode == 0
    assert "MODELSEC_OCI_PLAIN_HTTP=1" in _option_help(r.stdout, "--plain-http")
