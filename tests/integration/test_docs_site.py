"""The documentation site builds with `mkdocs build --strict`; its getting-started page renders in a browser.

The build is the one CI runs (`make docs`): with `strict: true` a link to a missing page or anchor aborts it.
The generated references must come from today's schemas and click commands (every `$defs` entry of each
schema, every command), and the getting-started page is rendered by Debian's headless Chromium, which runs
the theme's JavaScript: the test reads the rendered DOM (title, navigation, code blocks with the commands the
page teaches) and checks that the screenshot is a PNG of the window's size. Content, not pixels.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import click
import pytest
import yaml

from modelsec.cli.main import main as cli_main

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
WINDOW = (1280, 900)
pytestmark = pytest.mark.integration


class _Page(HTMLParser):
    """What a reader sees of a rendered page: title, h1, nav links, code blocks, script-made buttons."""

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.h1 = ""
        self.nav_links: set[str] = set()
        self.code_blocks: list[str] = []
        self.copy_buttons = 0
        self._in: list[str] = []
        self._nav_depth = 0
        self._pre_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        self._in.append(tag)
        if tag == "nav" and "md-nav" in classes:
            self._nav_depth += 1
        if tag == "a" and self._nav_depth and a.get("href"):
            self.nav_links.add(str(a["href"]))
        if tag == "pre":
            self._pre_depth += 1
            self.code_blocks.append("")
        if tag == "button" and "md-code__button" in classes:
            self.copy_buttons += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav" and self._nav_depth:
            self._nav_depth -= 1
        if tag == "pre" and self._pre_depth:
            self._pre_depth -= 1
        while self._in and self._in.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if "title" in self._in:
            self.title += data
        if "h1" in self._in:
            self.h1 += data
        if self._pre_depth:
            self.code_blocks[-1] += data


def _nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def _commands(group: click.Group, ctx: click.Context) -> list[str]:
    names = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            names.append(f"{ctx.command_path} {name}")
            if isinstance(cmd, click.Group):
                names += _commands(cmd, click.Context(cmd, info_name=name, parent=ctx))
    return names


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.slow
def test_site_builds_strictly_and_getting_started_renders(tmp_path: Path) -> None:
    # mkdocs is in the test set-up (the `docs` dependency group): missing, the test fails rather than skips.
    site = tmp_path / "site"
    build = subprocess.run(
        [MKDOCS, "build", "--strict", "--config-file", REPO / "mkdocs.yml", "--site-dir", site],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    assert "WARNING" not in build.stderr, build.stderr[-4000:]

    # Every page of the navigation was built, the generated ones included.
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = _nav_pages(config["nav"])
    assert {"getting-started.md", "threat-model.md", "reference/cli.md", "reference/model-policy.md"} <= set(
        pages
    )
    for page in pages:
        built = site / page.replace(".md", ".html")
        assert built.is_file(), f"{page} was not built"
    # The references are today's: each schema's definitions, each click command.
    for stem in ("model-policy", "server-config", "gate-spec"):
        schema = json.loads((REPO / "schemas" / f"{stem}.schema.json").read_text())
        html = (site / "reference" / f"{stem}.html").read_text()
        for name in [*schema.get("$defs", {}), *schema["properties"]]:
            assert name in html, f"reference/{stem}: {name} missing"
    cli_html = (site / "reference" / "cli.html").read_text()
    # The CLI's own context settings (-h): click caches a command's help option from its first context.
    commands = _commands(cli_main, click.Context(cli_main, info_name="modelsec", **cli_main.context_settings))
    assert len(commands) > 20
    for command in commands:
        assert command in cli_html, f"the CLI reference lacks `{command}`"
    # The options read as `--help` prints them: mkdocs-click's table style shows click 8.3's unset defaults as
    # `Sentinel.UNSET`, hence `:style: plain` in docs/reference/cli.md.
    assert "--trusted-key PATH" in cli_html and "Sentinel" not in cli_html

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (`make .venv/.test` installs it): page not rendered")
    shot = tmp_path / "getting-started.png"
    args = [chromium, "--headless", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    # Chromium refuses to start as root with its sandbox.
    args += ["--no-sandbox"] if os.geteuid() == 0 else []
    args += [f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", "--dump-dom"]
    rendered = subprocess.run(
        [*args, (site / "getting-started.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr[-4000:]
    page = _Page()
    page.feed(rendered.stdout)

    assert page.title.strip() == "Getting started - modelsec"
    assert page.h1.strip().removesuffix("¶") == "Getting started in five minutes"  # ¶: the permalink
    # The navigation links every page of mkdocs.yml's nav, as files (the site is read from disk too).
    expected = {p.replace(".md", ".html") for p in pages}
    assert expected <= page.nav_links, f"navigation lacks {sorted(expected - page.nav_links)}"
    code = "\n".join(page.code_blocks)
    assert len(page.code_blocks) >= 5
    for command in ("make demo", "modelsec keygen -a ecdsa-p256 -o ci-p256", "modelsec verify my-model"):
        assert command in code, f"getting started lacks `{command}`"
    # The theme's script ran in the browser: it gives every code block a copy button.
    assert page.copy_buttons >= len(page.code_blocks)

    data = shot.read_bytes()
    assert _png_size(data) == WINDOW
    assert len(data) > 20_000  # a rendered page, not a blank window (a blank 1280x900 PNG is a few KiB)
