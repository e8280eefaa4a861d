"""A command on a real pseudo-terminal: a detached tmux session whose output is piped to a file.

`tmux pipe-pane` copies every byte the command writes to the terminal, so a transient status line that is
erased before the command ends is still seen (and when). tmux is a Debian package (`make .venv/.test`).
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["TerminalRun", "on_terminal", "tmux_missing_reason"]


def tmux_missing_reason() -> str | None:
    """Why the terminal tests cannot run here, or None."""
    return None if shutil.which("tmux") else "tmux not installed (Debian package tmux; make .venv/.test)"


class TerminalRun:
    """A command started on a tmux pane at `started` (time.monotonic()), its terminal bytes in `log`."""

    def __init__(self, session: str, log: Path, done: Path, started: float) -> None:
        self.session, self.log, self.done, self.started = session, log, done, started

    def text(self) -> str:
        """Everything written to the terminal so far (escape sequences included)."""
        return self.log.read_bytes().decode(errors="replace") if self.log.exists() else ""

    def wait_for(self, needle: str, timeout: float) -> float | None:
        """Seconds from the start until `needle` appeared on the terminal, or None within `timeout`."""
        while time.monotonic() - self.started < timeout:
            if needle in self.text():
                return time.monotonic() - self.started
            time.sleep(0.02)
        return None

    def wait_done(self, timeout: float) -> int:
        """The command's exit status once it ended (fails the test after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while not self.done.exists():
            assert time.monotonic() < deadline, f"still running after {timeout} s:\n{self.text()[-2000:]}"
            time.sleep(0.05)
        time.sleep(0.1)  # pipe-pane copies the last bytes asynchronously
        return int(self.done.read_text().strip() or "-1")


@contextlib.contextmanager
def on_terminal(
    argv: Sequence[str | Path],
    workdir: Path,
    env: Mapping[str, str] | None = None,
    redirect_stderr: Path | None = None,
) -> Iterator[TerminalRun]:
    """Run the installed `modelsec` with `argv` on a fresh 200x50 tmux pane; kill the session on exit."""
    exe = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"
    session = f"modelsec-test-{uuid.uuid4().hex[:8]}"
    log, done = workdir / f"{session}.log", workdir / f"{session}.rc"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    command = shlex.join([exe, *map(str, argv)])
    if redirect_stderr is not None:
        command += f" 2>{shlex.quote(str(redirect_stderr))}"
    # The command waits for one Enter, so that the pipe is in place before its first byte.
    script = f"read -r _; env {exports} {command}; echo $? > {shlex.quote(str(done))}; sleep 60"
    tmux = ["tmux", "-L", session, "-f", "/dev/null"]
    size = ["-x", "200", "-y", "50"]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, *size, "bash", "--norc", "-c", script], check=True
    )
    try:
        subprocess.run(
            [*tmux, "pipe-pane", "-t", session, "-o", f"cat >> {shlex.quote(str(log))}"], check=True
        )
        started = time.monotonic()
        subprocess.run([*tmux, "send-keys", "-t", session, "Enter"], check=True)
        yield TerminalRun(session, log, done, started)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, capture_output=True)
