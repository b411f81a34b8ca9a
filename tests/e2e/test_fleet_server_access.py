"""Reaching the fleet database on a PostgreSQL server: passwords from the libpq environment and never printed,
and a bad URL, an unreachable server, a wrong password or a database that is not trainguard's as one line with
the documented exit code (docs/fleetdb.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cli import Result, assert_one_line_error
from tests.postgres_server import PASSWORD, PASSWORD_USER, PostgresServer
from trainguard.errors import UsageError
from trainguard.health.fleetdb import FleetDB, FleetDBError
from trainguard.samples import SAMPLE_RUN


def _trainguard(*args: str, env: dict[str, str], home: Path) -> Result:
    """The CLI with a libpq environment of the test's own (none of the caller's PG* variables, no ~/.pgpass)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    full = {**clean, "HOME": str(home), "PGPASSFILE": str(home / "no-pgpass"), **env}
    p = subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True, timeout=120,
                       env=full)
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def db_name(postgres_server: PostgresServer) -> str:
    return postgres_server.new_database()


def test_the_password_comes_from_pgpassword_or_pgpass_and_is_never_printed(
        tmp_path: Path, postgres_server: PostgresServer, db_name: str) -> None:
    url = postgres_server.tcp_url(db_name)  # no password in it
    r = _trainguard("index", str(SAMPLE_RUN), "--db", url, "--json", env={"PGPASSWORD": PASSWORD}, home=tmp_path)
    assert r.code == 0, r.err
    total = json.loads(r.out)["total_events"]
    assert total > 0
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{postgres_server.port}:{db_name}:{PASSWORD_USER}:{PASSWORD}\n")
    pgpass.chmod(0o600)
    r = _trainguard("hosts", "--db", url, "--json", env={"PGPASSFILE": str(pgpass)}, home=tmp_path)
    assert r.code == 0, r.err
    assert {h["host"] for h in json.loads(r.out)} == {"node-a", "node-b"}
    # in the URL it works too, and is shown as *** wherever the database is named
    with_password = postgres_server.tcp_url(db_name, password=PASSWORD)
    r = _trainguard("-v", "index", str(SAMPLE_RUN), "--db", with_password, "--json", env={}, home=tmp_path)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["db"] == f"postgresql://{PASSWORD_USER}:***@127.0.0.1:{postgres_server.port}/{db_name}"
    assert doc["total_events"] == total
    assert PASSWORD not in r.out + r.err


def test_a_missing_or_wrong_password_is_one_line_exit_4_without_the_password(
        tmp_path: Path, postgres_server: PostgresServer, db_name: str) -> None:
    r = _trainguard("index", str(SAMPLE_RUN), "--db", postgres_server.tcp_url(db_name), env={}, home=tmp_path)
    assert_one_line_error(r, 4)
    assert "cannot connect to the fleet database" in r.err and "password" in r.err
    wrong = "Wr0ng-" + PASSWORD
    r = _trainguard("index", str(SAMPLE_RUN), "--db", postgres_server.tcp_url(db_name, password=wrong), env={},
                    home=tmp_path)
    assert_one_line_error(r, 4)
    assert "password authentication failed" in r.err and wrong not in r.err and ":***@" in r.err
    # `hosts` only reads: a database it cannot reach is bad input there
    r = _trainguard("hosts", "--db", postgres_server.tcp_url(db_name, password=wrong), env={}, home=tmp_path)
    assert_one_line_error(r, 3)
    assert wrong not in r.err


def test_an_unreachable_server_and_a_bad_url_are_one_line_errors(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://someone:hunter2-secret@127.0.0.1:{port}/fleet"
    r = _trainguard("index", str(SAMPLE_RUN), "--db", url, env={}, home=tmp_path)
    assert_one_line_error(r, 4)
    assert "cannot connect" in r.err and "hunter2-secret" not in r.err and "someone:***@" in r.err
    r = _trainguard("hosts", "--db", url, env={}, home=tmp_path)
    assert_one_line_error(r, 3)
    for bad in ("postgresql://someone:hunter2-secret@127.0.0.1:port/fleet",
                "postgresql://someone:hunter2-secret@127.0.0.1/fleet?bogus=1"):
        r = _trainguard("index", str(SAMPLE_RUN), "--db", bad, env={}, home=tmp_path)
        assert_one_line_error(r, 2)
        assert "bad fleet database URL" in r.err and "hunter2-secret" not in r.err
    r = _trainguard("run", "--fleet-db", "postgresql://u:hunter2-secret@h:port/db", "--run-dir", str(tmp_path / "r"),
                    "--", "true", env={}, home=tmp_path)
    assert_one_line_error(r, 2)
    assert "hunter2-secret" not in r.err


def test_reading_verbs_never_write_a_database_trainguard_has_not_made(
        tmp_path: Path, postgres_server: PostgresServer, db_name: str) -> None:
    url = postgres_server.url(db_name)
    r = _trainguard("hosts", "--db", url, env={}, home=tmp_path)
    assert_one_line_error(r, 3)
    assert "not a fleet database yet" in r.err
    r = _trainguard("serve", "--db", url, "--port", "0", env={}, home=tmp_path)
    assert_one_line_error(r, 3)
    from trainguard.launch.admission import lemon_reasons
    from trainguard.launch.config import SupervisorConfig

    cfg = SupervisorConfig(command=("true",), run_dir=tmp_path / "run", run_id="r", node_id="n",
                           rdzv_endpoint="127.0.0.1:29500", fleet_db=url)
    assert lemon_reasons(cfg) == []  # no history yet: no lemon check, and nothing created
    import psycopg

    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'"
                            ).fetchone() == (0,)


def test_a_database_that_is_not_trainguards_or_is_newer_is_refused(
        tmp_path: Path, postgres_server: PostgresServer, db_name: str) -> None:
    import psycopg

    url = postgres_server.url(db_name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE runs (somebody_elses INTEGER)")
    r = _trainguard("index", str(SAMPLE_RUN), "--db", url, env={}, home=tmp_path)
    assert_one_line_error(r, 3)
    assert "trainguard did not create" in r.err
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE runs")
    with FleetDB(url) as db:
        db.index(SAMPLE_RUN)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE trainguard_layout SET version = 99")
    with pytest.raises(FleetDBError, match="layout 99 is newer"):
        FleetDB(url)
    r = _trainguard("hosts", "--db", url, env={}, home=tmp_path)
    assert_one_line_error(r, 3)


def test_without_the_driver_a_url_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without trainguard[postgres] sees
    with pytest.raises(UsageError, match=r"pip install 'trainguard\[postgres\]'"):
        FleetDB("postgresql://someone@127.0.0.1:1/fleet")


def test_the_run_config_records_the_database_without_its_password(tmp_path: Path) -> None:
    from trainguard.launch.config import SupervisorConfig

    cfg = SupervisorConfig(command=("true",), run_dir=tmp_path / "run", run_id="r", node_id="n",
                           rdzv_endpoint="127.0.0.1:29500", fleet_db="postgresql://tg:hunter2-secret@db.example:5432/fleet")
    assert cfg.to_json()["fleet_db"] == "postgresql://tg:***@db.example:5432/fleet"
    assert "hunter2-secret" not in json.dumps(cfg.to_json())
