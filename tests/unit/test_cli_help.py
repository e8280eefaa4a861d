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


def _completions(words: list[str], incomplete: str) -> list[str]:
    from click.shell_completion import ShellComplete

    from modelsec.cli.main import main

    return [
        c.value
        for c in ShellComplete(main, {}, "modelsec", "_MODELSEC_COMPLETE").get_completions(words, incomplete)
    ]


def _commands():  # type: ignore[no-untyped-def]
    import click

    from modelsec.cli.main import main

    ctx = click.Context(main, info_name="modelsec")
    todo = [([], main)]
    while todo:
        words, group = todo.pop()
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None
            yield [*words, name], cmd
            if isinstance(cmd, click.Group):
                todo.append(([*words, name], cmd))


def test_completion_offers_exactly_the_visible_options_and_commands() -> None:
    import click

    for words, cmd in _commands():
        offered = set(_completions(words, "--"))
        visible = {
            name
            for p in cmd.params
            if isinstance(p, click.Option) and not p.hidden
            for name in (*p.opts, *p.secondary_opts)
            if name.startswith("--")
        }
        assert offered == visible | {"--help"}, words
        if isinstance(cmd, click.Group):
            assert set(_completions(words, "")) == {n for n, c in cmd.commands.items() if not c.hidden}, words


def test_a_hidden_alias_or_command_is_not_completed() -> None:
    """What a deprecated spelling would be: hidden from --help, so from completion too."""
    import click

    from modelsec.cli.main import main
    from modelsec.cli.verify import verify

    alias = click.Option(["--key"], hidden=True, multiple=True)
    old = click.Command("check", hidden=True, callback=lambda: None)
    verify.params.append(alias)
    main.add_command(old)
    try:
        assert "--key" not in _completions(["verify"], "--")
        assert "--trusted-key" in _completions(["verify"], "--")
        assert "check" not in _completions([], "")
        assert "--key" not in " ".join(_completions(["verify"], "--k"))
    finally:
        verify.params.remove(alias)
        main.commands.pop("check")
