"""Write the man pages of the `modelsec` CLI (docs/man/*.1, groff -man) from its click commands.

Usage: python scripts/gen_man.py [OUT_DIR]   (default: docs/man; `make man`)

One page per command (`modelsec-verify.1`, `modelsec-attest-list.1`, ...) and `modelsec.1` listing them,
with the shell completion setup. The pages carry no date or version, so regenerating an unchanged CLI gives
the same bytes (tests/integration/test_man_pages.py checks the committed pages are current).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from modelsec.cli.main import main

COMPLETION = """\
pip installs the completion scripts with the package, under the environment's prefix: PREFIX/share/
bash\\-completion/completions/modelsec, PREFIX/share/zsh/site\\-functions/_modelsec and PREFIX/share/fish/
vendor_completions.d/modelsec.fish (and these pages under PREFIX/share/man/man1). A shell that does not
look there (a virtual environment's prefix) takes one line in its start-up file:
.PP
.nf
bash (~/.bashrc):  eval "$(_MODELSEC_COMPLETE=bash_source modelsec)"
zsh (~/.zshrc):    eval "$(_MODELSEC_COMPLETE=zsh_source modelsec)"
fish (~/.config/fish/completions/modelsec.fish):
                   _MODELSEC_COMPLETE=fish_source modelsec | source
.fi
"""


def _esc(text: str) -> str:
    """Escape text for groff: backslashes, hyphens, and a leading dot or quote on a line."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in {".", "'"} else line for line in text.splitlines())


def _paragraphs(text: str) -> str:
    """Click help text as groff: blank lines split paragraphs; a block opened by a backspace is verbatim.

    The whole text is the page: what follows a form feed (left out of `--help` by click) included.
    """
    out = []
    for block in text.replace("\f", "").strip().split("\n\n"):
        if not block.strip():
            continue
        if block.startswith("\b\n"):
            out.append(".nf\n" + _esc(block[2:]) + "\n.fi")
        else:
            out.append(_esc(" ".join(line.strip() for line in block.splitlines())))
    return "\n.PP\n".join(out)


def _commands(group: click.Group, ctx: click.Context) -> list[tuple[list[str], click.Command, click.Context]]:
    found = []
    for name in sorted(group.list_commands(ctx)):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        found.append(([*ctx.command_path.split()[1:], name], cmd, sub))
        if isinstance(cmd, click.Group):
            found += _commands(cmd, sub)
    return found


def _page(words: list[str], cmd: click.Command, ctx: click.Context) -> str:
    title = "-".join(["modelsec", *words])
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    lines = [
        f'.TH {_esc(title.upper())} 1 "" "modelsec" "modelsec manual"',
        ".SH NAME",
        f"{_esc(title)} \\- {_esc(cmd.get_short_help_str(limit=200))}",
        ".SH SYNOPSIS",
        f".B {_esc(' '.join(['modelsec', *words]))}",
        _esc(usage),
        ".SH DESCRIPTION",
        _paragraphs(cmd.help or ""),
    ]
    options = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option)]
    records = [r for p in options if (r := p.get_help_record(ctx)) is not None]
    if records:
        lines.append(".SH OPTIONS")
        for opts, help_text in records:
            lines += [".TP", f"\\fB{_esc(opts)}\\fR", _esc(help_text) if help_text else ""]
    if isinstance(cmd, click.Group):
        lines.append(".SH COMMANDS")
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                page = "-".join(["modelsec", *words, name])
                lines += [".TP", f"\\fB{_esc(page)}\\fR(1)", _esc(sub.get_short_help_str(limit=200))]
    if not words:
        lines += [".SH SHELL COMPLETION", COMPLETION.rstrip()]
    lines += [".SH SEE ALSO", "\\fBmodelsec\\fR(1)" if words else "README.md, the documentation site (docs/)"]
    return "\n".join(line for line in lines if line) + "\n"


def generate() -> dict[str, str]:
    """Every page of the CLI: file name -> groff text."""
    root = click.Context(main, info_name="modelsec", **main.context_settings)  # -h as the CLI has it
    pages = {"modelsec.1": _page([], main, root)}
    for words, cmd, ctx in _commands(main, root):
        pages["-".join(["modelsec", *words]) + ".1"] = _page(words, cmd, ctx)
    return pages


def write(out_dir: Path) -> list[Path]:
    """Write the pages into `out_dir` (created), removing stale `modelsec*.1` pages; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = generate()
    for stale in out_dir.glob("modelsec*.1"):
        if stale.name not in pages:
            stale.unlink()
    for name, text in pages.items():
        (out_dir / name).write_text(text)
    return [out_dir / n for n in pages]


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/man")):
        print(path)
