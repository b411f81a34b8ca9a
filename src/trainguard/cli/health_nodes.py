"""``trainguard health --return-node NODE`` and ``trainguard health --drained``: the way back for drained nodes.

A node trainguard drained for this user (`trainguard.health.drain`) is resumed after ``--passes`` consecutive
passing rounds of that node's own health checks: run here when this host is the node, else the rounds the node
recorded in ``--run-dir`` (`trainguard.health.node_rounds`). A node drained by anyone else, for another user, or
not drained is refused (exit 3). A return is
recorded as a ``node_returned`` event in the maintenance folder beside the fleet database and indexed there,
so ``trainguard hosts`` shows it (and flags a node drained again soon after).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.core.events import NodeReturned
from trainguard.errors import EXIT_FAILURE, EXIT_INPUT, EXIT_OK, InputError, TrainguardError, UsageError

log = logging.getLogger(__name__)


def maintenance_dir(db: str | Path) -> Path:
    """Where returns are recorded (indexed like a run): ``<folder of the fleet database>/maintenance``, or for a
    database on a server this host's ``$XDG_DATA_HOME/trainguard/maintenance``."""
    from trainguard.health.fleetdb import data_dir

    return db.parent / "maintenance" if isinstance(db, Path) else data_dir() / "maintenance"


def _when(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "-"


def _state_json(s: Any) -> dict[str, Any]:
    return {"node": s.node, "state": s.state, "drained": s.drained, "reason": s.reason, "since": s.since,
            "by": s.by, "by_trainguard": s.by_trainguard}


def list_drained(args: argparse.Namespace) -> int:
    from trainguard.cli.output import print_json
    from trainguard.health.scheduler import open_adapter

    adapter = open_adapter(args.scheduler)
    states = adapter.drained()
    if args.json:
        print_json([_state_json(s) for s in states])
        return EXIT_OK
    if not states:
        print(f"no drained nodes in {adapter.name}")
        return EXIT_OK
    width = max(4, *(len(s.node) for s in states))
    print(f"{'node':<{width}}  {'state':<10} {'since':<16}  {'by':<10} trainguard  reason")
    for s in states:
        print(f"{s.node:<{width}}  {s.state:<10} {_when(s.since):<16}  {s.by or '-':<10} "
              f"{'yes' if s.by_trainguard else 'no':<10}  {s.reason}")
    return EXIT_OK


def _record(db: str | Path, outcome: Any, scheduler: str) -> Path:
    """Write the return and its last check round to the maintenance folder and index that folder."""
    from trainguard.core.rundir import RunDir
    from trainguard.health.fleetdb import FleetDB

    folder = maintenance_dir(db)
    state = outcome.state
    record = NodeReturned(time=time.time(), host=outcome.node, node=outcome.node, scheduler=scheduler,
                          passes=outcome.passes, drained_reason=state.reason if state else "",
                          drained_since=state.since if state else None, detail=outcome.detail)
    writer = "return-" + re.sub(r"[^A-Za-z0-9_.@-]", "_", outcome.node)
    with RunDir(folder).create().writer(writer) as w:
        for r in outcome.results:
            w.write(r.to_event(outcome.node))
        w.write(record)
    with FleetDB(db) as fleet:
        fleet.index(folder)
    return folder


def return_node(args: argparse.Namespace, config_for: Callable[[argparse.Namespace, str], Any]) -> int:
    from trainguard.cli.output import print_json
    from trainguard.health import run_checks
    from trainguard.health.drain import return_node as do_return
    from trainguard.health.fleetdb import resolve
    from trainguard.health.node_rounds import on_this_host, recorded_rounds
    from trainguard.health.scheduler import open_adapter

    node = args.return_node
    if args.node is not None and args.node != node:
        raise UsageError("--return-node runs the checks of that node: --node, if given, must name the same node")
    if not 1 <= args.passes <= 1000:
        raise UsageError("--passes must be from 1 to 1000")
    if not 0 <= args.pass_interval <= 86400:
        raise UsageError("--pass-interval must be from 0 to 86400 seconds")
    config = config_for(args, node)
    local = on_this_host(node)
    if not local and args.run_dir is None:
        raise UsageError(f"--return-node {node}: this host is not {node}; run it on {node}, or give --run-dir "
                         f"holding {node}'s own recorded checks (trainguard health --record on {node})")
    adapter = open_adapter(args.scheduler)
    if local:
        outcome = do_return(adapter, node, lambda: run_checks(config), passes=args.passes,
                            interval_seconds=args.pass_interval)
    else:  # this host's checks say nothing about the node: judge it by what it recorded itself
        run_dir = args.run_dir
        outcome = do_return(adapter, node, passes=args.passes, recorded=lambda st: recorded_rounds(run_dir, st))
    recorded = None
    if outcome.status == "returned":
        try:
            recorded = str(_record(resolve(args.db), outcome, adapter.name))
        except (TrainguardError, OSError) as exc:  # the node is back; only the record is missing
            log.warning("node %s returned, but the return was not recorded: %s", node, exc)
    if args.json:
        print_json({"node": node, "status": outcome.status, "detail": outcome.detail, "passes": outcome.passes,
                    "scheduler": adapter.name, "recorded_in": recorded,
                    "before": _state_json(outcome.state) if outcome.state else None,
                    "checks": [r.to_json() for r in outcome.results]})
    elif outcome.status == "refused":
        raise InputError(f"refused: {outcome.detail}")  # one line, exit 3
    elif outcome.status == "returned":
        print(f"node {node} returned to service in {adapter.name}: {outcome.detail} "
              f"(was drained: {outcome.state.reason if outcome.state else '?'})")
    else:
        print(f"node {node} not returned (still drained): {outcome.detail}")
    if outcome.status == "refused":
        return EXIT_INPUT
    return EXIT_OK if outcome.status == "returned" else EXIT_FAILURE


def run_nodes(args: argparse.Namespace, config_for: Callable[[argparse.Namespace, str], Any]) -> int:
    if args.return_node is not None and args.drained:
        raise UsageError("--return-node and --drained are separate actions: give one")
    if args.record:
        raise UsageError("--record applies to a plain check; --return-node records the return itself")
    if args.drained:
        return list_drained(args)
    return return_node(args, config_for)
