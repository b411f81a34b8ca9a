"""Warm starts by default: an unmodified plain DDP script under `trainguard run` with no recovery flags.

By default every rank is forked from the node's fork server (one interpreter with torch and the script's imports
loaded), at the first start and at the restart after rank 1 dies. With ``--no-fork-server`` the agent fills its
pool of warm spares once the job trains and the restart hands every local rank to a spare. A script whose
top-level import reads its rank starts warm too, that import left for after the fork or the takeover (one probe
per job, said once); ``--warm-spares 0`` starts neither.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e._run_helpers import ROOT, events, json_result, of_type, process_gone, start_trainguard
from trainguard.core.protocol import SPARE_UNFIT

pytestmark = pytest.mark.timeout(600)

PLAIN = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"
RANK_AT_IMPORT = ROOT / "tests" / "e2e" / "userscripts" / "rank_at_import.py"


def _spare_logs(run_dir: Path) -> list[str]:
    return [p.read_text() for p in (run_dir / "logs" / "spares").glob("spare-*.log")]


def _waiting_spares(run_dir: Path) -> int:
    """Spares that wait and can take a rank warm (not those that found themselves unfit)."""
    return sum("waiting" in text and SPARE_UNFIT not in text for text in _spare_logs(run_dir))


def _server_log(run_dir: Path) -> str:
    path = run_dir / "logs" / "spares" / "fork-server.log"
    return path.read_text() if path.exists() else ""


def _serving(run_dir: Path) -> int:
    """Fork servers that loaded their imports and serve (`trainguard.worker.zygote`'s ``serving`` line)."""
    return _server_log(run_dir).count("; serving")


def _wait(what: str, check: object, proc: object, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        if proc.poll() is not None:  # type: ignore[attr-defined]
            raise AssertionError(f"the run ended while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _steps(step_log: Path) -> list[dict[str, int]]:
    return [json.loads(line) for p in step_log.parent.glob(step_log.name + ".*")
            for line in p.read_text().splitlines() if line.strip()]


def _crash_and_restart(tmp_path: Path, script: Path, *options: str, spares_expected: int, servers: int = 0) -> Path:
    """Run ``script`` on 2 ranks; once ``spares_expected`` spares wait (``servers`` fork servers serve), rank 1
    dies; once both ranks stepped after the restart, the job is told to stop. Returns the run folder."""
    run_dir, control = tmp_path / "run", tmp_path / "control"
    control.mkdir()
    step_log = tmp_path / "steps"
    out = tmp_path / "out.json"
    proc = start_trainguard(
        "run", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--no-health-checks", "--max-restarts", "1",
        "--json", *options, "--", str(script), "--steps", "100000", "--ckpt-dir", str(tmp_path / "ck"),
        "--ckpt-every", "5", "--step-seconds", "0.02", "--crash-rank", "1", "--crash-file", str(control / "crash"),
        "--stop-file", str(control / "stop"), "--step-log", str(step_log), log=out)
    try:
        _wait("the first steps", lambda: len(_steps(step_log)) >= 20, proc)
        if servers:
            _wait(f"{servers} serving fork servers", lambda: _serving(run_dir) >= servers, proc)
        elif spares_expected:
            _wait(f"{spares_expected} waiting spares", lambda: _waiting_spares(run_dir) >= spares_expected, proc)
        else:
            time.sleep(8)  # past the point where a pool would have been filled
        (control / "crash").touch()
        _wait("both ranks stepping after the restart",
              lambda: {s["rank"] for s in _steps(step_log) if s["restart"] == 1} == {0, 1}, proc)
        (control / "stop").touch()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.read_text()[-3000:]
    assert json_result(out)["status"] == "completed"
    return run_dir


def test_an_unmodified_script_starts_and_restarts_forked_from_the_fork_server_by_default(tmp_path: Path) -> None:
    # A monitor period of a minute: the crash is still seen at once, since the server's report of the exit wakes
    # the agent's round (before, detection waited for the next round: up to the whole period).
    run_dir = _crash_and_restart(tmp_path, PLAIN, "--monitor-interval", "60", spares_expected=0, servers=1)
    agent = events(run_dir, "agent-")
    [failure] = of_type(agent, "failure_detected")
    assert failure["kind"] == "crash" and failure["ranks"] == [1]
    assert failure["detection_latency_seconds"] < 5, failure
    assert failure["detail"] == "rank 1 killed by SIGKILL"  # the exit status came through the server's report
    started = of_type(agent, "attempt_started")
    assert [(a["recovery"], a["warm_starts"]) for a in started] == [("", 2), ("restart", 2)]
    assert _spare_logs(run_dir) == []  # the server serves: no spare interpreter was started
    for rank in (0, 1):
        assert "resumed from step" in (run_dir / "logs" / "attempt-1" / f"rank-{rank}.stdout.log").read_text()
        assert "warm start not possible" not in (run_dir / "logs" / "attempt-1" / f"rank-{rank}.log").read_text()
    # Nothing of the server outlives the run.
    [server_pid] = [int(line.split()[2].rstrip(":")) for line in _server_log(run_dir).splitlines()
                    if line.startswith("fork server ")]
    assert process_gone(server_pid)


def test_with_no_fork_server_an_unmodified_script_restarts_from_warm_spares(tmp_path: Path) -> None:
    run_dir = _crash_and_restart(tmp_path, PLAIN, "--no-fork-server", spares_expected=2)
    agent = events(run_dir, "agent-")
    started = of_type(agent, "attempt_started")
    assert [(a["recovery"], a["warm_starts"]) for a in started] == [("", 0), ("restart", 2)]
    # The spares became the ranks: their own logs end where each took a rank, and the ranks' logs of the
    # restart hold the script's lines (it resumed from its own checkpoint).
    for rank in (0, 1):
        assert "resumed from step" in (run_dir / "logs" / "attempt-1" / f"rank-{rank}.stdout.log").read_text()
    # No spare outlives the run (the two that took ranks ended as ranks; the refill's were stopped).
    spare_pids = [int(line.split()[2].rstrip(":")) for p in (run_dir / "logs" / "spares").glob("spare-*.log")
                  for line in p.read_text().splitlines() if line.startswith("warm spare ")]
    assert len(spare_pids) >= 2 and all(process_gone(pid) for pid in spare_pids)


@pytest.mark.parametrize("server", [True, False], ids=["fork-server", "spares"])
def test_a_script_that_reads_its_rank_at_import_restarts_warm_without_that_module(tmp_path: Path,
                                                                                 server: bool) -> None:
    # One probe per job: the first spare (the fork server's first loader) finds that loading `rank_config` ahead
    # reads RANK and says so; the agent starts spares that load torch and the rest ahead (the server forks another
    # loader from its torch-only state) and leave `rank_config` for the takeover (the fork). The server serves
    # from the first start on; the spares only from the restart.
    if server:
        run_dir = _crash_and_restart(tmp_path, RANK_AT_IMPORT, spares_expected=0, servers=1)
        unfit = [line for line in _server_log(run_dir).splitlines() if SPARE_UNFIT in line]
        said = "fork server: a module read RANK while loaded ahead: rank_config now load after the fork"
    else:
        run_dir = _crash_and_restart(tmp_path, RANK_AT_IMPORT, "--no-fork-server", spares_expected=2)
        unfit = [text for text in _spare_logs(run_dir) if SPARE_UNFIT in text]
        said = "warm spares: a module read RANK while loaded ahead: rank_config now load after"
    started = of_type(events(run_dir, "agent-"), "attempt_started")
    assert [(a["recovery"], a["warm_starts"]) for a in started] == [("", 2 if server else 0), ("restart", 2)]
    assert len(unfit) == 1 and "a module read RANK while loaded ahead; skip=rank_config" in unfit[0], unfit
    console = (tmp_path / "out.json").read_text()
    assert console.count(said) == 1
    for rank in (0, 1):
        assert "warm start not possible" not in (run_dir / "logs" / "attempt-1" / f"rank-{rank}.log").read_text()
        # The warm rank imported `rank_config` after taking its rank: it saw its own (the script exits 3 otherwise).
        assert f"rank_at_import: rank {rank} as imported" in \
            (run_dir / "logs" / "attempt-1" / f"rank-{rank}.stdout.log").read_text()


def test_warm_spares_0_restarts_cold(tmp_path: Path) -> None:
    run_dir = _crash_and_restart(tmp_path, PLAIN, "--warm-spares", "0", spares_expected=0)
    started = of_type(events(run_dir, "agent-"), "attempt_started")
    assert [(a["recovery"], a["warm_starts"]) for a in started] == [("", 0), ("restart", 0)]
    assert not (run_dir / "logs" / "spares").exists()


def test_a_pool_that_starts_with_the_job_is_ready_for_a_crash_at_the_second_step(tmp_path: Path) -> None:
    # The pool fills ahead of the workers (a count asked for always does; an automatic one where the node has an
    # idle CPU for every worker and spare, tests/unit/test_warm_spares.py). Before, it filled at the agent's
    # first look at the running workers, behind the worker's own imports. Ordered by events, not by the clock:
    # the spare exists when the worker's first step is logged, and the crash comes once the spare waits (on a
    # busy machine the spare's imports can outlast the worker's first steps; a fixed crash step then failed).
    run_dir, out, step_log, crash = tmp_path / "run", tmp_path / "out.json", tmp_path / "steps", tmp_path / "crash"
    proc = start_trainguard(
        "run", "--nproc-per-node", "1", "--run-dir", str(run_dir), "--max-restarts", "1", "--warm-spares", "1",
        "--no-fork-server",
        "--json", "--", str(PLAIN), "--steps", "100000", "--ckpt-dir", str(tmp_path / "ck"), "--ckpt-every", "5",
        "--step-seconds", "0.02", "--crash-rank", "0", "--crash-file", str(crash), "--step-log", str(step_log),
        "--stop-file", str(tmp_path / "stop"), log=out)
    try:
        _wait("the first step", lambda: len(_steps(step_log)) >= 1, proc)
        assert _spare_logs(run_dir), "no spare had started by the worker's first step"
        _wait("a waiting spare", lambda: _waiting_spares(run_dir) >= 1, proc)
        crash.touch()
        _wait("a step after the restart", lambda: any(s["restart"] == 1 for s in _steps(step_log)), proc)
        (tmp_path / "stop").touch()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.read_text()[-3000:]
    assert json_result(out)["status"] == "completed"
    started = of_type(events(run_dir, "agent-"), "attempt_started")
    assert [(a["recovery"], a["warm_starts"]) for a in started] == [("", 0), ("restart", 1)], out.read_text()[-3000:]
