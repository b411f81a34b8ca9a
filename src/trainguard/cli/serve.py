"""``trainguard serve [RUNS...]``: the read-only dashboard over run directories and the fleet database.

Every request needs a token, on loopback too: other users of the same machine reach 127.0.0.1 as well,
and the dashboard (running as its owner) can read logs they cannot. Without ``--token`` or
``$TRAINGUARD_TOKEN`` one is generated and printed once, inside the address to open (as Jupyter does).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import secrets
import socket
import sys
from pathlib import Path

from trainguard.errors import EXIT_OK, UsageError

HELP = "read-only web dashboard of runs: progress, lost time, interruptions, simulations (docs/dashboard.md)"

log = logging.getLogger(__name__)

TOKEN_ENV = "TRAINGUARD_TOKEN"
MIN_TOKEN_LENGTH = 16
"""Shortest token accepted: it is the only thing between the network and the runs' logs."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", metavar="RUNS", nargs="*",
                        help="run directories or folders of them (default: ./runs and the fleet database)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other needs a token)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free port)")
    parser.add_argument("--db", metavar="DB",
                        help="also list the runs of this fleet database, a SQLite file or a postgresql:// URL "
                             "(default when no RUNS are given: $TRAINGUARD_DB or ~/.local/share/trainguard/fleet.db, "
                             "if it exists)")
    parser.add_argument("--token", default=None,
                        help=f"the token every request needs (default ${TOKEN_ENV}; on loopback without either, "
                             "one is generated and printed in the address); needed to listen on a non-loopback "
                             f"address. Other local users see command lines: prefer ${TOKEN_ENV}")
    parser.add_argument("--poll", type=float, default=5.0, metavar="SECONDS",
                        help="how often open pages of unfinished runs refresh (default 5; 0 = never)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_options(args: argparse.Namespace) -> str | None:
    """Usage errors (exit 2); returns the token given (None: none given, on loopback: one is generated)."""
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and not token:
        raise UsageError(f"--host {args.host} is not a loopback address: anyone who can reach it could read the "
                         f"runs; give --token TOKEN (or set {TOKEN_ENV}), or keep the default 127.0.0.1")
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise UsageError(f"the token must have at least {MIN_TOKEN_LENGTH} characters "
                         "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {args.port}")
    if not (math.isfinite(args.poll) and 0 <= args.poll <= 3600):
        raise UsageError(f"--poll must be between 0 and 3600 seconds, not {args.poll}")
    return token


def generate_token() -> str:
    """A fresh token (32 URL-safe characters, 192 random bits) for a dashboard started without one."""
    return secrets.token_urlsafe(24)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is one clear line before anything starts."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, family if host != "localhost" else socket.AF_INET,
                                   socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    af, kind, proto, _, addr = infos[0]
    sock = socket.socket(af, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    from trainguard.web.render import require

    token = check_options(args)
    require("starlette", "uvicorn", "jinja2", "plotly", what="trainguard serve")
    import uvicorn

    from trainguard.health.fleetdb import default_location
    from trainguard.web.app import COOKIE, create_app
    from trainguard.web.catalog import Catalog

    paths = list(args.runs)
    db = args.db
    if not paths and db is None:  # the defaults: what a plain `trainguard serve` would be expected to show
        paths = ["runs"] if Path("runs").is_dir() else []
        default = default_location()
        db = str(default) if isinstance(default, str) or default.is_file() else None
    catalog = Catalog(paths, db)
    catalog.check()
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    count = len(catalog.entries())
    shown = f"[{host}]" if ":" in host else host
    if token is None:
        # Printed once, in the address itself, so the owner's first click also trades it for a cookie.
        token = generate_token()
        print(f"trainguard serve: {count} run(s) at http://{shown}:{port}/?token={token}", file=sys.stderr, flush=True)
    else:
        print(f"trainguard serve: {count} run(s) at http://{shown}:{port}/ (token required: open it once with "
              "?token=TOKEN)", file=sys.stderr, flush=True)
    if args.token is not None:
        print(f"trainguard serve: warning: --token is visible to other local users in the process list; "
              f"prefer {TOKEN_ENV}", file=sys.stderr, flush=True)
    app = create_app(catalog, token=token, loopback_only=is_loopback(args.host), poll_seconds=args.poll,
                     extra_hosts=[args.host, shown], cookie_name=f"{COOKIE}_{port}")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    server.run(sockets=[sock])
    return EXIT_OK
