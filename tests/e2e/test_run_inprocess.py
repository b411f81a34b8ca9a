"""In-process restart on real gloo jobs: ``trainguard run --in-process`` with the restartable GPT example.

A killed rank and a hung rank are each replaced by one new process while the other rank re-enters its
training function in the same interpreter; the job ends with the fault-free final loss. A replacement
that cannot start makes the agent fall back to restarting every worker, and the job still completes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.e2e._run_helpers import ROOT, TINY, events, of_type, process_gone, trainguard

pytestmark = pytest.mark.timeout(600)

SCRIPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt_inprocess.py"
BAD_REPLACEMENT = ROOT / "tests" / "e2e" / "userscripts" / "inprocess_bad_replacement.py"
AFTER_SPARE = ROOT / "tests" / "e2e" / "userscripts" / "inprocess_after_spare.py"
AUTOHOOKS = ROOT / "tests" / "e2e" / "userscripts" / "inprocess_autohooks.py"
TRAIN = ["--steps", "16", "--ckpt-every", "4", "--seed", "3", *TINY]


def _final_loss(output: str) -> float:
    found = re.findall(r"final loss ([0-9.]+)", output)
    assert found, output[-3000:]
    return float(found[-1])


def _run(run_dir: Path, *options: str, script: Path = SCRIPT,
         env: dict[str, str] | None = None) -> tuple[float, list[dict[str, object]]]:
    proc = trainguard("run", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--no-health-checks",
                      "--max-restarts", "2", "--hang-floor", "3", *options, "--", str(script), *TRAIN,
                      timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _final_loss(proc.stdout + proc.stderr), events(run_dir, "agent-")


@pytest.fixture(scope="module")
def fault_free_loss(tmp_path_factory: pytest.TempPathFactory) -> float:
    loss, agent = _run(tmp_path_factory.mktemp("clean") / "run", "--in-process")
    assert not of_type(agent, "failure_detected")
    return loss


def test_killed_rank_is_replaced_in_process_with_the_fault_free_loss(tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--inject", "crash@step=10,rank=1")
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    [failure] = of_type(agent, "failure_detected")
    assert failure["kind"] == "crash" and failure["ranks"] == [1]
    started = of_type(agent, "attempt_started")
    assert [a["recovery"] for a in started] == ["", "in-process"]
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "recovered" and recovery["ranks"] == [1] and recovery["attempt"] == 1
    # Rank 0 kept its process: its log says it re-entered, and it never started a second time.
    log0 = (run_dir / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert "rank 0 re-enters in attempt 1" in log0
    # Both ranks stepped in attempt 1, from the checkpoint on.
    steps = [e for e in events(run_dir, "rank-") if e["type"] == "step_completed" and e["attempt"] == 1]
    assert {e["rank"] for e in steps} == {0, 1}


def test_the_survivor_of_one_recovery_can_fail_and_be_replaced_in_the_next(
        tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--inject", "crash@step=6,rank=1;crash@step=12,rank=0")
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    recoveries = of_type(agent, "inprocess_recovery")
    assert [(r["attempt"], r["ranks"], r["status"]) for r in recoveries] == [(1, [1], "recovered"),
                                                                             (2, [0], "recovered")]
    assert [a["recovery"] for a in of_type(agent, "attempt_started")] == ["", "in-process", "in-process"]
    # Each survivor left the broken attempt's flight-recorder dump and stacks before it dropped its group.
    assert (run_dir / "diagnostics" / "attempt-0" / "fr_trace_rank_0.pkl").stat().st_size > 0
    assert (run_dir / "diagnostics" / "attempt-1" / "fr_trace_rank_1.pkl").stat().st_size > 0
    assert (run_dir / "diagnostics" / "attempt-1" / "stacks_rank_1.txt").stat().st_size > 0


def test_a_warm_spare_takes_the_killed_ranks_place(tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--no-fork-server", "--warm-spares", "1", "--inject",
                       "crash@step=10,rank=1", script=AFTER_SPARE)
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "recovered" and recovery["ranks"] == [1] and recovery["warm_spares_used"] == 1
    # The spare announced itself in its own log, then wrote rank 1's lines into rank 1's log file.
    [spare_log] = (run_dir / "logs" / "spares").glob("spare-*-0.log")  # spare-<node>-<n>.log
    assert "waiting" in spare_log.read_text()
    assert "rank 0 re-enters in attempt 1" in (run_dir / "logs" / "attempt-0" / "rank-0.log").read_text()
    # The in-process attempt's log paths lead to the files the ranks write.
    assert (run_dir / "logs" / "attempt-1" / "rank-1.log").resolve() == (
        run_dir / "logs" / "attempt-0" / "rank-1.log").resolve()
    # No spare outlives the run.
    spare_pids = [int(line.split()[2].rstrip(":")) for p in (run_dir / "logs" / "spares").glob("spare-*.log")
                  for line in p.read_text().splitlines() if line.startswith("warm spare ")]
    assert spare_pids and all(process_gone(pid) for pid in spare_pids)


def test_fresh_processes_replace_every_rank_from_warm_spares(tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--fresh-processes", "--no-fork-server", "--warm-spares", "2",
                       "--inject", "crash@step=10,rank=1", script=AFTER_SPARE, env={"TEST_SPARES_READY": "2"})
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "recovered" and recovery["ranks"] == [0, 1] and recovery["warm_spares_used"] == 2
    # Rank 0 did not re-enter: its process was replaced like rank 1's.
    assert "re-enters" not in (run_dir / "logs" / "attempt-0" / "rank-0.log").read_text()


def test_hung_rank_is_killed_and_replaced_in_process_with_the_fault_free_loss(
        tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--inject", "hang@step=10,rank=1")
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    [failure] = of_type(agent, "failure_detected")
    assert failure["kind"] == "hang" and failure["ranks"] == [1]
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "recovered" and recovery["failure_kind"] == "hang"
    assert [a["recovery"] for a in of_type(agent, "attempt_started")] == ["", "in-process"]
    assert "rank 0 re-enters in attempt 1" in (run_dir / "logs" / "attempt-0" / "rank-0.log").read_text()


def test_a_loop_without_attach_is_recovered_in_process_and_its_survivor_keeps_beating(tmp_path: Path) -> None:
    # The function never calls trainguard.attach(): only the automatic optimizer hooks see its steps. The
    # survivor re-enters it with torch.optim already imported; its steps must go on being counted in the new
    # attempt, and its SDC check must create its group beside the replacement's (once, a survivor without
    # either left the replacement waiting in new_group and itself silent: no hang rule but the 120 s
    # first-step allowance applied, then a fallback; 161 s in all).
    run_dir = tmp_path / "run"
    proc = trainguard("run", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--no-health-checks",
                      "--max-restarts", "2", "--in-process", "--inject", "crash@step=12,rank=1", "--",
                      str(AUTOHOOKS), "--ckpt-dir", str(tmp_path / "ckpt"), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "final loss" in proc.stdout + proc.stderr
    agent = events(run_dir, "agent-")
    assert [(f["kind"], f["ranks"]) for f in of_type(agent, "failure_detected")] == [("crash", [1])]
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "recovered" and recovery["ranks"] == [1] and recovery["attempt"] == 1
    assert [a["recovery"] for a in of_type(agent, "attempt_started")] == ["", "in-process"]
    assert "rank 0 re-enters in attempt 1" in (run_dir / "logs" / "attempt-0" / "rank-0.log").read_text()
    # The survivor's steps in attempt 1 were counted by the hooks, by AdamW's own (restored) step numbers.
    survivor = [e for e in events(run_dir, "rank-0") if e["type"] == "step_completed" and e["attempt"] == 1]
    assert survivor and survivor[0]["step"] == 11 and survivor[-1]["step"] == 40
    assert {e["numbering"] for e in survivor} == {"optimizer"}


def test_failed_in_process_restart_falls_back_to_restarting_every_worker(
        tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--inject", "crash@step=10,rank=1", script=BAD_REPLACEMENT)
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    assert (run_dir / "bad-replacement-fired").read_text() == "1"
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "fallback" and recovery["attempt"] == 1
    assert "failed during the recovery" in recovery["detail"]
    assert [a["recovery"] for a in of_type(agent, "attempt_started")] == ["", "in-process", "restart"]
    ended = of_type(agent, "attempt_ended")
    assert [e["reason"] for e in ended] == ["failure", "failure", "completed"]


def test_an_in_process_restart_that_takes_too_long_falls_back(tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--in-process", "--in-process-timeout", "3", "--inject", "crash@step=10,rank=1",
                       script=BAD_REPLACEMENT, env={"BAD_REPLACEMENT": "stall"})
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    [recovery] = of_type(agent, "inprocess_recovery")
    assert recovery["status"] == "fallback" and "0 of 2 ranks formed the process group within 3s" in recovery["detail"]
    assert recovery["seconds"] >= 3.0
    assert [a["recovery"] for a in of_type(agent, "attempt_started")] == ["", "in-process", "restart"]


def test_without_in_process_the_wrapped_script_restarts_as_a_whole(tmp_path: Path, fault_free_loss: float) -> None:
    run_dir = tmp_path / "run"
    loss, agent = _run(run_dir, "--inject", "crash@step=10,rank=1")
    assert loss == pytest.approx(fault_free_loss, abs=1e-6)
    assert [a["recovery"] for a in of_type(agent, "attempt_started")] == ["", "restart"]
    assert not of_type(agent, "inprocess_recovery")


def test_in_process_is_refused_with_several_nodes(tmp_path: Path) -> None:
    proc = trainguard("run", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--in-process",
                      "--run-dir", str(tmp_path / "run"), "--", sys.executable)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--in-process" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
