"""`trainguard run` on an unmodified DDP loop with long phases without collectives: neither is a hang.

One run of tests/e2e/userscripts/eval_and_export.py (gloo, a model DDP reduces in several buckets):

* after step 3 every rank evaluates for 8 s (twice the hang floor; no collective). On gloo the recorder counts
  the step's last gradient all-reduce done only once DDP frees its work, at the next backward: the ranks looked
  *waiting* in it, and the evaluation was a hang at the timeout;
* at the end rank 0 writes the weights through ``gzip`` (several seconds) while rank 1 waits in a barrier. The
  rank inside ``torch.save`` is writing, not stuck (phase ``save``): the export was a hang after 4 s.

The job must complete with no interruption and the export must load.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e._run_helpers import events, of_type, trainguard
from trainguard.launch.watchdog import WatchdogConfig

SCRIPT = Path(__file__).resolve().parent / "userscripts" / "eval_and_export.py"
EVAL_SECONDS = 2 * WatchdogConfig().floor_seconds

pytestmark = pytest.mark.timeout(480)


def test_an_evaluation_and_a_slow_rank_0_export_are_no_hang(tmp_path: Path) -> None:
    run_dir, export = tmp_path / "run", tmp_path / "model_final.pt.gz"
    cmd = [sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
           "1", "--run-dir", str(run_dir), "--no-health-checks", str(SCRIPT), "--steps", "6", "--eval-at", "3",
           "--eval-seconds", str(EVAL_SECONDS), "--export", str(export)]
    proc = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=450, check=False)
    console = proc.stdout + proc.stderr
    failures = [e.get("detail", "") for e in of_type(events(run_dir, "agent-"), "failure_detected")]
    assert proc.returncode == 0 and not failures, (failures, console[-4000:])
    assert len(re.findall(r"rank \d: evaluated \d+ batches", console)) == 2, console[-4000:]
    took = re.search(r"rank 0: exported in ([0-9.]+)s", console)
    assert took is not None and console.count(": done") == 2, console[-4000:]
    rep = trainguard("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    assert report["interruptions"] == [] and report["completed_steps"] == 6, report
    with gzip.open(export, "rb") as fh:
        weights = torch.load(fh, weights_only=True)
    assert len(weights) == 2 * (1 + 4 + 1)
    # What makes the export case: it outlasted what a rank merely busy is given (else it proves nothing).
    assert float(took.group(1)) > WatchdogConfig().busy_allowance_seconds, console[-2000:]
