"""Live healing (`trainguard.Replica`) on a real 3-rank gloo job under ``trainguard run --in-process``: after a
rank is killed the survivors go on from the step they finished (no rollback: the job has no checkpoint at all)
and the new rank takes their state from the lowest live rank; a second fault kills that source rank itself.
The job ends with the fault-free final loss."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e._run_helpers import ROOT, events, of_type, trainguard

pytestmark = pytest.mark.timeout(600)

SCRIPT = ROOT / "tests" / "e2e" / "userscripts" / "inprocess_heal.py"


def _run(run_dir: Path, *options: str) -> str:
    proc = trainguard("run", "--nproc-per-node", "3", "--run-dir", str(run_dir), "--no-health-checks",
                      "--max-restarts", "3", "--in-process", *options, "--", str(SCRIPT), "--steps", "20",
                      "--ckpt-dir", str(run_dir / "ck"), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _loss(output: str) -> float:
    found = re.findall(r"final loss ([0-9.]+)", output)
    assert found, output[-3000:]
    return float(found[-1])


@pytest.mark.slow
def test_survivors_keep_their_steps_and_new_ranks_heal_from_a_live_peer(tmp_path: Path) -> None:
    clean = _loss(_run(tmp_path / "clean"))
    run_dir = tmp_path / "faults"
    out = _run(run_dir, "--inject", "crash@step=7,rank=1;crash@step=12,rank=0")
    assert _loss(out) == pytest.approx(clean, abs=1e-9), out[-3000:]
    assert not (run_dir / "ck").exists()  # no checkpoint was ever written: nothing to roll back to
    # Attempt 1: rank 1 was killed in step 7; ranks 0 and 2 had finished step 6, rank 0 sent it.
    # Attempt 2: rank 0, the last source, was killed in step 12; rank 1 (healed in attempt 1) sent step 11.
    for attempt, step, source in ((1, 6, 0), (2, 11, 1)):
        said = set(re.findall(rf"rank (\d): attempt {attempt} healed to step {step} from rank {source} "
                              r"\(received (True|False)\)", out))
        assert said == {(str(r), str(r != source)) for r in range(3)}, out[-4000:]
    assert re.findall(r"attempt (\d+) restored step (\d+) from the checkpoint", out) == [("0", "0")] * 3
    # Every rank's steps in an attempt after a fault start right after the healed step: none was repeated.
    steps = of_type(events(run_dir, "rank-"), "step_completed")
    for attempt, first in ((1, 7), (2, 12)):
        by_rank: dict[int, list[int]] = {}
        for s in steps:
            if s["attempt"] == attempt:
                by_rank.setdefault(s["rank"], []).append(s["step"])
        assert sorted(by_rank) == [0, 1, 2] and {min(v) for v in by_rank.values()} == {first}, by_rank
    recoveries = of_type(events(run_dir, "agent-"), "inprocess_recovery")
    assert [(r["status"], r["ranks"]) for r in recoveries] == [("recovered", [1]), ("recovered", [0])]
