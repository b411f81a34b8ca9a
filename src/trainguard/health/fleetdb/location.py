"""Where the fleet database is: a SQLite file path or a ``postgresql://`` URL, the default, and a display form.

A URL may carry a password; it is never shown: `redact` replaces it wherever the location is printed or
logged, and `scrub` takes it out of a server's error text. The libpq environment (``PGPASSWORD``,
``~/.pgpass``) keeps it off the command line altogether (docs/security.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from trainguard.errors import UsageError

URL_SCHEMES = ("postgresql://", "postgres://")
"""What makes a location a PostgreSQL server rather than a file (libpq's two spellings)."""
HIDDEN = "***"

Location = str | os.PathLike[str]
"""A file path (SQLite) or a ``postgresql://`` URL."""


def is_url(location: Location | None) -> bool:
    """Whether ``location`` names a PostgreSQL server (a ``postgresql://`` or ``postgres://`` URL)."""
    return isinstance(location, str) and location.lower().startswith(URL_SCHEMES)


def default_db_path() -> Path:
    """``$TRAINGUARD_DB``, else ``$XDG_DATA_HOME/trainguard/fleet.db`` (``~/.local/share`` by default).

    The file default only: `default_location` is what a verb opens (``$TRAINGUARD_DB`` may be a URL)."""
    env = os.environ.get("TRAINGUARD_DB")
    if env and not is_url(env):
        return Path(env)
    return data_dir() / "fleet.db"


def data_dir() -> Path:
    """``$XDG_DATA_HOME/trainguard`` (``~/.local/share/trainguard`` by default): this host's own files."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "trainguard"


def default_location() -> str | Path:
    """``$TRAINGUARD_DB`` as given (a URL stays a URL), else the default file (`default_db_path`)."""
    env = os.environ.get("TRAINGUARD_DB")
    if env and is_url(env):
        return env
    return default_db_path()


def resolve(given: Location | None) -> str | Path:
    """The location a verb opens: ``given`` (a URL kept as text, anything else a path) or the default."""
    if given is None or given == "":
        return default_location()
    if is_url(given):
        return str(given)
    return Path(given)


def _password(url: str) -> str | None:
    parts = urlsplit(url)
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "password":
            return value
    return unquote(parts.password) if parts.password else None


# Up to the last "@": a password holding "@" or "/" unencoded is still hidden whole (showing too little is safe).
_USERINFO_PASSWORD = re.compile(r"^([A-Za-z]+://[^:/?#@]*):.*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def redact(location: Location) -> str:
    """``location`` fit to print: a URL's password (in the user part or a ``password=`` parameter) is ``***``;
    the rest is left exactly as given."""
    if not is_url(location):
        return str(location)
    text = _USERINFO_PASSWORD.sub(lambda m: f"{m.group(1)}:{HIDDEN}@", str(location), count=1)
    return _QUERY_PASSWORD.sub(lambda m: m.group(1) + HIDDEN, text)


def scrub(text: str, location: Location) -> str:
    """``text`` (a server's or driver's message) with the password of ``location`` taken out, if it is there."""
    if not is_url(location):
        return text
    try:
        secret = _password(str(location))
    except ValueError:
        return text
    if not secret:
        return text
    for form in {secret, quote(secret, safe="")}:
        text = text.replace(form, HIDDEN)
    return text


_PORT = re.compile(r"^\d{1,5}(,\d{1,5})*$")


def check_url(url: str) -> None:
    """`UsageError` (exit 2) for a URL that libpq would refuse before connecting (a bad port, an unknown
    parameter), with the password redacted; needs nothing installed."""
    shown = redact(url)
    try:
        parts = urlsplit(url)
        port = parts.netloc.rsplit("@", 1)[-1]
        port = port.rsplit("]", 1)[-1]
        port = port.rsplit(":", 1)[1] if ":" in port else ""
    except ValueError as exc:
        raise UsageError(f"bad fleet database URL {shown}: {exc}") from None
    if port and not _PORT.match(port):
        raise UsageError(f"bad fleet database URL {shown}: the port must be a number")
    if "\n" in url or "\r" in url:
        raise UsageError(f"bad fleet database URL {shown}: it holds a line break")
