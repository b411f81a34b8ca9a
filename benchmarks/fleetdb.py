"""Benchmark: many writers indexing into the fleet database, SQLite file against a PostgreSQL server.

W processes (agents of W hosts) each index their own R runs (a job's 4-host run of 40 steps and a failure, as
an agent indexes at the end of a job) into one fresh database; the clock runs from the moment all W are
ready until the last finishes. Engines are interleaved per repetition (SQLite first, then PostgreSQL, for each
W) so that both see the same machine load; the anchor is SQLite at the same W, and the figure is the ratio.
Also: a `trainguard hosts`-style read (`host_history` + lemon scoring) of the result, timed on both.

The server is a private one started as the tests start theirs (tests/postgres_server.py: fsync off, Unix
socket), so its figures are a lower bound on a networked, durable server's latency.

    python benchmarks/fleetdb.py --writers 1 4 8 --runs 6 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.postgres_server

from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    Diagnosis,
    FailureDetected,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from trainguard.core.rundir import RunDir
from trainguard.health.fleetdb import FleetDB
from trainguard.health.lemon import score_hosts

HOSTS_PER_RUN, STEPS = 4, 40


def _write_run(root: Path, writer: int, k: int) -> Path:
    rd = RunDir(root / f"w{writer}-r{k}").create()
    t0 = 1_780_000_000.0 + writer * 10_000 + k * 100
    hosts = tuple(f"node-{(writer * 3 + k + i) % 64:02d}" for i in range(HOSTS_PER_RUN))
    with rd.writer(f"agent-{hosts[0]}") as w:
        w.write(RunStarted(time=t0, host=hosts[0], run_id=f"w{writer}-r{k}", world_size=HOSTS_PER_RUN))
        w.write(AttemptStarted(time=t0 + 1, host=hosts[0], attempt=0, hosts=hosts))
        w.write(FailureDetected(time=t0 + 50, host=hosts[0], attempt=0, kind="crash", hosts=(hosts[1],)))
        w.write(Diagnosis(time=t0 + 51, host=hosts[0], attempt=0, category="Faulty GPU", group="GPU",
                          culprit_hosts=(hosts[1],), confidence=0.9,
                          evidence=("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",)))
        w.write(AttemptEnded(time=t0 + 52, host=hosts[0], attempt=0, reason="failure"))
        w.write(RunEnded(time=t0 + 99, host=hosts[0], run_id=f"w{writer}-r{k}", status="failed"))
    for rank, host in enumerate(hosts):
        with rd.writer(f"rank-{rank}") as w:
            w.write_all([StepCompleted(time=t0 + 2 + s, host=host, attempt=0, rank=rank, step=s,
                                       duration_seconds=1.0) for s in range(STEPS)])
    return rd.root


def _writer(db: str, runs: list[str], barrier: Any, out: Any) -> None:
    with FleetDB(db) as fleet:
        barrier.wait()
        for r in runs:
            fleet.index(r)
    out.put(time.monotonic())


def _one(db: str, runs: list[list[str]]) -> float:
    """Seconds from all writers ready to the last one done."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(runs) + 1)
    done = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(db, mine, barrier, done)) for mine in runs]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.monotonic()
    ends = [done.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a writer failed (exit {p.exitcode})")
    return max(ends) - start


def _read(db: str) -> tuple[float, int]:
    start = time.monotonic()
    with FleetDB(db) as fleet:
        scores = score_hosts(fleet.host_history())
    return time.monotonic() - start, len(scores)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--runs", type=int, default=6, help="runs per writer")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from tests.postgres_server import start_server

    server = start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            top = max(args.writers)
            all_runs = [[str(_write_run(root / "runs", w, k)) for k in range(args.runs)] for w in range(top)]
            figures: dict[int, dict[str, list[float]]] = {w: {"sqlite": [], "postgresql": [], "read_sqlite": [],
                                                              "read_postgresql": []} for w in args.writers}
            for rep in range(args.repeat):
                for w in args.writers:
                    for engine in ("sqlite", "postgresql"):
                        db = (str(root / f"{rep}-{w}.db") if engine == "sqlite"
                              else server.url(server.new_database()))
                        figures[w][engine].append(_one(db, all_runs[:w]))
                        figures[w][f"read_{engine}"].append(_read(db)[0])
        out: dict[str, Any] = {"runs_per_writer": args.runs, "events_per_run": 6 + HOSTS_PER_RUN * STEPS,
                               "repeat": args.repeat, "by_writers": {}}
        for w, f in figures.items():
            s, p = statistics.median(f["sqlite"]), statistics.median(f["postgresql"])
            out["by_writers"][str(w)] = {
                "sqlite_seconds": round(s, 3), "postgresql_seconds": round(p, 3),
                "sqlite_runs_per_second": round(w * args.runs / s, 1),
                "postgresql_runs_per_second": round(w * args.runs / p, 1),
                "postgresql_over_sqlite": round(p / s, 2),
                "read_sqlite_seconds": round(statistics.median(f["read_sqlite"]), 4),
                "read_postgresql_seconds": round(statistics.median(f["read_postgresql"]), 4),
            }
        print(json.dumps(out, indent=2))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
