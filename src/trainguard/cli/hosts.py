"""``trainguard hosts``: rank the fleet's hosts by their lemon score, flagged ones first."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.errors import InputError, StorageError, UsageError

if TYPE_CHECKING:
    from trainguard.health.drain_history import HostDrains
    from trainguard.health.fleetdb import FleetDB
    from trainguard.health.lemon import HostScore, LemonPolicy

HELP = "rank hosts by how often they broke jobs (lemon-node score) from the fleet database"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list, worst host first")
    parser.add_argument("--db", help="fleet database: a SQLite file or a postgresql:// URL (default: $TRAINGUARD_DB "
                                     "or ~/.local/share/trainguard/fleet.db)")
    parser.add_argument("--threshold", type=float, default=None, help="score at which a host is flagged (6)")
    parser.add_argument("--half-life-days", type=float, default=None, help="decay half-life in days (30; 0 = none)")
    parser.add_argument("--flagged", action="store_true", help="list only flagged hosts")
    parser.add_argument("--drained", action="store_true",
                        help="list only hosts the drain policy acted on (drained, refused, returned)")
    parser.add_argument("--links", action="store_true",
                        help="list link-level history instead: runs in which each HCA port or NVLink failed or "
                             "had transient errors (a flapping cable shows up before it fails a job)")
    parser.add_argument("--redrain-window-days", type=float, default=7.0, metavar="D",
                        help="flag a host drained again within D days of its return (default 7)")


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import print_json
    from trainguard.health.drain_history import summarize as summarize_drains
    from trainguard.health.lemon import rank_hosts

    where = _where(args.db)
    policy = _policy(args)
    if args.links:
        return _links(where, args.json)
    try:
        with _open(where) as db:
            scores = rank_hosts(db, policy=policy)
            drains = summarize_drains(db.drain_history(), redrain_window_seconds=args.redrain_window_days * 86400)
    except StorageError as exc:  # this verb only reads: a database it cannot open is bad input
        raise InputError(str(exc)) from None
    if args.flagged:
        scores = [s for s in scores if s.flagged]
    if args.drained:
        scores = [s for s in scores if s.host in drains]
    if args.json:
        print_json([{**s.to_json(), "drains": drains[s.host].to_json() if s.host in drains else None}
                    for s in scores])
        return 0
    if not scores:
        print("no hosts with a history in the fleet database" if not args.flagged else "no flagged hosts")
        return 0
    _print_scores(scores, policy)
    shown = [drains[s.host] for s in scores if s.host in drains]
    if shown:
        _print_drains(shown, args.redrain_window_days)
    return 0


def _where(given: str | None) -> str | Path:
    """The database to read: a file that must exist, or a URL."""
    from trainguard.health.fleetdb import resolve

    where = resolve(given)
    if isinstance(where, Path):
        if not where.exists():
            raise InputError(f"{where}: no fleet database (index runs first: trainguard index RUN_DIR)")
        if where.is_dir():
            raise InputError(f"{where}: is a directory, not a fleet database")
    return where


def _open(where: str | Path) -> FleetDB:
    """The database, read-only on a server (this verb never writes; a file is opened as `index` does)."""
    from trainguard.health.fleetdb import FleetDB

    return FleetDB(where, read_only=isinstance(where, str))


def _policy(args: argparse.Namespace) -> LemonPolicy:
    """The lemon policy the flags ask for; `UsageError` for a bad number (also of ``--redrain-window-days``)."""
    from trainguard.health.lemon import LemonPolicy

    base = LemonPolicy()
    threshold = base.threshold if args.threshold is None else args.threshold
    half_life = base.half_life_days if args.half_life_days is None else args.half_life_days
    if not 0 < threshold < 1e9:
        raise UsageError("--threshold must be a positive number")
    if not 0 <= half_life < 1e6:
        raise UsageError("--half-life-days must be >= 0")
    if not 0 < args.redrain_window_days < 1e6:
        raise UsageError("--redrain-window-days must be a positive number")
    return LemonPolicy(threshold=threshold, half_life_days=half_life)


def _print_scores(scores: list[HostScore], policy: LemonPolicy) -> None:
    from trainguard.cli.output import print_text

    width = max(len(s.host) for s in scores)
    print(f"{'host':<{width}}  {'score':>6}  flag  incidents  last seen         reasons")
    for s in scores:
        seen = dt.datetime.fromtimestamp(s.last_seen, dt.UTC).strftime("%Y-%m-%d %H:%M")
        flag = "LEMON" if s.flagged else ""
        print_text(f"{s.host:<{width}}  {s.score:6.2f}  {flag:5} {s.incidents:9d}  {seen}  {'; '.join(s.reasons)}")
    print(f"(flagged: score >= {policy.threshold:g} and >= {policy.min_incidents} separate incidents; "
          f"half-life {policy.half_life_days:g} days)")


def _print_drains(shown: list[HostDrains], window_days: float) -> None:
    from trainguard.cli.output import print_text

    def when(t: float | None) -> str:
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M") if t else "-"

    width = max(4, *(len(h.host) for h in shown))
    print()
    print("drained by trainguard (times UTC)")
    print(f"{'host':<{width}}  {'state':<14} drains returns refused  {'last drained':<16}  {'returned':<16}  reason")
    for h in shown:
        state = "DRAINED AGAIN" if h.redrained and h.state == "drained" else h.state
        print_text(f"{h.host:<{width}}  {state:<14} {h.drained:6d} {h.returned:7d} {h.refused:7d}  "
                   f"{when(h.last_drained):<16}  {when(h.last_returned):<16}  {h.last_reason}")
    print(f"(DRAINED AGAIN: drained within {window_days:g} days of being returned)")



def _links(where: str | Path, as_json: bool) -> int:
    from trainguard.cli.output import print_json, print_text
    from trainguard.health.link_history import FLAPPING_RUNS, summarize

    try:
        with _open(where) as db:
            links = summarize(db.link_history())
    except StorageError as exc:  # this verb only reads: a database it cannot open is bad input
        raise InputError(str(exc)) from None
    if as_json:
        print_json([h.to_json() for h in links])
        return 0
    if not links:
        print("no link-level history in the fleet database")
        return 0
    hw = max(4, *(len(h.host) for h in links))
    lw = max(4, *(len(h.link) for h in links))
    print(f"{'host':<{hw}}  {'link':<{lw}}  failed  flapped  flag      last seen")
    for h in links:
        seen = dt.datetime.fromtimestamp(h.last_seen, dt.UTC).strftime("%Y-%m-%d %H:%M")
        flag = "FLAPPING" if h.flapping else ""
        print_text(f"{h.host:<{hw}}  {h.link:<{lw}}  {len(h.failed_runs):6d}  {len(h.flapped_runs):7d}  "
                   f"{flag:<8}  {seen}")
    print(f"(failed/flapped: runs with failing / only transient lines on the link; FLAPPING: transient in "
          f">= {FLAPPING_RUNS} runs)")
    return 0
