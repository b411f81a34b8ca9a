"""``trainguard index RUNS...``: (re)build the fleet database from run directories."""

from __future__ import annotations

import argparse

from trainguard.errors import EXIT_INPUT, EXIT_OK, InputError

HELP = "index run directories into the fleet database (idempotent)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", metavar="RUN", nargs="+", help="run directories to index")
    parser.add_argument(
        "--db", help="fleet database file (default: $TRAINGUARD_DB or ~/.local/share/trainguard/fleet.db)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def run(args: argparse.Namespace) -> int:
    import sys

    from trainguard.cli.output import print_json
    from trainguard.fleetdb import FleetDB

    results: list[dict[str, object]] = []
    failed = 0
    with FleetDB(args.db) as db:
        for path in args.runs:
            try:
                new = db.index_run(path)
                results.append({"run": path, "ok": True, "new_events": new})
            except InputError as exc:  # one bad run must not stop the others
                failed += 1
                results.append({"run": path, "ok": False, "error": str(exc)})
                print(f"trainguard index: error: {exc}", file=sys.stderr)
        summary = {"db": str(db.path), "runs": results, "total_events": db.event_count()}
    if args.json:
        print_json(summary)
    else:
        for r in results:
            if r["ok"]:
                print(f"{r['run']}: {r['new_events']} new events")
        print(f"{summary['db']}: {summary['total_events']} events in all")
    return EXIT_INPUT if failed else EXIT_OK
