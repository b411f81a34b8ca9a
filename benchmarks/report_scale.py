"""Benchmark: `trainguard report` on runs with many event files (one per rank), to see that it grows linearly,
and on runs whose one event file is large (up to 2 GB), to see that memory stays bounded.

Writes synthetic runs of N rank event files (five phased steps each, one attempt, one agent file) for each N
in ``--files``, times ``trainguard report RUN --json`` on each in a fresh interpreter, and prints one JSON object:
seconds and peak RSS per run, seconds per file, and the growth ratio between consecutive sizes next to the
size ratio (linear: the two match; the constant start-up cost makes the time ratio a little smaller).

With ``--single-mb``, also writes one run per size whose only event file holds that many MB (8 ranks on one
host, phased steps, under ``--tmp``; deleted afterwards), times ``report --json`` on it (seconds, peak RSS,
records per second) and times the dashboard's ``/api/runs`` with that run in its list.

    python benchmarks/report_scale.py --files 1000 2000 4000 8000
    python benchmarks/report_scale.py --files --single-mb 256 2048 --tmp /tmp
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.core.eventlog import EventWriter
from trainguard.core.events import AttemptEnded, AttemptStarted, RunEnded, RunStarted, StepCompleted
from trainguard.core.protocol import RunLayout

STEPS = 5
SINGLE_RANKS = 8
_STEP_LINE = ('{{"v":1,"type":"step_completed","time":{t!r},"host":"node0","attempt":0,"rank":{r},"step":{s},'
              '"duration_seconds":{d!r},"phases":{{"forward_backward":0.4,"comm_wait":{c!r}}},"loss":null,'
              '"numbering":"script","epoch":null}}\n')
"""One step record as `EventWriter` writes it (formatted directly: writing 2 GB record by record takes too long)."""


def write_run(root: Path, ranks: int) -> None:
    """A completed one-attempt run of ``ranks`` ranks on ``ranks // 8`` hosts, one event file per rank."""
    layout = RunLayout(root)
    layout.events_dir.mkdir(parents=True, exist_ok=True)
    t0 = 1_700_000_000.0
    agent = EventWriter(layout.agent_events("node0"))
    agent.write(RunStarted(time=t0, host="node0", run_id="scale", world_size=ranks, nnodes=max(1, ranks // 8),
                           target_steps=STEPS, config={}))
    agent.write(AttemptStarted(time=t0 + 1, host="node0", attempt=0, world_size=ranks, hosts=("node0",),
                               resume_step=None, recovery=""))
    for r in range(ranks):
        w = EventWriter(layout.event_file(f"rank-{r}"))
        for s in range(1, STEPS + 1):
            w.write(StepCompleted(time=t0 + 2 + s, host=f"node{r // 8}", attempt=0, rank=r, step=s,
                                  duration_seconds=1.0 + (r % 7) * 1e-3,
                                  phases={"forward_backward": 0.9, "comm_wait": 0.1}))
        w.close()
    agent.write(AttemptEnded(time=t0 + 3 + STEPS, host="node0", attempt=0, reason="completed", exit_code=0))
    agent.write(RunEnded(time=t0 + 4 + STEPS, host="node0", run_id="scale", status="completed",
                         completed_steps=STEPS))
    agent.close()


def write_single_file_run(root: Path, target_bytes: int) -> tuple[int, int]:
    """A completed one-attempt run of `SINGLE_RANKS` ranks whose one event file reaches ``target_bytes``;
    returns (records, bytes)."""
    layout = RunLayout(root)
    layout.events_dir.mkdir(parents=True, exist_ok=True)
    path = layout.agent_events("node0")
    t0 = 1_700_000_000.0
    w = EventWriter(path)
    w.write(RunStarted(time=t0, host="node0", run_id="single", world_size=SINGLE_RANKS, nnodes=1, target_steps=None,
                       config={}))
    w.write(AttemptStarted(time=t0 + 1, host="node0", attempt=0, world_size=SINGLE_RANKS, hosts=("node0",),
                           resume_step=None, recovery=""))
    w.close()
    written, step = path.stat().st_size, 0
    with path.open("a", encoding="ascii") as fh:
        while written < target_bytes:
            chunk = []
            for _ in range(1000):
                step += 1
                for r in range(SINGLE_RANKS):
                    lead = 1e-4 * ((step * 7 + r * 13) % 10)  # a little noise, no straggler
                    chunk.append(_STEP_LINE.format(t=t0 + 1 + step * 0.5, r=r, s=step, d=0.5 - lead,
                                                   c=round(0.1 - lead, 6)))
            text = "".join(chunk)
            fh.write(text)
            written += len(text)
    w = EventWriter(path)
    end = t0 + 2 + step * 0.5
    w.write(AttemptEnded(time=end, host="node0", attempt=0, reason="completed", exit_code=0))
    w.write(RunEnded(time=end + 1, host="node0", run_id="single", status="completed", completed_steps=step))
    w.close()
    return step * SINGLE_RANKS + 4, path.stat().st_size


def time_report(run: Path) -> tuple[float, int, dict[str, Any]]:
    """(wall seconds, peak RSS in KiB, the JSON) of ``trainguard report RUN --json`` in a fresh interpreter."""
    start = time.perf_counter()
    # /usr/bin/time would add a dependency; the child's own getrusage is exact and needs nothing.
    probe = ("import resource, runpy, sys; sys.argv = ['trainguard', 'report', sys.argv[1], '--json']\n"
             "try:\n    runpy.run_module('trainguard', run_name='__main__')\n"
             "finally:\n    print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"report failed on {run}: {done.stderr.strip()[-500:]}")
    rss = next(int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("MAXRSS"))
    return took, rss, json.loads(done.stdout)


def time_api_runs(parent: Path) -> dict[str, Any]:
    """Seconds of the dashboard's ``/api/runs`` (first call, then a repeat) with the runs under ``parent``."""
    from starlette.testclient import TestClient

    from trainguard.web.app import create_app
    from trainguard.web.catalog import Catalog

    client = TestClient(create_app(Catalog([parent]), token=None), base_url="http://127.0.0.1")
    out: dict[str, Any] = {}
    for name in ("first_seconds", "repeat_seconds"):
        start = time.perf_counter()
        answer = client.get("/api/runs")
        out[name] = round(time.perf_counter() - start, 3)
    out["status"] = answer.status_code
    out["rows"] = [{k: row.get(k) for k in ("id", "status", "ettr", "error") if k in row}
                   for row in answer.json().get("runs", [])]
    return out


def single_file_rows(sizes_mb: list[int], tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for mb in sorted(sizes_mb):
        parent = Path(tempfile.mkdtemp(prefix="report-scale-", dir=tmp))
        try:
            run = parent / f"single-{mb}mb"
            start = time.perf_counter()
            records, size = write_single_file_run(run, mb * 1_000_000)
            wrote = time.perf_counter() - start
            took, rss, report = time_report(run)
            folded = next((w for w in report["warnings"] if "folded" in w), "")
            rows.append({"event_file_bytes": size, "records": records, "write_seconds": round(wrote, 1),
                         "seconds": round(took, 2), "records_per_second": round(records / took),
                         "peak_rss_kib": rss, "ettr": report["ettr"], "completed_steps": report["completed_steps"],
                         "folded": folded, "api_runs": time_api_runs(parent)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(parent, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="*", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--single-mb", type=int, nargs="*", default=[],
                        help="sizes in MB of one-file runs to write and report (e.g. 256 2048)")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the one-file runs are written")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(args.files):
            run = Path(tmp) / f"run-{n}"
            write_run(run, n)
            took, rss, _ = time_report(run)
            rows.append({"files": n + 1, "records": n * STEPS + 4, "seconds": round(took, 2),
                         "ms_per_file": round(1000 * took / (n + 1), 3), "peak_rss_kib": rss})
    growth = [{"from": a["files"], "to": b["files"], "size_ratio": round(b["files"] / a["files"], 2),
               "time_ratio": round(b["seconds"] / a["seconds"], 2)} for a, b in itertools.pairwise(rows)]
    single = single_file_rows(args.single_mb, Path(args.tmp))
    # Linear in records: the time ratio follows the record ratio; bounded memory: the RSS ratio stays near 1.
    single_growth = [{"from_bytes": a["event_file_bytes"], "to_bytes": b["event_file_bytes"],
                      "records_ratio": round(b["records"] / a["records"], 2),
                      "time_ratio": round(b["seconds"] / a["seconds"], 2),
                      "peak_rss_ratio": round(b["peak_rss_kib"] / a["peak_rss_kib"], 2)}
                     for a, b in itertools.pairwise(single)]
    print(json.dumps({"benchmark": "report_scale", "runs": rows, "growth": growth, "single_file": single,
                      "single_file_growth": single_growth, "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
