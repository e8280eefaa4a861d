"""A real PostgreSQL server for the tests (Debian `postgresql`): `initdb` and `pg_ctl` in a temporary folder.

PostgreSQL refuses to run as root, so under root the server runs as the `postgres` user (`runuser -u
postgres`) in a directory it owns; otherwise as the current user. It listens on a free loopback port (and a
Unix socket in its directory) with password authentication (SCRAM) for the superuser `modelsec`, so the
stores' password path is the one exercised. Durability settings are relaxed (`fsync=off`): the tests kill
clients, never the server. Each test takes a database of its own (`Postgres.new_database`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

USER = "modelsec"
_START_TIMEOUT_S = 30


def postgres_bin_dir() -> Path | None:
    """The directory of `initdb` and `pg_ctl`: Debian's newest `/usr/lib/postgresql/*/bin`, else PATH."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name or 0)
    )
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl", path=str(Path(found).parent)) else None


def postgres_missing_reason() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    if postgres_bin_dir() is None:
        return (
            "PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin or on "
            "PATH: apt-get install postgresql"
        )
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        return "psycopg is not installed: pip install 'modelsec[postgres]'"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no `postgres` user to run PostgreSQL as (it refuses root)"
        if shutil.which("runuser") is None:
            return "running as root without runuser (util-linux) to start PostgreSQL as `postgres`"
    return None


@dataclass
class Postgres:
    """A running server: superuser `modelsec` with `password`, on `127.0.0.1:port` and in `socket_dir`."""

    port: int
    password: str
    socket_dir: Path
    _names: Iterator[int] = field(default_factory=itertools.count)

    def url(self, database: str = "postgres") -> str:
        """A password-less `postgresql://` URI of `database` over loopback TCP."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """Create an empty database of its own for the caller; returns its URI (password not included)."""
        import psycopg

        name = f"t{next(self._names)}_{secrets.token_hex(4)}"
        with psycopg.connect(self.url(), password=self.password, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def run_postgres() -> Iterator[Postgres]:
    """Start a throw-away server (see the module docstring) and stop it afterwards."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise RuntimeError(postgres_missing_reason())
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    # Not under pytest's tmp_path: as root that is private to root, and the server's user must own its files.
    root = Path(tempfile.mkdtemp(prefix="modelsec-pg-"))
    password = secrets.token_urlsafe(16)
    data, log, pwfile = root / "data", root / "server.log", root / "pwfile"
    pwfile.write_text(password + "\n")
    if as_root:
        owner = pwd.getpwnam("postgres")
        for path in (root, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    port = _free_port()
    try:
        subprocess.run(
            [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--auth=scram-sha-256",
             f"--pwfile={pwfile}", "--encoding=UTF8", "--locale=C", "--no-sync"],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c full_page_writes=off "
            "-c synchronous_commit=off -c max_connections=50"
        )
        subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
             "-w", "-t", str(_START_TIMEOUT_S), "start"],
            check=True, capture_output=True, text=True, timeout=_START_TIMEOUT_S + 10,
        )  # fmt: skip
    except subprocess.CalledProcessError as e:
        server_log = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {e.stderr[-3000:]}\n{server_log}") from e
    try:
        yield Postgres(port, password, root)
    finally:
        subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
