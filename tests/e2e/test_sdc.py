"""Silent data corruption end to end: a flipped bit is found at the next check, the right rank is named,
training resumes from a clean checkpoint and ends with the fault-free loss (the demo); an unmodified DDP
script is checked by the automatic hooks; a bad ``--sdc-check-every`` is a usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY_DEMO, events, of_type, trainguard

PLAIN = Path(__file__).resolve().parent / "unmodified" / "plain_ddp.py"

pytestmark = pytest.mark.timeout(400)


def _demo(run_dir: Path, inject: str) -> tuple[dict, str]:
    res = trainguard("demo", "--ranks", "3", "--steps", "30", "--ckpt-every", "5", "--sdc-check-every", "10",
                     "--model", TINY_DEMO, "--run-dir", str(run_dir), "--inject", inject, "--json", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), res.stderr


def _losses(run_dir: Path) -> dict[tuple[int, int], float]:
    return {(s["attempt"], s["step"]): s["loss"] for s in of_type(events(run_dir, "rank-0"), "step_completed")}


@pytest.mark.slow
def test_demo_rolls_back_past_a_bit_flip_and_ends_with_the_fault_free_loss(tmp_path: Path) -> None:
    faulty, console = _demo(tmp_path / "faulty", "sdc@step=12,rank=1")
    clean, _ = _demo(tmp_path / "clean", "none")
    assert clean["interruptions"] == []
    assert faulty["status"] == "completed" and faulty["completed_steps"] == 30 and faulty["attempts"] == 2
    assert faulty["unfired_faults"] == []
    # Found at the next check (step 20, the flip landed after step 11's update), the right rank named.
    (sdc_i,) = faulty["interruptions"]
    assert sdc_i["kind"] == "sdc" and sdc_i["culprit_ranks"] == [1] and sdc_i["step"] == 20
    assert sdc_i["category"] == "Silent Data Corruption"
    # The corruption changed training (so the equality below is a real recovery, not a no-op) ...
    dirty, fresh = _losses(tmp_path / "faulty"), _losses(tmp_path / "clean")
    assert dirty[(0, 11)] == fresh[(0, 11)] and dirty[(0, 20)] != fresh[(0, 20)]
    # ... the checkpoints taken after the last clean check (10) were set aside, the restart resumed from 10 ...
    rejected = of_type(events(tmp_path / "faulty", "agent-"), "checkpoint_rejected")
    # (whether step 20's save was committed before the workers were stopped is a race, and rank 0 may be
    # stopped before it records a save the other ranks committed: every save rank 0 saw finish is set aside,
    # and nothing but 15 and 20)
    taken = sorted(e["step"] for e in of_type(events(tmp_path / "faulty", "rank-0"), "checkpoint_save_finished")
                   if e["attempt"] == 0 and e["step"] > 10)
    set_aside = sorted(r["step"] for r in rejected)
    assert 15 in taken and set(taken) <= set(set_aside) <= {15, 20}, (taken, set_aside)
    assert all("sdc" in r["reason"] for r in rejected)
    starts = {a["attempt"]: a["resume_step"] for a in of_type(events(tmp_path / "faulty", "agent-"),
                                                                 "attempt_started")}
    assert starts[1] == 10
    # ... and training ends exactly where the fault-free run ends.
    assert faulty["final_loss"] is not None and faulty["final_loss"] == clean["final_loss"]
    # One node holding every rank cannot be excluded: recorded, and said on the console.
    checks = [c for c in of_type(events(tmp_path / "faulty", "agent-"), "health_check") if c["name"] == "sdc"]
    assert len(checks) == 1 and not checks[0]["ok"] and "only node" in checks[0]["detail"]
    assert not of_type(events(tmp_path / "faulty", "agent-"), "node_excluded")
    assert "sdc detected in attempt 0 after step 20: rank 1" in console
    assert "rolling back to the checkpoint of step 10" in console


@pytest.mark.slow
def test_unmodified_ddp_script_flip_is_detected_with_the_culprit_and_a_rollback_warning(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = trainguard("run", "--standalone", "--nproc-per-node", "3", "--run-dir", str(run_dir), "--no-health-checks",
                     "--sdc-check-every", "10", "--inject", "sdc@step=12,rank=2", "--json",
                     str(PLAIN), "--steps", "30", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "5",
                     "--step-seconds", "0.01", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["status"] == "completed" and out["attempts"] == 2
    (failure,) = out["failures"]
    assert failure["kind"] == "sdc" and failure["ranks"] == [2] and failure["step"] == 20
    # The script's own torch.save checkpoint cannot be rolled back: the console says so.
    assert "WARNING: no trainguard checkpoint to roll back to" in failure["detail"]
    assert "WARNING: no trainguard checkpoint to roll back to" in res.stderr
    (diag,) = of_type(events(run_dir, "agent-"), "diagnosis")
    assert diag["culprit_ranks"] == [2] and diag["verdict"] == "sdc"
    marker = json.loads((run_dir / "sdc" / "detected-attempt-0.json").read_text())
    assert marker["last_clean_step"] == 10 and marker["source"] == "optimizer"


def test_bad_interval_is_a_usage_error_and_creates_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = trainguard("run", "--standalone", "--run-dir", str(run_dir), "--sdc-check-every", "-3", str(PLAIN))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].count("--sdc-check-every") == 1
    assert not run_dir.exists()
