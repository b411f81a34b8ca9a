"""Brings a `trainguard run` job to a warm spare in one phase, SIGKILLs the agent and times the job's end.

Shared by tests/e2e/test_run_lifetimes.py and benchmarks/lifetime.py. Every process of the job (the agent,
its lifeline, workers, spares) is found by a marker variable in its environment (`MARKER`), which
`trainguard run` hands to everything it starts. Waits are on the job's own records (pid files, the spares'
logs, the agent's events), each bounded by a generous timeout, never on a guessed duration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e._run_helpers import ROOT, events, of_type, start_trainguard

SCRIPT = ROOT / "tests" / "e2e" / "userscripts" / "spare_phases.py"
MARKER = "TRAINGUARD_TEST_JOB"
PHASES = ("importing", "ready", "taking-over")
"""A spare still loading the script's imports; one waiting for a rank; spares that became the ranks."""


@dataclass
class Killed:
    """What one SIGKILL of the agent left behind."""

    phase: str
    seconds: float | None
    """SIGKILL of the agent -> the job's last process gone; None: some still ran at the bound."""
    before: int
    """Processes of the job alive just before the kill (agent included)."""
    left: list[int] = field(default_factory=list)
    """What still ran at the bound (ended by SIGKILL since)."""


def job_processes(marker: str) -> list[int]:
    """Live processes (not zombies) that carry ``MARKER=<marker>`` in their environment."""
    want = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def end_leftovers(marker: str) -> list[int]:
    """SIGKILL whatever of the job still runs (a failed check must not leave it for the next test)."""
    left = job_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return left


def _wait(what: str, check: object, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"the run ended while waiting for {what}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g}s: {log.read_text()[-3000:]}")
        time.sleep(0.1)


def spare_pids(run_dir: Path) -> set[int]:
    """Every spare that reached its ``waiting`` line (``warm spare <pid>: ... waiting``)."""
    return {int(line.split()[2].rstrip(":")) for p in (run_dir / "logs" / "spares").glob("spare-*.log")
            for line in p.read_text().splitlines() if line.startswith("warm spare ") and "waiting" in line}


def _pids(out: Path, prefix: str) -> list[int]:
    return [int(p.read_text()) for p in out.glob(f"{prefix}*") if p.read_text()]


def _bring_to(phase: str, proc: subprocess.Popen[bytes], out: Path, run_dir: Path, log: Path,
              timeout: float) -> list[int]:
    """Wait until the job holds a spare in ``phase``; returns the pids of those spares."""
    _wait("workers", lambda: len(_pids(out, "worker-0-")) == 2, proc, log, timeout)
    if phase == "importing":
        _wait("spare in the script's import", lambda: _pids(out, "importing-"), proc, log, timeout)
        return _pids(out, "importing-")
    _wait("two waiting spares", lambda: len(spare_pids(run_dir)) >= 2, proc, log, timeout)
    if phase == "ready":
        return sorted(spare_pids(run_dir))
    (out / "crash").touch()
    _wait("the restart's ranks", lambda: len(_pids(out, "worker-1-")) == 2, proc, log, timeout)
    ranks = _pids(out, "worker-1-")
    assert set(ranks) <= spare_pids(run_dir), "the restart's ranks were not the warm spares"
    started = of_type(events(run_dir, "agent-"), "attempt_started")
    assert [a["warm_starts"] for a in started] == [0, 2]
    return ranks


def kill_agent_in(phase: str, tmp: Path, bound: float = 30.0, timeout: float = 300.0) -> Killed:
    """Run the job until a spare is in ``phase``, SIGKILL `trainguard run`, and time until no process of the
    job runs (at most ``bound`` seconds; then what is left is SIGKILLed and reported)."""
    out, run_dir, log = tmp / "out", tmp / "run", tmp / "run.log"
    out.mkdir(parents=True)
    marker = str(tmp.resolve())
    env = {MARKER: marker, **({"SLOW_SPARE_IMPORT_OUT": str(out)} if phase == "importing" else {})}
    proc = start_trainguard(
        "run", "--standalone", "--nproc-per-node", "2", "--no-health-checks", "--max-restarts", "1",
        "--no-fork-server",  # the spare pool's phases (the fork server's ranks die with it: test_run_lifetimes)
        "--warm-spares", "1" if phase == "importing" else "2", "--run-dir", str(run_dir),
        str(SCRIPT), str(out), "crash-once" if phase == "taking-over" else "forever", log=log, env=env)
    try:
        spares = _bring_to(phase, proc, out, run_dir, log, timeout)
        before = job_processes(marker)
        assert proc.pid in before and set(spares) <= set(before), (before, spares)
        start = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        while job_processes(marker) and time.monotonic() - start < bound:
            time.sleep(0.01)
        left = job_processes(marker)
        return Killed(phase, None if left else time.monotonic() - start, len(before), left)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        end_leftovers(marker)
