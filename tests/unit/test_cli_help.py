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


def test_sign_help_is_short_and_documents_every_option(cli) -> None:  # type: ignore[no-untyped-def]
    from modelsec.cli.sign import sign

    r = cli("sign", "--help")
    assert r.returncode == 0 and len(r.stdout.splitlines()) < 50, r.stdout
    for param in sign.params:
        for name in getattr(param, "opts", ()):
            if name.startswith("--"):
                assert name in r.stdout, name
    # The long explanations moved to the man page (after click's form feed), not away.
    assert "man modelsec-sign" in r.stdout and "weight_map" not in r.stdout
    page = " ".join(_generator().generate()["modelsec-sign.1"].split())
    for option in ("--allow-unverifiable", "--force", "--key-password", "--timestamp-url", "--signature"):
        assert option.replace("-", "\\-") + ": " in page, option
    assert "weight_map" in page and "\f" not in page


def _generator():  # type: ignore[no-untyped-def]
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gen_man.py"
    spec = importlib.util.spec_from_file_location("gen_man", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
