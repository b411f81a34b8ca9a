"""`trainguard run` on training scripts that never heard of trainguard: plain DDP and PyTorch Lightning.

Each script is launched exactly as under torchrun (the word ``torchrun`` replaced by ``trainguard run``),
checkpoints itself, and resumes from its own checkpoint. Faults come from outside (``kill -9``,
``kill -STOP``) or from the chaos schedule fired by the automatic optimizer hooks. For each fault the
test checks what a user relies on: detected (a hang within max(floor, 3 x median step) + 5 s of the last
progress), the culprit rank named, flight-recorder dumps and stacks of the live ranks saved, the job
resumed from the script's checkpoint and finished, and ``trainguard report --json`` adds up.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._run_helpers import events, of_type, start_trainguard, trainguard, worker_pid
from trainguard.core.protocol import RunLayout, read_heartbeat

HERE = Path(__file__).resolve().parent / "unmodified"
PLAIN = HERE / "plain_ddp.py"
LIGHTNING = HERE / "lightning_ddp.py"
HANG_FLOOR = 3.0

pytestmark = pytest.mark.timeout(240)


SCRIPTS = [pytest.param(PLAIN, id="plain-ddp"), pytest.param(LIGHTNING, id="lightning")]


def _launch(tmp_path: Path, script: Path, *, steps: int, inject: str | None = None,
            extra: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> tuple[Any, Path, Path]:
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    args = ["run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "--run-dir", str(run_dir),
            "--hang-floor", str(HANG_FLOOR), "--no-health-checks", "--quiet", *options]
    if inject:
        args += ["--inject", inject]
    args += [str(script), "--steps", str(steps), "--ckpt-dir", str(ckpt), *extra]
    proc = start_trainguard(*args, log=tmp_path / "trainguard.log")
    return proc, run_dir, ckpt


def _wait(proc: Any, tmp_path: Path, timeout: float = 200) -> None:
    try:
        code = proc.wait(timeout=timeout)
    except Exception:
        proc.kill()
        raise
    out = (tmp_path / "trainguard.log").read_text(errors="replace")
    assert code == 0, f"trainguard run exited {code}:\n{out[-4000:]}"


def _wait_for_step(run_dir: Path, rank: int, step: int, timeout: float = 120) -> None:
    layout = RunLayout(run_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in layout.heartbeats_root.glob(f"*/attempt-0/rank-{rank}"):
            beat = read_heartbeat(path)
            if beat is not None and beat.steps_done >= step:
                return
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never reached step {step}")


def _report(run_dir: Path) -> dict[str, Any]:
    res = trainguard("report", str(run_dir), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def _check_report_adds_up(run_dir: Path, steps: int) -> dict[str, Any]:
    rep = _report(run_dir)
    assert rep["completed_steps"] == steps
    assert 0 < rep["ettr"] < 1
    total = rep["productive_seconds"] + sum(rep["badput_seconds"].values())
    assert total == pytest.approx(rep["wall_seconds"], rel=1e-6, abs=1e-6)
    assert rep["ettr"] == pytest.approx(rep["productive_seconds"] / rep["wall_seconds"], rel=1e-6)
    return rep


def _step_times(run_dir: Path) -> list[float]:
    return [r["duration_seconds"] for r in of_type(events(run_dir, "rank-"), "step_completed")]


def _check_failure(run_dir: Path, kind: str, rank: int) -> dict[str, Any]:
    agent = events(run_dir, "agent-")
    failures = of_type(agent, "failure_detected")
    assert [f["kind"] for f in failures] == [kind], failures
    failure = failures[0]
    assert failure["ranks"] == [rank], failure
    diag = of_type(agent, "diagnosis")
    assert diag and rank in diag[0]["culprit_ranks"], diag
    if kind == "hang":
        bound = max(HANG_FLOOR, 3 * statistics.median(_step_times(run_dir))) + 5
        assert failure["detection_latency_seconds"] <= bound, failure
    evidence = RunLayout(run_dir).diagnostics_dir(failure["attempt"])
    live = 1 - rank
    assert (evidence / f"fr_trace_rank_{live}.pkl").stat().st_size > 0
    assert "Thread" in (evidence / f"stacks_rank_{live}.txt").read_text()
    return failure


def _resumed(run_dir: Path, script: Path) -> bool:
    logs = RunLayout(run_dir).logs_dir(1)
    text = "".join(p.read_text(errors="replace") for p in logs.glob("rank-0*.log"))
    return ("resumed from step" in text) if script == PLAIN else ("Restoring states from the checkpoint" in text)


@pytest.mark.parametrize("script", SCRIPTS)
def test_healthy_run_is_never_killed(tmp_path: Path, script: Path) -> None:
    # Evaluation pauses without steps or collectives, several times longer than the hang timeout:
    # a healthy job that is computing, not waiting, must not be called hung.
    extra = ("--eval-every", "25", "--eval-seconds", "8") if script == PLAIN else ()
    proc, run_dir, _ = _launch(tmp_path, script, steps=60, extra=extra)
    _wait(proc, tmp_path)
    agent = events(run_dir, "agent-")
    assert of_type(agent, "failure_detected") == []
    assert len(of_type(agent, "attempt_started")) == 1
    rep = _check_report_adds_up(run_dir, 60)
    assert rep["attempts"] == 1


def test_a_rank_that_finished_first_is_not_a_frozen_rank(tmp_path: Path) -> None:
    # Rank 1 spends 12 s after training (no steps, no collectives, process group never destroyed, so no "done"
    # phase) while rank 0 has exited: rank 0's heartbeat
    # thread ended with its process, which once read as "stopped writing heartbeats" and restarted a finished job.
    proc, run_dir, _ = _launch(tmp_path, PLAIN, steps=20, extra=("--linger-rank", "1", "--linger-seconds", "12",
                                                                       "--no-destroy"))
    _wait(proc, tmp_path)
    agent = events(run_dir, "agent-")
    assert of_type(agent, "failure_detected") == []
    assert len(of_type(agent, "attempt_started")) == 1


def _finished_in_one_attempt(run_dir: Path, steps: int) -> str:
    """The job completed in one attempt with no failure recorded and its report adds up; returns rank 0's teardown
    evidence."""
    agent = events(run_dir, "agent-")
    assert of_type(agent, "failure_detected") == []
    assert len(of_type(agent, "attempt_started")) == 1
    assert [e["reason"] for e in of_type(agent, "attempt_ended")] == ["completed"]
    assert _check_report_adds_up(run_dir, steps)["attempts"] == 1
    return (RunLayout(run_dir).diagnostics_dir(0) / "teardown_rank_0.txt").read_text()


def test_a_rank_frozen_in_teardown_after_its_training_is_ended_and_counted_as_finished(tmp_path: Path) -> None:
    # torch's own teardown can deadlock holding the GIL (pytorch/pytorch#56297). In a CI run a rank printed its
    # last line, then froze in ~ProcessGroupGloo; 120 s later that was called a hang and the finished job
    # restarted and failed. Here rank 0 freezes the same way once it destroyed its group. With the default
    # allowance (120 s, for a rank writing its last files) it is found by using no CPU, not by the allowance.
    proc, run_dir, _ = _launch(tmp_path, PLAIN, steps=20, extra=("--freeze-rank", "0"))
    _wait(proc, tmp_path)
    evidence = _finished_in_one_attempt(run_dir, 20)
    assert "rank 0" in evidence and "finished its training" in evidence and "thread " in evidence, evidence
    assert "used no CPU for 1" in evidence, evidence  # 10 s and more: QUIET_SECONDS


def test_a_rank_that_crashes_in_its_teardown_after_its_training_is_counted_as_finished(tmp_path: Path) -> None:
    # At load, a Hugging Face rank of a CI run printed its last line and died by SIGABRT at exit ("terminate called
    # without an active exception": torch's C++ teardown, the script never destroyed its group); the finished job
    # restarted. Here rank 0 dies so after its interpreter finished, while rank 1 still lingers: rank 1 must not be
    # stopped, and nothing restarts.
    proc, run_dir, _ = _launch(tmp_path, PLAIN, steps=20,
                               extra=("--no-destroy", "--abort-at-exit-rank", "0", "--linger-rank", "1",
                                      "--linger-seconds", "3"))
    _wait(proc, tmp_path)
    evidence = _finished_in_one_attempt(run_dir, 20)
    assert "died by SIGABRT in its teardown" in evidence, evidence
    assert "rank 1: done" in RunLayout(run_dir).rank_stdout(0, 1).read_text()


@pytest.mark.parametrize("script", SCRIPTS)
def test_kill_9_of_a_rank(tmp_path: Path, script: Path) -> None:
    proc, run_dir, _ = _launch(tmp_path, script, steps=50)
    _wait_for_step(run_dir, 1, 15)
    os.kill(worker_pid(run_dir, 1, 0), signal.SIGKILL)
    _wait(proc, tmp_path)
    _check_failure(run_dir, "crash", 1)
    assert _resumed(run_dir, script)
    _check_report_adds_up(run_dir, 50)


@pytest.mark.parametrize("script", SCRIPTS)
def test_kill_stop_of_a_rank(tmp_path: Path, script: Path) -> None:
    proc, run_dir, _ = _launch(tmp_path, script, steps=50)
    _wait_for_step(run_dir, 1, 15)
    pid = worker_pid(run_dir, 1, 0)
    os.kill(pid, signal.SIGSTOP)
    _wait(proc, tmp_path)
    failure = _check_failure(run_dir, "hang", 1)
    assert "stopped" in failure["detail"], failure
    assert "[1] waiting" not in failure["detail"], failure  # the stopped rank waits for nothing: it is stopped
    # One story: diagnose on the saved evidence says what the agent said.
    found = trainguard("diagnose", str(RunLayout(run_dir).diagnostics_dir(failure["attempt"])), "--json")
    verdict = json.loads(found.stdout)
    assert (verdict["verdict"], verdict["culprit_ranks"]) == ("hang", [1]), verdict
    diag = of_type(events(run_dir, "agent-"), "diagnosis")[0]
    assert "localization said" not in diag.get("explanation", ""), diag
    assert _resumed(run_dir, script)
    _check_report_adds_up(run_dir, 50)


@pytest.mark.parametrize("script", SCRIPTS)
def test_chaos_crash_then_hang(tmp_path: Path, script: Path) -> None:
    proc, run_dir, _ = _launch(tmp_path, script, steps=50, inject="crash@step=15,rank=1;hang@step=35,rank=0")
    _wait(proc, tmp_path)
    agent = events(run_dir, "agent-")
    failures = of_type(agent, "failure_detected")
    assert [(f["kind"], f["ranks"]) for f in failures] == [("crash", [1]), ("hang", [0])], failures
    injected = of_type(events(run_dir, "rank-"), "fault_injected")
    assert sorted(f["kind"] for f in injected) == ["crash", "hang"]
    hang = failures[1]
    bound = max(HANG_FLOOR, 3 * statistics.median(_step_times(run_dir))) + 5
    assert hang["detection_latency_seconds"] <= bound
    evidence = RunLayout(run_dir).diagnostics_dir(hang["attempt"])
    assert (evidence / "fr_trace_rank_1.pkl").exists() and (evidence / "stacks_rank_0.txt").exists()
    rep = _check_report_adds_up(run_dir, 50)
    assert rep["attempts"] == 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
