"""Progress on a terminal: `pull` and `release` show a status line within 2 s, and nothing off a terminal.

Real processes on a tmux pseudo-terminal (`tests.support.tty`): whether stderr is a terminal is under test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model
from tests.support.oci import Registry
from tests.support.tty import on_terminal, tmux_missing_reason

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(tmux_missing_reason() is not None, reason=str(tmux_missing_reason())),
]

FIRST_LINE_SECONDS = 2.0


@pytest.mark.slow
def test_pull_shows_progress_on_a_terminal_only(
    tmp_path: Path, key_dir: Path, registry: Registry, cli
) -> None:
    model = write_tiny_model(tmp_path / "m", seed=31)
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    pub, key = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    ref = f"oci://{registry.address}/models/progress:v1"
    pushed = cli("push", model, ref, "--signing-key", key, "--trusted-key", pub, "--json", env=registry.env())
    assert pushed.returncode == 0, pushed.stderr
    by_digest = f"oci://{registry.address}/models/progress@{json.loads(pushed.stdout)['manifestDigest']}"

    with on_terminal(
        ["pull", by_digest, tmp_path / "tty", "--trusted-key", pub], tmp_path, registry.env()
    ) as run:
        seen = run.wait_for("pull: ", 10)
        assert run.wait_done(60) == 0, run.text()[-2000:]
    assert seen is not None and seen < FIRST_LINE_SECONDS, run.text()[-2000:]
    # The steps the library reports, not only the command's name (which steps are drawn depends on how fast
    # they pass: the line is redrawn about 12 times a second).
    assert re.search(r"pull: (reading|layer|verifying)", run.text()), run.text()[-2000:]
    assert (tmp_path / "tty" / "model.sig").is_file()

    # The same command with --json, or with stderr off the terminal: no progress at all.
    for name, extra, redirect in (("json", ["--json"], None), ("file", [], tmp_path / "stderr.txt")):
        argv = ["pull", by_digest, tmp_path / name, "--trusted-key", pub, *extra]
        with on_terminal(argv, tmp_path, registry.env(), redirect_stderr=redirect) as run:
            assert run.wait_done(60) == 0, run.text()[-2000:]
        assert "pull: " not in run.text(), run.text()[-2000:]
    assert "pull: " not in (tmp_path / "stderr.txt").read_text()


@pytest.mark.slow
def test_release_shows_progress_within_two_seconds(
    tmp_path_factory: pytest.TempPathFactory, key_dir: Path
) -> None:
    from tests.integration._lenet_release import ENV, release_inputs, require_inputs

    require_inputs()
    work = release_inputs(
        tmp_path_factory, tmp_path_factory.mktemp("tty-release"), digits=20, min_robust_accuracy=0.0
    )
    argv = [
        "release", work / "advtrained", "--out", work / "released",
        "--signing-key", key_dir / "ecdsa-p256.key.pem",
        "--watermark-key", work / "wm.key", "-m", "tty", "--gate-config", work / "gate.yaml",
    ]  # fmt: skip
    # The release itself takes a minute: the test stops it once the first stages have shown.
    with on_terminal(argv, work, ENV) as run:
        seen = run.wait_for("release: ", 10)
        assert seen is not None and seen < FIRST_LINE_SECONDS, run.text()[-2000:]
        # A later stage replaces it (the gate: the longest, so a loaded machine's renderer still shows it).
        assert run.wait_for("release: gate", 60) is not None, run.text()[-2000:]
