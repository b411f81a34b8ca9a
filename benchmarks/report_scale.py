"""Benchmark: `trainguard report` on runs with many event files (one per rank), to see that it grows linearly.

Writes synthetic runs of N rank event files (five phased steps each, one attempt, one agent file) for each N
in ``--files``, times ``trainguard report RUN --json`` on each in a fresh interpreter, and prints one JSON object:
seconds and peak RSS per run, seconds per file, and the growth ratio between consecutive sizes next to the
size ratio (linear: the two match; the constant start-up cost makes the time ratio a little smaller).

    python benchmarks/report_scale.py --files 1000 2000 4000 8000
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard.core.eventlog import EventWriter
from trainguard.core.events import AttemptEnded, AttemptStarted, RunEnded, RunStarted, StepCompleted
from trainguard.core.protocol import RunLayout

STEPS = 5


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


def time_report(run: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of ``trainguard report RUN --json`` in a fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainguard", "report", str(run), "--json"],
                          capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"report failed on {run}: {done.stderr.strip()[-500:]}")
    return took, max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(args.files):
            run = Path(tmp) / f"run-{n}"
            write_run(run, n)
            took, rss = time_report(run)
            rows.append({"files": n + 1, "records": n * STEPS + 4, "seconds": round(took, 2),
                         "ms_per_file": round(1000 * took / (n + 1), 3), "peak_rss_kib": rss})
    growth = [{"from": a["files"], "to": b["files"], "size_ratio": round(b["files"] / a["files"], 2),
               "time_ratio": round(b["seconds"] / a["seconds"], 2)} for a, b in itertools.pairwise(rows)]
    print(json.dumps({"benchmark": "report_scale", "runs": rows, "growth": growth}, indent=2))


if __name__ == "__main__":
    main()
