"""``trainguard index RUNS...``: (re)build the fleet database from run directories."""

from __future__ import annotations

import argparse
import logging

from trainguard.errors import EXIT_INPUT, EXIT_OK, InputError

HELP = "index run directories into the fleet database (idempotent)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", metavar="RUN", nargs="+", help="run directories to index")
    parser.add_argument(
        "--db", help="fleet database: a SQLite file or a postgresql:// URL (default: $TRAINGUARD_DB or "
        "~/.local/share/trainguard/fleet.db)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def run(args: argparse.Namespace) -> int:
    import sys

    from trainguard.cli.output import print_json
    from trainguard.health.fleetdb import FleetDB, FleetDBError

    results: list[dict[str, object]] = []
    failed = 0
    with FleetDB(args.db) as db:
        for path in args.runs:
            try:
                done = db.index(path)
                results.append({"run": path, "ok": True, "uid": done.uid, "run_id": done.run_id,
                                "new_events": done.new_events, "skipped_records": done.skipped})
            except FleetDBError:  # the database itself is unusable: no other run can be indexed either
                raise
            except InputError as exc:  # one bad run must not stop the others (a StorageError does)
                failed += 1
                results.append({"run": path, "ok": False, "error": str(exc)})
                print(f"trainguard index: warning: {path} not indexed: {exc}", file=sys.stderr)
        summary = {"db": db.location, "runs": results, "total_events": db.event_count()}
    if args.json:
        print_json(summary)
    else:
        for r in results:
            if r["ok"]:
                print(f"{r['run']}: {r['new_events']} new events (run {r['uid']})")
        print(f"{summary['db']}: {summary['total_events']} events in all")
    if failed:
        print(f"trainguard index: error: {failed} of {len(args.runs)} runs could not be indexed", file=sys.stderr)
    return EXIT_INPUT if failed else EXIT_OK
