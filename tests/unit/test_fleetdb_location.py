"""Fleet database locations: a file or a ``postgresql://`` URL, and a URL's password never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.errors import UsageError
from trainguard.health.fleetdb.location import check_url, default_location, is_url, redact, resolve, scrub


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://tg:s3cret@db:5432/fleet", "postgresql://tg:***@db:5432/fleet"),
    ("postgres://tg:p%40ss@db/fleet?sslmode=require", "postgres://tg:***@db/fleet?sslmode=require"),
    ("postgresql://tg@db/fleet?password=s3cret&sslmode=verify-full", "postgresql://tg@db/fleet?password=***&sslmode=verify-full"),
    ("postgresql://tg@/fleet?host=/run/postgresql", "postgresql://tg@/fleet?host=/run/postgresql"),
    ("postgresql:///fleet", "postgresql:///fleet"),
    ("postgresql://tg:s3cret@/with/slash@db/fleet", "postgresql://tg:***@db/fleet"),
])
def test_redact_hides_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert "s3cret" not in redact(url) and "p%40ss" not in redact(url)


def test_scrub_takes_the_password_out_of_a_message() -> None:
    url = "postgresql://tg:p%40ss@db/fleet"
    assert scrub("FATAL: role tg with p@ss and p%40ss", url) == "FATAL: role tg with *** and ***"
    assert scrub("nothing secret", "postgresql://tg@db/fleet") == "nothing secret"


def test_a_url_stays_text_and_anything_else_is_a_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert is_url("postgresql://h/db") and is_url("POSTGRES://h/db") and not is_url(Path("postgresql:/h/db"))
    assert resolve("postgresql://h/db") == "postgresql://h/db"
    assert resolve(str(tmp_path / "f.db")) == tmp_path / "f.db"
    monkeypatch.setenv("TRAINGUARD_DB", "postgresql://tg@h/fleet")
    assert default_location() == "postgresql://tg@h/fleet" and resolve(None) == "postgresql://tg@h/fleet"
    monkeypatch.setenv("TRAINGUARD_DB", str(tmp_path / "x.db"))
    assert resolve(None) == tmp_path / "x.db"


@pytest.mark.parametrize("bad", ["postgresql://tg:s3cret@h:port/db", "postgresql://tg:s3cret@[::1:5432/db"])
def test_a_malformed_url_is_a_usage_error_without_the_password(bad: str) -> None:
    with pytest.raises(UsageError, match="bad fleet database URL") as err:
        check_url(bad)
    assert "s3cret" not in str(err.value)
