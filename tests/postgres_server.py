"""A private, throwaway PostgreSQL server for the fleet database tests (Debian's postgresql package).

One server per test session (per pytest-xdist worker): ``initdb`` and ``pg_ctl`` in a temporary folder, a
free TCP port on 127.0.0.1 and the Unix socket in that folder, fsync off (nothing in it outlives the
session). PostgreSQL refuses to run as root, so under root the server runs as the ``postgres`` system user
that Debian's package creates (``nobody`` where there is none) through ``runuser``; the folder is handed to
that user. Each test gets a fresh database (`PostgresServer.new_database`).

Missing binaries fail the tests that need them, loudly: scripts/setup installs them. Only
``TRAINGUARD_TEST_NO_POSTGRES=1`` turns that into a skip, for a machine known to have none.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

NO_POSTGRES_ENV = "TRAINGUARD_TEST_NO_POSTGRES"
SUPERUSER = "trainguard"
PASSWORD_USER = "tg_password_user"
PASSWORD = "s3cret-Pa55word"
"""A role that logs in over TCP with a password (scram), for the credential tests."""


def bin_dir() -> Path | None:
    """Where initdb, pg_ctl and postgres are: ``$TRAINGUARD_PG_BINDIR``, Debian's newest
    /usr/lib/postgresql/N/bin, or the PATH."""
    env = os.environ.get("TRAINGUARD_PG_BINDIR")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).parent if which else None


def require_postgres() -> Path:
    """The binaries' folder, or fail (skip only when `NO_POSTGRES_ENV` says so)."""
    where = bin_dir()
    problem = None
    if where is None or not (where / "pg_ctl").exists():
        problem = "PostgreSQL's initdb/pg_ctl were not found (run scripts/setup: it installs Debian's postgresql)"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            problem = "psycopg is not installed (pip install -e '.[postgres]'; scripts/setup does)"
    if problem is None:
        assert where is not None
        return where
    if os.environ.get(NO_POSTGRES_ENV) == "1":
        pytest.skip(f"{problem}; {NO_POSTGRES_ENV}=1")
    pytest.fail(f"{problem}. Set {NO_POSTGRES_ENV}=1 only on a machine that cannot have it.", pytrace=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The user the server runs as (None: this one, when it is not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists to run the server as")


@dataclass
class PostgresServer:
    """A running server; `stop` ends it and removes its folder."""

    bindir: Path
    root: Path
    port: int
    user: str | None
    _names: Any = field(default_factory=lambda: itertools.count())

    @property
    def socket_dir(self) -> str:
        return str(self.root)

    def url(self, dbname: str = "postgres") -> str:
        """The superuser's URL through the Unix socket (trust: no password)."""
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.socket_dir}&port={self.port}"

    def tcp_url(self, dbname: str, *, password: str | None = None) -> str:
        """The password role's URL over TCP (scram); with ``password``, in the URL itself."""
        cred = f"{PASSWORD_USER}:{password}" if password is not None else PASSWORD_USER
        return f"postgresql://{cred}@127.0.0.1:{self.port}/{dbname}"

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", self.user, "--", *args] if self.user else list(args)

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self) -> str:
        """A fresh, empty database (owned by the password role too); its name."""
        name = f"fleet_{os.getpid()}_{next(self._names)}"
        self.admin(f"CREATE DATABASE {name} OWNER {PASSWORD_USER} TEMPLATE template0 STRATEGY FILE_COPY")
        return name

    def start(self) -> None:
        data = self.root / "data"
        pwfile = self.root / "pw"
        pwfile.write_text("unused-superuser-password\n")
        if self.user:
            shutil.chown(self.root, self.user)
            shutil.chown(pwfile, self.user)
        subprocess.run(self._cmd(str(self.bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--no-sync",
                                 "-E", "UTF8", "--locale=C.UTF-8", "--auth-local=trust", "--auth-host=scram-sha-256",
                                 f"--pwfile={pwfile}"),
                       check=True, capture_output=True, timeout=120)
        opts = (f"-p {self.port} -k {self.root} -h 127.0.0.1 -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB")
        subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "-D", str(data), "-l", str(self.root / "log"),
                                 "-o", opts, "-w", "-t", "60", "start"),
                       check=True, capture_output=True, timeout=90)
        self.admin(f"CREATE ROLE {PASSWORD_USER} LOGIN PASSWORD '{PASSWORD}'")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                                     "-w", "stop"), capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def start_server() -> PostgresServer:
    """Start a private server (fails or skips as `require_postgres` says when it cannot be had)."""
    bindir = require_postgres()
    # Not under pytest's tmp_path: its folders are 0700 root's, which the server's user cannot enter.
    root = Path(tempfile.mkdtemp(prefix="tg-pg-"))
    server = PostgresServer(bindir=bindir, root=root, port=_free_port(), user=_run_as())
    try:
        server.start()
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log = server.log_tail()
        server.stop()
        pytest.fail(f"could not start PostgreSQL from {bindir}: {exc}\n{detail.decode(errors='replace')}\n{log}",
                    pytrace=False)
    return server
